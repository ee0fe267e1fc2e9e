"""A server's life on a host: start it detached in a run directory, follow its log, learn its exit code, stop
its process group and verify nothing is left, then clear its scratch directories.

A run directory (``<runs_root>/<study>/<trial>/``) holds the launch script, the wrapper (``scripts/run.sh``),
the server log, the process-group id and the exit code, so an SSH hiccup does not kill the server. Nothing
here ever kills by name: a stop signals the recorded group, and only after checking the group is ours
(``SERVETUNE_RUN_ID`` in a member's environment).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from runners.errors import NotOurProcess, RunnerError
from runners.host.shell import Shell, plain_name
from runners.host.shipped import text as script_text
from runners.transport import LineStream

RUN_ID_VAR = "SERVETUNE_RUN_ID"
"""The variable that tags a server's process tree with its run id (set by ``scripts/start.sh``)."""


@dataclass(frozen=True)
class RunRef:
    """A server started by servetune: its run directory on the host, process group and run id."""

    run_dir: str
    pgid: int
    run_id: str

    @property
    def log_path(self) -> str:
        return f"{self.run_dir}/server.log"


@dataclass(frozen=True)
class Resources:
    """What one server asks of a host: its nodes and GPUs per node. A plain host gives a server the host itself
    (one node, the GPUs the launch names); a cluster's scheduler allocates exactly this."""

    nodes: int = 1
    gpus_per_node: int = 0


@dataclass(frozen=True)
class StopResult:
    """How a stop went: ``gone`` (already dead), ``term`` or ``kill``; survivors must be empty.

    ``resent_term``: the group outlived half the grace, so SIGTERM was sent a second time.
    """

    method: str
    seconds: float
    survivors: tuple[int, ...] = ()
    resent_term: bool = False


def run_dir(runs_root: str, study: str, trial: str) -> str:
    return f"{runs_root}/{plain_name(study)}/{plain_name(trial)}"


def prepare(shell: Shell, directory: str, launch_script: str, run_id: str, *, controller: str,
            files: Mapping[str, str] | None = None, scratch_vars: tuple[str, ...] = ("TMPDIR",),
            timeout: float = 30.0) -> str:
    """Create ``directory`` fresh and write a run's files into it (the launch script, ``run.sh``, the ``owner``
    file, the scratch variables and ``files``); its absolute path."""
    # One round trip: the absolute form of the directory (as resolve() gives it), then a fresh one there.
    mk = shell.run(f'd={shell.shell_path(directory)}; echo "$d"; rm -rf "$d" && mkdir -p "$d"', timeout=timeout)
    abs_dir = mk.stdout.strip()
    if not mk.ok:
        raise RunnerError(f"cannot create {abs_dir} on {shell.name}: {mk.stderr.strip()[:200]}", host=shell.name)
    shell.put(f"{abs_dir}/launch.sh", launch_script.encode(), mode=0o755)
    shell.put(f"{abs_dir}/run.sh", script_text("run.sh").encode(), mode=0o755)
    shell.put(f"{abs_dir}/owner", f"{shell.name}\n{run_id}\n{controller}\n".encode())
    shell.put(f"{abs_dir}/scratch_vars", "".join(f"{v}\n" for v in scratch_vars).encode())
    for name, text in (files or {}).items():
        shell.put(f"{abs_dir}/{name}", text.encode(), mode=0o644)
    return abs_dir


def start(shell: Shell, directory: str, launch_script: str, run_id: str, *, controller: str,
          files: Mapping[str, str] | None = None, scratch_vars: tuple[str, ...] = ("TMPDIR",),
          memory_limit_bytes: int | None = None, timeout: float = 30.0) -> RunRef:
    """Start ``launch_script`` detached in ``directory`` (created fresh) and return its reference; the
    ``owner`` file names the host, the run and ``controller`` (see :mod:`runners.host.orphans`)."""
    abs_dir = prepare(shell, directory, launch_script, run_id, controller=controller, files=files,
                      scratch_vars=scratch_vars, timeout=timeout)
    if memory_limit_bytes is not None:
        shell.put(f"{abs_dir}/memory_limit", f"{int(memory_limit_bytes)} {plain_name(run_id)}\n".encode())
    res = shell.run_script("start.sh", abs_dir, run_id, timeout=timeout)
    if res.stdout.startswith("CGROUP_ERROR "):
        raise RunnerError(f"{shell.name}: {res.stdout.removeprefix('CGROUP_ERROR ').strip()}", host=shell.name)
    try:
        pgid = int(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RunnerError(f"server did not start on {shell.name}: {res.stderr.strip()[:200]}",
                          host=shell.name) from None
    return RunRef(abs_dir, pgid, run_id)


def follow(shell: Shell, ref: RunRef) -> LineStream:
    """Stream the server log from its start; the stream ends once the server has exited."""
    return shell.stream_script("follow.sh", ref.run_dir, ref.pgid)


def exit_code(shell: Shell, ref: RunRef) -> int | None:
    res = shell.run(f"cat {shlex.quote(ref.run_dir)}/exit_code 2>/dev/null", timeout=15)
    text = res.stdout.strip()
    return int(text) if text.lstrip("-").isdigit() else None


def members(shell: Shell, ref: RunRef) -> list[int]:
    res = shell.run_script("members.sh", ref.pgid, timeout=15)
    return [int(p) for p in res.stdout.split() if p.isdigit()]


def stop(shell: Shell, ref: RunRef, *, grace: float = 10.0) -> StopResult:
    """TERM the group, TERM again at half the grace, KILL at the end; verify no member is left."""
    if ref.pgid <= 1:
        raise RunnerError(f"process group {ref.pgid} on {shell.name} is no server of servetune's; not signalling it",
                          host=shell.name)
    res = shell.run_script("stop.sh", ref.pgid, ref.run_id, int(grace * 1000), ref.run_dir, timeout=grace + 30)
    try:
        data = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RunnerError(f"stop failed on {shell.name}: {res.stderr.strip()[:200]}", host=shell.name) from None
    if data["result"] == "not_ours":
        raise NotOurProcess(f"process group {ref.pgid} on {shell.name} is not servetune run {ref.run_id}; "
                            "not signalling it", host=shell.name)
    survivors = tuple(int(p) for p in data.get("survivors", []))
    if survivors:
        raise RunnerError(f"processes {survivors} survived SIGKILL on {shell.name}", host=shell.name)
    return StopResult(data.get("method", "gone"), float(data.get("ms", 0)) / 1000, survivors,
                      resent_term=bool(data.get("resent_term", False)))


def remove_scratch(shell: Shell, ref: RunRef) -> None:
    """Delete the run's scratch directories (call only once its process group is gone)."""
    shell.run_script("remove_scratch.sh", ref.run_dir, timeout=60)


def read(shell: Shell, path: str, *, tail_bytes: int | None = None) -> str:
    cmd = f"tail -c {int(tail_bytes)} {shlex.quote(path)}" if tail_bytes else f"cat {shlex.quote(path)}"
    return shell.run(cmd + " 2>/dev/null", timeout=60).stdout
