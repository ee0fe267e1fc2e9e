"""The evidence a run's memory cgroup keeps (``scripts/run.sh`` makes one when a memory limit is asked), so a
kernel OOM kill is told from a crash, and its removal once the server's group is gone."""

from __future__ import annotations

from runners.errors import RunnerError
from runners.host.runs import RunRef
from runners.host.shell import Shell


def oom_evidence(shell: Shell, ref: RunRef) -> dict[str, int | str]:
    """What the run's memory cgroup saw: ``oom_kill`` (kernel OOM kills inside it), ``memory_limit_bytes``,
    ``memory_peak_bytes``, ``limit_hits``, ``cgroup`` and ``cgroup_version``. Empty without a cgroup.

    Readable after :func:`remove_cgroup` too (it keeps a copy in the run directory).
    """
    res = shell.run_script("cgroup_evidence.sh", ref.run_dir, timeout=15)
    out: dict[str, int | str] = {}
    for line in res.stdout.splitlines():
        key, _, value = line.strip().partition(" ")
        if key and value:
            out[key] = int(value) if value.isdigit() else value
    return out


def remove_cgroup(shell: Shell, ref: RunRef, *, timeout: float = 10.0) -> None:
    """Keep the run's cgroup evidence in its run directory, then remove the cgroup (once the group is gone).
    No-op for a run without a memory limit. RunnerError if the cgroup stays busy."""
    res = shell.run_script("remove_cgroup.sh", ref.run_dir, int(timeout * 10), timeout=timeout + 15)
    if not res.ok:
        raise RunnerError(f"cannot remove the memory cgroup on {shell.name}: {res.stdout.strip()[:200]}",
                          host=shell.name)
