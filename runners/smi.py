"""nvidia-smi queries servetune runs on a host, and parsers for their CSV (sglang-facts §7)."""

from __future__ import annotations

from dataclasses import dataclass

GPU_QUERY = (
    "nvidia-smi --query-gpu=index,name,memory.total,memory.used,memory.free,utilization.gpu,power.draw "
    "--format=csv,noheader,nounits"
)
APPS_QUERY = "nvidia-smi --query-compute-apps=pid,used_memory,gpu_uuid --format=csv,noheader,nounits"

_MISSING = {"[N/A]", "[Not Supported]", "[Insufficient Permissions]", "N/A", ""}


@dataclass(frozen=True)
class GpuStatus:
    index: int
    name: str
    total_mib: float | None
    used_mib: float | None
    free_mib: float | None
    utilization_pct: float | None
    power_w: float | None = None
    """``power.draw`` in W (None where the GPU does not report it)."""


@dataclass(frozen=True)
class ComputeApp:
    pid: int
    used_mib: float | None
    gpu_uuid: str | None = None


def _number(token: str) -> float | None:
    token = token.strip()
    if token in _MISSING:
        return None
    for unit in (" MiB", " %", " W"):
        if token.endswith(unit):
            token = token[: -len(unit)]
    try:
        return float(token)
    except ValueError:
        return None


def _rows(text: str) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("index,") or line.startswith("pid,"):
            continue  # blank, or the header of --format=csv
        rows.append([field.strip() for field in line.split(", ")])
    return rows


def parse_gpus(text: str) -> list[GpuStatus]:
    """Parse the output of :data:`GPU_QUERY` (with or without header and units)."""
    out = []
    for row in _rows(text):
        if len(row) < 6:
            raise ValueError(f"unexpected nvidia-smi GPU line: {', '.join(row)!r}")
        index, name, total, used, free, util = row[:6]
        power = _number(row[6]) if len(row) > 6 else None
        out.append(GpuStatus(int(index), name, _number(total), _number(used), _number(free), _number(util), power))
    return out


def parse_apps(text: str) -> list[ComputeApp]:
    """Parse the output of :data:`APPS_QUERY`; no output means no compute process."""
    out = []
    for row in _rows(text):
        if not row[0].isdigit():
            continue
        uuid = row[2] if len(row) > 2 and row[2] not in _MISSING else None
        out.append(ComputeApp(int(row[0]), _number(row[1]) if len(row) > 1 else None, uuid))
    return out
