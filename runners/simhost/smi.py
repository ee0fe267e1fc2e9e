"""``nvidia-smi`` for the simulated host: ``python -m runners.simhost.smi [nvidia-smi arguments]``.

It prints nvidia-smi's CSV (sglang-facts §7) from the state directory the simulated servers publish
(``runners.simhost.state``): memory.used = driver baseline + every live process's memory on that GPU.

Supported: ``--query-gpu=FIELDS`` and ``--query-compute-apps=FIELDS`` with
``--format=csv[,noheader][,nounits]``, ``-i/--id=LIST``, ``-L/--list-gpus``, and the plain table
(``nvidia-smi`` without arguments). GPU fields: index, name, uuid, pci.bus_id, driver_version, count,
memory.total, memory.used, memory.free, utilization.gpu, utilization.memory, temperature.gpu, power.draw,
compute_mode, persistence_mode. Compute-app fields: pid, process_name (name), used_memory
(used_gpu_memory), gpu_uuid, gpu_bus_id, gpu_name. An empty compute-apps query prints nothing, like
nvidia-smi. Exit codes: 0 ok, 2 bad argument, 9 no simulated host (no ``host.json``: "couldn't
communicate with the NVIDIA driver").
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from runners.simhost.hog import HIDDEN
from runners.simhost.state import HostState, ProcEntry, default_state_dir, live_procs, read_host

__all__ = ["main", "render"]

_NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)


@dataclass
class _Gpu:
    index: int
    host: HostState
    used: int
    util: int

    @property
    def free(self) -> int:
        return max(self.host.memory_total_mib - self.used, 0)

    @property
    def bus_id(self) -> str:
        return f"00000000:{0x18 + 0x10 * self.index:02X}:00.0"


# field -> (header, unit or "", value)
_GpuField = tuple[str, str, Callable[[_Gpu], str]]
_GPU_FIELDS: dict[str, _GpuField] = {
    "index": ("index", "", lambda g: str(g.index)),
    "name": ("name", "", lambda g: g.host.gpu_name),
    "gpu_name": ("name", "", lambda g: g.host.gpu_name),
    "uuid": ("uuid", "", lambda g: g.host.uuids[g.index]),
    "gpu_uuid": ("uuid", "", lambda g: g.host.uuids[g.index]),
    "pci.bus_id": ("pci.bus_id", "", lambda g: g.bus_id),
    "gpu_bus_id": ("pci.bus_id", "", lambda g: g.bus_id),
    "driver_version": ("driver_version", "", lambda g: g.host.driver_version),
    "count": ("count", "", lambda g: str(g.host.gpu_count)),
    "memory.total": ("memory.total", "MiB", lambda g: str(g.host.memory_total_mib)),
    "memory.used": ("memory.used", "MiB", lambda g: str(g.used)),
    "memory.free": ("memory.free", "MiB", lambda g: str(g.free)),
    "utilization.gpu": ("utilization.gpu", "%", lambda g: str(g.util)),
    "utilization.memory": ("utilization.memory", "%", lambda g: str(g.util // 3)),
    "temperature.gpu": ("temperature.gpu", "", lambda g: str(32 + g.util // 3)),
    "power.draw": ("power.draw", "W", lambda g: f"{g.host.idle_w + (g.host.max_w - g.host.idle_w) * g.util / 100:.2f}"),
    "compute_mode": ("compute_mode", "", lambda g: "Default"),
    "persistence_mode": ("persistence_mode", "", lambda g: "Enabled"),
}

_AppRow = tuple[ProcEntry, int, _Gpu]
_AppField = tuple[str, str, Callable[[_AppRow], str]]
_APP_FIELDS: dict[str, _AppField] = {
    "pid": ("pid", "", lambda r: str(r[0].pid)),
    "process_name": ("process_name", "", lambda r: r[0].name),
    "name": ("process_name", "", lambda r: r[0].name),
    "used_memory": ("used_gpu_memory", "MiB", lambda r: str(r[1])),
    "used_gpu_memory": ("used_gpu_memory", "MiB", lambda r: str(r[1])),
    "gpu_uuid": ("gpu_uuid", "", lambda r: r[2].host.uuids[r[2].index]),
    "gpu_bus_id": ("gpu_bus_id", "", lambda r: r[2].bus_id),
    "gpu_name": ("gpu_name", "", lambda r: r[2].host.gpu_name),
}


class _Usage(Exception):
    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def _gpus(host: HostState, procs: Sequence[ProcEntry]) -> list[_Gpu]:
    out = []
    for i in range(host.gpu_count):
        used = host.baseline_used_mib + sum(p.used_mib.get(i, 0) for p in procs)
        util = max((p.util.get(i, 0) for p in procs if i in p.used_mib), default=0)
        out.append(_Gpu(index=i, host=host, used=min(used, host.memory_total_mib), util=util))
    return out


def _parse(argv: Sequence[str]) -> dict[str, str]:
    opts: dict[str, str] = {}
    args = list(argv)
    names = {
        "--query-gpu": "query-gpu",
        "--query-compute-apps": "query-apps",
        "--format": "format",
        "--id": "id",
        "-i": "id",
    }
    while args:
        arg = args.pop(0)
        if arg in ("-L", "--list-gpus"):
            opts["list"] = "1"
            continue
        key, eq, value = arg.partition("=")
        if key in names:
            if not eq:
                if not args:
                    raise _Usage(f"Option {key} requires an argument.")
                value = args.pop(0)
            opts[names[key]] = value
            continue
        raise _Usage("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n")
    return opts


def _csv(
    fields: list[str],
    table: dict[str, tuple[str, str, Callable[..., str]]],
    rows: Sequence[object],
    fmt: set[str],
) -> str:
    for f in fields:
        if f not in table:
            raise _Usage(f'Field "{f}" is not a valid field to query.\n\n')
    lines = []
    if "noheader" not in fmt:
        heads = []
        for f in fields:
            head, unit, _ = table[f]
            heads.append(f"{head} [{unit}]" if unit else head)
        lines.append(", ".join(heads))
    for row in rows:
        vals = []
        for f in fields:
            _, unit, fn = table[f]
            value = fn(row)
            vals.append(value if ("nounits" in fmt or not unit) else f"{value} {unit}")
        lines.append(", ".join(vals))
    return "".join(line + "\n" for line in lines)


def _table(gpus: list[_Gpu], procs: Sequence[ProcEntry], host: HostState) -> str:
    """A compact rendition of nvidia-smi's default table (for people; tools should use the CSV queries)."""
    width = 89
    rule = "+" + "-" * width + "+"

    def row(text: str) -> str:
        return f"|{text[:width]:<{width}}|"

    out = [
        time.strftime("%a %b %d %H:%M:%S %Y"),
        rule,
        row(f" NVIDIA-SMI {host.driver_version}    Driver Version: {host.driver_version}    CUDA Version: 13.0"),
        rule,
    ]
    for g in gpus:
        out.append(
            row(
                f" {g.index:>3}  {g.host.gpu_name[:38]:<38} {g.bus_id} "
                f"{g.used:>6}MiB / {g.host.memory_total_mib:>6}MiB  {g.util:>3}%"
            )
        )
    out += [rule, row(" Processes:"), row("  GPU   PID        Type   Process name                              Memory")]
    rows = sorted(((i, p) for p in procs for i in p.used_mib if p.used_mib[i] > 0 and p.kind != HIDDEN),
                  key=lambda r: (r[0], r[1].pid))
    if not rows:
        out.append(row("  No running processes found"))
    for i, p in rows:
        out.append(row(f"  {i:>3}   {p.pid:<10} C      {p.name[-40:]:<40}  {p.used_mib[i]:>7}MiB"))
    out.append(rule)
    return "\n".join(out) + "\n"


