"""The outputs a run can have, by name: one line each (:mod:`search.outputs.sink` says what an output is).

The order is the order they are called in: each finished trial goes to every output in turn, and at the end a
later output sees what an earlier one published (MLflow logs the report's figures and HTML). The settings'
``outputs`` pick which run (``servetune run --no-mlflow`` leaves ``mlflow`` out).
"""

from __future__ import annotations

from collections.abc import Iterable

from runners.errors import ConfigError
from search.outputs.figures import FiguresSink
from search.outputs.notes import NotesSink
from search.outputs.report_files import ReportSink
from search.outputs.sink import SinkFactory
from search.outputs.tracking import MlflowSink

__all__ = ["SINKS", "factories"]

SINKS: dict[str, SinkFactory] = {
    "notes": NotesSink.open,
    "figures": FiguresSink.open,
    "report": ReportSink.open,
    "mlflow": MlflowSink.open,
}


def factories(names: Iterable[str]) -> list[tuple[str, SinkFactory]]:
    """The factories of the outputs ``names``, in :data:`SINKS` order. Raises ConfigError for a name that is not
    an output."""
    wanted = set(names)
    unknown = sorted(wanted - set(SINKS))
    if unknown:
        raise ConfigError(f"outputs: unknown output {', '.join(map(repr, unknown))} "
                          f"(known: {', '.join(SINKS)})")
    return [(name, factory) for name, factory in SINKS.items() if name in wanted]
