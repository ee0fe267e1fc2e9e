"""nvidia-smi queries servetune runs on a host, and parsers for their CSV.

What a host prints is data, never trusted: the output is capped at the source (:func:`capped`: at most
:data:`MAX_BYTES` bytes and :data:`MAX_LINES` lines travel back, so a driver that prints two million lines costs
milliseconds), and a line that is not the queried CSV (what ``nvidia-smi`` prints, with exit status 0, for a GPU
that fell off the bus: ``Unable to determine the device handle for GPU0000:1B:00.0: Unknown Error``) raises
:class:`SmiOutputError`, a ``ValueError`` the host layer turns into one line naming the host.
"""

from __future__ import annotations

from dataclasses import dataclass

from runners.printable import printable

GPU_QUERY = (
    "nvidia-smi --query-gpu=index,name,memory.total,memory.used,memory.free,utilization.gpu,power.draw "
    "--format=csv,noheader,nounits"
)
APPS_QUERY = "nvidia-smi --query-compute-apps=pid,used_memory,gpu_uuid --format=csv,noheader,nounits"

#: At most this many bytes and lines of one nvidia-smi query travel back from a host (a GPU line is ~80 bytes:
#: room for hundreds of GPUs).
MAX_BYTES = 64 * 1024
MAX_LINES = 512

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


class SmiOutputError(ValueError):
    """nvidia-smi printed something that is not the CSV it was asked for (or too much of it)."""


def capped(query: str) -> str:
    """``query`` as shell text whose output is cut at :data:`MAX_BYTES` bytes and one line past
    :data:`MAX_LINES` lines on the host; its exit status is ``query``'s own (bash's ``PIPESTATUS``), unless the
    cut ended it early (SIGPIPE), which :func:`parse_gpus` then reports as too long."""
    return f"({query} | head -c {MAX_BYTES} | head -n {MAX_LINES + 1}; exit ${{PIPESTATUS[0]}})"


def cut_short(text: str) -> bool:
    """Did :func:`capped` cut ``text`` (more lines or bytes than it lets through)?"""
    return len(text.encode(errors="replace")) >= MAX_BYTES or text.count("\n") > MAX_LINES


def _shown(line: str) -> str:
    """A foreign line as it may appear in one error line: printable, at most 120 characters."""
    text = printable(line.strip(), newlines=False)
    return text if len(text) <= 120 else text[:117] + "..."


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
    lines = text.splitlines()
    if len(lines) > MAX_LINES:
        raise SmiOutputError(f"nvidia-smi printed more than {MAX_LINES} lines")
    rows = []
    for line in lines:
        line = line.strip()
        if not line or line.startswith("index,") or line.startswith("pid,"):
            continue  # blank, or the header of --format=csv
        rows.append([field.strip() for field in line.split(", ")])
    return rows


def parse_gpus(text: str) -> list[GpuStatus]:
    """Parse the output of :data:`GPU_QUERY` (with or without header and units)."""
    out = []
    for row in _rows(text):
        if len(row) < 6 or not row[0].isdigit():
            raise SmiOutputError(f"nvidia-smi printed a line that is not its GPU CSV: {_shown(', '.join(row))!r}")
        index, name, total, used, free, util = row[:6]
        power = _number(row[6]) if len(row) > 6 else None
        out.append(GpuStatus(int(index), _shown(name), _number(total), _number(used), _number(free),
                             _number(util), power))
    return out


def parse_apps(text: str) -> list[ComputeApp]:
    """Parse the output of :data:`APPS_QUERY`; no output means no compute process."""
    out = []
    for row in _rows(text):
        if not row[0].isdigit() or len(row[0]) > 10:
            continue  # "No running processes found" and the like
        uuid = row[2] if len(row) > 2 and row[2] not in _MISSING else None
        out.append(ComputeApp(int(row[0]), _number(row[1]) if len(row) > 1 else None, uuid))
    return out
