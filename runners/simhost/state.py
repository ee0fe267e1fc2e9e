"""The simulated host's shared state: which processes hold how much memory on which GPU.

Layout of the state directory (``$SERVETUNE_SIM_STATE``, default ``~/.servetune/simhost``)::

    host.json            {"gpu_name", "gpu_count", "memory_total_mib", "baseline_used_mib",
                          "driver_version", "interconnect", "uuids": [...], "profile"}
    procs/<pid>.json     {"pid", "start_time", "pgid", "name", "kind", "gpus": [indices],
                          "used_mib": {"<index>": MiB}, "util": {"<index>": percent}}

A process entry counts only while its pid is alive, is not a zombie, and still has the start time it
was written with (so a reused pid is not mistaken for it). Memory is therefore released the moment a
process dies, however it dies; stale files are removed by whoever reads them.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # nvidia-smi reads state without importing pydantic: it runs on every sample
    from runners.simhost.profile import HostSpec, PowerSpec

__all__ = [
    "HostState",
    "ProcEntry",
    "default_state_dir",
    "live_procs",
    "process_start_time",
    "read_host",
    "remove_proc",
    "write_host",
    "write_proc",
]

ENV_STATE = "SERVETUNE_SIM_STATE"


def default_state_dir(env: dict[str, str] | None = None, *, explicit: str | None = None) -> Path:
    """``explicit`` if given, else ``$SERVETUNE_SIM_STATE``, else ``~/.servetune/simhost``."""
    if explicit:
        return Path(explicit).expanduser()
    env = dict(os.environ) if env is None else env
    value = env.get(ENV_STATE)
    return Path(value).expanduser() if value else Path.home() / ".servetune" / "simhost"


def _atomic_write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


@dataclass(frozen=True)
class HostState:
    gpu_name: str
    gpu_count: int
    memory_total_mib: int
    baseline_used_mib: int
    driver_version: str
    interconnect: str
    uuids: tuple[str, ...]
    profile: str = ""
    idle_w: float = 60.0
    max_w: float = 560.0

    @classmethod
    def from_spec(cls, spec: HostSpec, profile: str = "", state_dir: Path | None = None,
                  power: PowerSpec | None = None) -> HostState:
        """The host of ``spec``. Its GPUs' UUIDs follow the state directory: two simulated hosts (two state
        directories) are two sets of GPUs, as two machines are, and servetune keeps their claims apart."""
        where = f"{state_dir.expanduser().resolve()}/" if state_dir is not None else ""
        uuids = tuple(
            f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'servetune-sim/{where}{spec.gpu_name}/{i}')}"
            for i in range(spec.gpu_count)
        )
        return cls(
            gpu_name=spec.gpu_name,
            gpu_count=spec.gpu_count,
            memory_total_mib=spec.memory_total_mib,
            baseline_used_mib=spec.smi_baseline_used_mib,
            driver_version=spec.driver_version,
            interconnect=spec.interconnect,
            uuids=uuids,
            profile=profile,
            idle_w=power.idle_w if power is not None else 60.0,
            max_w=power.max_w if power is not None else 560.0,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "gpu_name": self.gpu_name,
            "gpu_count": self.gpu_count,
            "memory_total_mib": self.memory_total_mib,
            "baseline_used_mib": self.baseline_used_mib,
            "driver_version": self.driver_version,
            "interconnect": self.interconnect,
            "uuids": list(self.uuids),
            "profile": self.profile,
            "idle_w": self.idle_w,
            "max_w": self.max_w,
        }


def write_host(state_dir: Path, host: HostState) -> None:
    """Write ``host.json`` unless it already says the same."""
    path = state_dir / "host.json"
    data = host.to_json()
    with contextlib.suppress(OSError, ValueError):
        if json.loads(path.read_text(encoding="utf-8")) == data:
            return
    _atomic_write(path, data)


def read_host(state_dir: Path) -> HostState | None:
    try:
        d = json.loads((state_dir / "host.json").read_text(encoding="utf-8"))
        return HostState(
            gpu_name=d["gpu_name"],
            gpu_count=int(d["gpu_count"]),
            memory_total_mib=int(d["memory_total_mib"]),
            baseline_used_mib=int(d.get("baseline_used_mib", 0)),
            driver_version=str(d.get("driver_version", "")),
            interconnect=str(d.get("interconnect", "")),
            uuids=tuple(d["uuids"]),
            profile=str(d.get("profile", "")),
            idle_w=float(d.get("idle_w", 60.0)),
            max_w=float(d.get("max_w", 560.0)),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def process_start_time(pid: int) -> int | None:
    """Start time (clock ticks since boot) of a live, non-zombie process; None otherwise."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    # comm may hold spaces and parentheses: the fields after it start after the last ')'.
    fields = raw[raw.rfind(")") + 2 :].split()
    if not fields or fields[0] in ("Z", "X", "x"):
        return None
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


@dataclass
class ProcEntry:
    pid: int
    start_time: int | None
    name: str
    kind: str
    gpus: list[int]
    used_mib: dict[int, int]
    util: dict[int, int] = field(default_factory=dict)
    pgid: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "start_time": self.start_time,
            "name": self.name,
            "kind": self.kind,
            "gpus": self.gpus,
            "used_mib": {str(k): v for k, v in self.used_mib.items()},
            "util": {str(k): v for k, v in self.util.items()},
            "pgid": self.pgid,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ProcEntry:
        return cls(
            pid=int(d["pid"]),
            start_time=d.get("start_time"),
            name=str(d.get("name", "python")),
            kind=str(d.get("kind", "")),
            gpus=[int(g) for g in d.get("gpus", [])],
            used_mib={int(k): int(v) for k, v in d.get("used_mib", {}).items()},
            util={int(k): int(v) for k, v in d.get("util", {}).items()},
            pgid=d.get("pgid"),
        )


def write_proc(state_dir: Path, entry: ProcEntry) -> None:
    _atomic_write(state_dir / "procs" / f"{entry.pid}.json", entry.to_json())


def remove_proc(state_dir: Path, pid: int) -> None:
    with contextlib.suppress(OSError):
        (state_dir / "procs" / f"{pid}.json").unlink()


def live_procs(state_dir: Path) -> list[ProcEntry]:
    """Entries of processes that are still alive, ordered by pid; dead ones are dropped (and removed)."""
    out: list[ProcEntry] = []
    procs = state_dir / "procs"
    if not procs.is_dir():
        return out
    for path in procs.glob("*.json"):
        try:
            entry = ProcEntry.from_json(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        started = process_start_time(entry.pid)
        if started is None or (entry.start_time is not None and started != entry.start_time):
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        out.append(entry)
    return sorted(out, key=lambda e: e.pid)
