"""Markdown and number formatting shared by every output (report, dashboard notes, status, export)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeGuard

from runners.printable import printable
from runners.telemetry import MemoryFigures
from search.trial.records import LevelResult

__all__ = ["MEMORY_LABELS", "THIN_HEADROOM_GIB", "cell", "escape", "figure_text", "fmt", "format_duration",
           "is_number", "levels_table", "memory_label", "memory_table", "short", "sort_key", "terminal_safe", "unit"]

#: Free GPU memory after CUDA graph capture below which a configuration is called thin (seed 001: 0.82 GB
#: of headroom was a crash waiting for a prefill burst).
THIN_HEADROOM_GIB = 2.0

#: Each memory figure's label, in the order a server allocates memory (from the one schema of them).
MEMORY_LABELS: dict[str, str] = MemoryFigures.labels()


def levels_table(levels: Sequence[LevelResult]) -> list[str]:
    """Per-level bench_serving figures as Markdown table lines (columns present in any level)."""
    columns = [(k, label) for k, label in LevelResult.TABLE if any(k in lv.model_fields_set for lv in levels)]
    if not columns:
        return []
    out = ["| " + " | ".join(label for _, label in columns) + " |", "|" + "---:|" * len(columns)]
    for level in sorted(levels, key=lambda lv: sort_key(lv.max_concurrency)):
        out.append("| " + " | ".join(cell(level.figure(k)) for k, _ in columns) + " |")
    return out


def memory_table(memory: dict[str, Any]) -> list[str]:
    """The ``mem.*`` figures as Markdown table lines, in the order a server allocates memory."""
    if not memory:
        return []
    order = list(MEMORY_LABELS)
    keys = sorted(memory, key=lambda k: (order.index(k) if k in order else len(order), k))
    out = ["| figure | value |", "|---|---:|"]
    # One unit for sizes (GiB: a MiB figure is converted) and words for an engine's own keys.
    for k in keys:
        value = memory[k] / 1024 if k.endswith("_mib") and is_number(memory[k]) else memory[k]
        out.append(f"| {memory_label(k)} | {cell(value)} |")
    return out


def terminal_safe(text: str, *, one_line: bool = False) -> str:
    """``text`` fit for a terminal or a report: every control character a terminal would act on (escape
    sequences that set the title, clear the screen or plant a hyperlink; carriage return; C0 and C1
    controls; bidirectional overrides) written as a visible escape such as ``\\x1b``; tab and newline kept.
    The one sanitiser of every output: the command line's consoles and plain writes, the Markdown and HTML
    reports, status and export. ``one_line``: newline and tab are escaped too (a comment line of a script)."""
    return printable(text, newlines=not one_line)


def memory_label(key: str) -> str:
    """A memory figure's label: :data:`MEMORY_LABELS`, else its name in words with its unit (MiB shown as GiB)."""
    if key in MEMORY_LABELS:
        return MEMORY_LABELS[key]
    for suffix, shown in (("_gib", "GiB"), ("_mib", "GiB"), ("_bytes", "bytes"), ("_s", "s")):
        if key.endswith(suffix):
            return f"{key.removesuffix(suffix).replace('_', ' ')} ({shown})"
    return key.replace("_", " ")


def format_duration(seconds: float) -> str:
    """``3725`` -> ``'1h 02m 05s'``; ``42.5`` -> ``'42.5s'``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return f"{value:.1f}"
        return f"{value:.4g}" if abs(value) < 1 else f"{value:,.2f}".replace(",", "")
    return str(value)


def cell(value: Any) -> str:
    return escape(fmt(value))


def escape(text: str) -> str:
    return terminal_safe(text.replace("|", "\\|").replace("\n", " "))


def short(text: str, limit: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def sort_key(value: Any) -> tuple[int, float, str]:
    if value is None:
        return (2, 0.0, "")
    if is_number(value):
        return (0, float(value), "")
    return (1, 0.0, str(value))


def figure_text(value: float, metric: str | None, level: Any = None) -> str:
    """A value with its unit and what it measures: ``28.7 tok/s (output_throughput at C=64)``."""
    name = metric or "objective"
    u = unit(name) or {"slo_request_rate": "req/s", "slo_goodput": "tok/s"}.get(name, "")
    at = f" at C={level}" if level is not None else ""
    return f"{value:.1f}{' ' + u if u else ''} ({name}{at})"


def unit(metric: str) -> str:
    """The unit of a bench_serving metric (``tok/s``, ``req/s``, ``ms``; empty when unknown)."""
    if metric.endswith("_ms"):
        return "ms"
    if metric == "request_throughput":
        return "req/s"
    if metric.endswith("_throughput"):
        return "tok/s"
    return {"energy_per_token_j": "J/token", "cost_per_mtok": "per 1M tokens"}.get(metric, "")
