"""Is a host fit to run a server: the preflight (python, engine, file transfer, nvidia-smi, model path, GPU
count) and the GPUs' state (memory, compute processes, busy or free)."""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field

from runners.checkpoint import CheckpointFacts
from runners.errors import EngineMissing, HostBusy, HostMisconfigured, HostUnreachable
from runners.host.shell import Shell
from runners.printable import printable
from runners.smi import (
    APPS_QUERY,
    GPU_QUERY,
    MAX_BYTES,
    ComputeApp,
    GpuStatus,
    SmiOutputError,
    capped,
    cut_short,
    parse_apps,
    parse_gpus,
)

_SPLIT = "--servetune-apps--"


@dataclass
class HostInfo:
    """What the preflight found on a host."""

    name: str
    python: str
    engine: str
    engine_version: str
    gpus: list[GpuStatus] = field(default_factory=list)
    apps: list[ComputeApp] = field(default_factory=list)
    busy: bool = False
    reason: str = ""
    nccl_version: str | None = None
    """The NCCL the engine's torch loads (None: not known, e.g. a CPU build)."""
    checkpoint: CheckpointFacts | None = None
    """The model's weights' size and config.json figures on this host (None: not read)."""

    @property
    def gpu_name(self) -> str:
        return self.gpus[0].name if self.gpus else "unknown"

    @property
    def free_mib(self) -> float:
        return sum(g.free_mib or 0.0 for g in self.gpus)


def _stderr(text: str) -> str:
    return printable(text.strip()[:200], newlines=False)


def _failed(shell: Shell, rc: int, stdout: str, stderr: str) -> HostUnreachable | HostMisconfigured:
    """The error of an nvidia-smi query that exited ``rc``: cut short by the cap (it printed far too much), a
    fault waiting will not fix; otherwise trouble worth retrying, as before."""
    if cut_short(stdout):
        return _garbled(shell, SmiOutputError(f"nvidia-smi printed more than {MAX_BYTES // 1024} KiB"))
    return HostUnreachable(f"nvidia-smi failed on {shell.name} (rc={rc}): {_stderr(stderr)}", host=shell.name)


def _garbled(shell: Shell, exc: SmiOutputError) -> HostMisconfigured:
    return HostMisconfigured(
        f"{shell.name}: {exc}; a GPU may have fallen off the bus or the driver is broken; fix: run nvidia-smi "
        "on the host and repair it (often a reboot)", host=shell.name, fault="nvidia_smi_output")


def gpus(shell: Shell, *, timeout: float = 20.0) -> list[GpuStatus]:
    res = shell.run(capped(GPU_QUERY), timeout=timeout)
    if not res.ok:
        raise _failed(shell, res.rc, res.stdout, res.stderr)
    try:
        return parse_gpus(res.stdout)
    except SmiOutputError as exc:
        raise _garbled(shell, exc) from None


def compute_apps(shell: Shell, *, timeout: float = 20.0) -> list[ComputeApp]:
    res = shell.run(capped(APPS_QUERY), timeout=timeout)
    if not res.ok:
        raise _failed(shell, res.rc, res.stdout, res.stderr)
    try:
        return parse_apps(res.stdout)
    except SmiOutputError as exc:
        raise _garbled(shell, exc) from None


def gpu_state(shell: Shell, *, timeout: float = 20.0) -> tuple[list[GpuStatus], list[ComputeApp]]:
    """GPUs and compute processes in one round trip. nvidia-smi exiting 0 with lines that are not its CSV
    (a GPU that fell off the bus), or printing far too much, is :class:`HostMisconfigured`
    (``nvidia_smi_output``): one line, and the host is dropped."""
    res = shell.run(f"{capped(GPU_QUERY)} && echo {_SPLIT} && {capped(APPS_QUERY)}", timeout=timeout)
    found, split, apps = res.stdout.partition(_SPLIT)
    if not res.ok or not split:
        raise _failed(shell, res.rc, found if not split else apps, res.stderr)
    try:
        return parse_gpus(found), parse_apps(apps)
    except SmiOutputError as exc:
        raise _garbled(shell, exc) from None


def judge_busy(info: HostInfo, busy_mib: float) -> None:
    """Mark ``info`` busy when foreign compute processes, or more than ``busy_mib`` used on a GPU, are there."""
    if info.apps:
        pids = ", ".join(str(a.pid) for a in info.apps)
        info.busy, info.reason = True, f"compute processes on the GPUs (pid {pids})"
        return
    heavy = [g for g in info.gpus if (g.used_mib or 0) > busy_mib]
    if heavy:
        info.busy = True
        info.reason = "GPU memory in use with no servetune server: " + ", ".join(
            f"GPU {g.index} {g.used_mib:.0f} MiB" for g in heavy
        )