def render(argv: Sequence[str], state_dir: Path) -> tuple[str, int]:
    """What nvidia-smi would print for ``argv`` on the simulated host, and its exit code."""
    host = read_host(state_dir)
    if host is None:
        return _NO_DRIVER, 9
    try:
        opts = _parse(argv)
        procs = live_procs(state_dir)
        gpus = _gpus(host, procs)
        if "id" in opts:
            try:
                wanted = {int(x) for x in opts["id"].split(",") if x.strip()}
            except ValueError as exc:
                raise _Usage(f"Invalid GPU id: {opts['id']}\n") from exc
            if any(w >= host.gpu_count or w < 0 for w in wanted):
                raise _Usage("No devices were found\n", code=6)
            gpus = [g for g in gpus if g.index in wanted]
        fmt = {part.strip() for part in opts.get("format", "csv").split(",")}
        if "list" in opts:
            return "".join(f"GPU {g.index}: {host.gpu_name} (UUID: {host.uuids[g.index]})\n" for g in gpus), 0
        if "query-gpu" in opts:
            fields = [f.strip() for f in opts["query-gpu"].split(",") if f.strip()]
            return _csv(fields, _GPU_FIELDS, gpus, fmt), 0
        if "query-apps" in opts:
            fields = [f.strip() for f in opts["query-apps"].split(",") if f.strip()]
            by_index = {g.index: g for g in gpus}
            rows: list[_AppRow] = [
                (p, p.used_mib[i], by_index[i])
                for i in sorted(by_index)
                for p in procs
                if p.used_mib.get(i, 0) > 0 and p.kind != HIDDEN
            ]
            return _csv(fields, _APP_FIELDS, rows, fmt), 0
        return _table(gpus, procs, host), 0
    except _Usage as exc:
        return exc.message, exc.code


def main(argv: Sequence[str] | None = None) -> int:
    text, code = render(sys.argv[1:] if argv is None else argv, default_state_dir())
    sys.stdout.write(text)
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    raise SystemExit(main())