def wait_gpus_free(shell: Shell, busy_mib: float, *, timeout: float = 30.0,
                   interval: float = 0.25) -> list[GpuStatus]:
    """Wait until no compute process is left and used memory is back near its baseline (``busy_mib``)."""
    deadline = time.monotonic() + timeout
    while True:
        found, apps = gpu_state(shell)
        if not apps and all((g.used_mib or 0) <= busy_mib for g in found):
            return found
        if time.monotonic() > deadline:
            pids = ", ".join(str(a.pid) for a in apps) or "none"
            raise HostBusy(f"GPU memory on {shell.name} did not return to baseline within {timeout:g}s "
                           f"(compute pids: {pids})", host=shell.name)
        time.sleep(interval)


def check_put(shell: Shell, *, timeout: float = 30.0) -> None:
    """Write a small file into the runs root as every launch does: a transport that cannot (an sshd without
    SFTP) raises HostMisconfigured from the transport; a runs root that cannot be made, too."""
    root = shell.shell_path(shell.runs_root)
    mk = shell.run(f"mkdir -p {root}/.servetune && cd {root}/.servetune && pwd", timeout=timeout)
    if not mk.ok:
        raise HostMisconfigured(
            f"{shell.name}: cannot create the runs root {shell.runs_root} ({mk.stderr.strip()[:160]}); fix: make "
            "it writable or set runs_root", host=shell.name, fault="runs_root")
    shell.put(f"{mk.stdout.strip()}/put-check", b"servetune\n")


def preflight(shell: Shell, engine: str, python: str, version_command: str, *, busy_mib: float,
              timeout: float = 60.0, gpus_wanted: bool = True, model_path: str | None = None,
              gpus_needed: int = 0) -> HostInfo:
    """Check python, engine and version, file transfer, nvidia-smi, the model path, the GPU count, and that
    the GPUs are free of foreign processes (see :meth:`runners.host.Host.preflight`)."""
    found_py = _python_version(shell, python, timeout)
    if _version_tuple(found_py) < (3, 8):
        raise EngineMissing(f"{shell.name}: python {python!r} is {found_py or 'unknown'}, servetune needs 3.8 "
                            "or newer on the host; fix: point the host's python at a newer one",
                            host=shell.name, fault="python_version")
    ver = shell.run(version_command, timeout=timeout)
    if not ver.ok or not ver.stdout.strip():
        raise EngineMissing(
            f"{shell.name}: engine {engine!r} not found with {python} "
            f"({(ver.stderr.strip().splitlines() or ['no output'])[-1][:160]}); fix: install it in that "
            "python or set the host's python in the inventory",
            host=shell.name,
        )
    check_put(shell, timeout=timeout)
    if gpus_wanted and not shell.run("command -v nvidia-smi", timeout=timeout).ok:
        raise HostMisconfigured(
            f"{shell.name}: nvidia-smi is not on PATH; fix: install the NVIDIA driver's utilities or add their "
            "directory to the host's PATH (inventory env)", host=shell.name, fault="no_nvidia_smi")
    if model_path and model_path.startswith(("/", "~")) and not shell.run(
            f"test -e {shell.shell_path(model_path)}", timeout=timeout).ok:
        raise HostMisconfigured(
            f"{shell.name}: model path {model_path} does not exist; fix: copy the model there or correct "
            "model_path", host=shell.name, fault="model_missing")
    found, apps = gpu_state(shell, timeout=timeout) if gpus_wanted else ([], [])
    if gpus_wanted and gpus_needed > len(found):
        raise HostMisconfigured(
            f"{shell.name}: {len(found)} GPU(s), the space needs {gpus_needed} (tensor parallel size); fix: use a "
            "host with enough GPUs or lower the TP size", host=shell.name, fault="too_few_gpus")
    info = HostInfo(shell.name, python, engine, ver.stdout.strip().splitlines()[-1].strip(), found, apps)
    judge_busy(info, busy_mib)
    return info


def _python_version(shell: Shell, python: str, timeout: float) -> str:
    """The version ``python`` reports on the host; EngineMissing when it does not run."""
    res = shell.run(f"{shlex.quote(python)} -c 'import sys; print(sys.version.split()[0])'", timeout=timeout)
    if not res.ok:
        raise EngineMissing(f"{shell.name}: python {python!r} is not usable "
                            f"({(res.stderr.strip().splitlines() or ['no output'])[-1][:160]}); fix: install "
                            "it there or set the host's python in the inventory",
                            host=shell.name, fault="python_missing")
    return res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def foreign_apps(shell: Shell, pgid: int, *, timeout: float = 20.0) -> list[ComputeApp]:
    """The compute processes on the host's GPUs that are not in process group (or session) ``pgid``: another
    program's, never a rank of that server, even one that is exiting."""
    apps = compute_apps(shell, timeout=timeout)
    if not apps:
        return []
    res = shell.run_script("foreign_pids.sh", int(pgid), *(int(a.pid) for a in apps), timeout=timeout)
    foreign = {int(p) for p in res.stdout.split() if p.isdigit()}
    return [a for a in apps if a.pid in foreign]

