"""What a run's outputs are to the run: one small protocol, :class:`OutputSink`, and the guard that holds them.

An output (MLflow tracking, the dashboard notes and figures, the morning report, ...) is a sink: it is opened for
one run (:class:`SinkContext`), gets each finished trial with one view of the study (:meth:`OutputSink.on_trial`),
is closed when the run's trials are done (:meth:`OutputSink.close`) and publishes from the study view the run
left (:meth:`OutputSink.publish`), in the order the registry (:mod:`search.outputs.registry`) lists them, so a
later sink sees what an earlier one published (MLflow logs the report's figures). A sink never stops the run:
:class:`Sinks` calls each one under a guard that logs its first failure (later ones at debug level) and goes
on, as optuna's callbacks and MLflow's autolog hooks are meant to. :class:`RecordingSink` is the fake.

Adding an output is one file with a class that meets :class:`OutputSink` (and an ``open(context)``
classmethod) and one line in :data:`search.outputs.registry.SINKS`.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from optuna.trial import FrozenTrial

from runners.errors import ServetuneError
from search.settings import Settings
from search.strategy.view import StudyView

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["OutputSink", "Publication", "RecordingSink", "SinkContext", "SinkFactory", "SinkUnavailable", "Sinks"]

logger = logging.getLogger("servetune")


@dataclass(frozen=True)
class SinkContext:
    """What a sink is opened with: the run's settings and its study's name."""

    settings: Settings
    study: str


class SinkUnavailable(ServetuneError):
    """A sink cannot work for this run (MLflow cannot be written): the run goes on without it, and the message
    (one line, naming the output and what to do later) is one of the run's warnings."""


@dataclass
class Publication:
    """What the end of a run gives its sinks, and what each leaves for those after it and for the run's summary.

    ``directory`` is the study's folder of the artifacts directory; ``files_refused``: the run stopped because a
    trial's files could not be written (a full disk would refuse the report too). The report's sink fills
    ``report_markdown``, ``report_html`` and ``figures``; :class:`Sinks` fills ``errors`` (sink name: one line).
    """

    directory: Path
    artifacts_dir: Path
    files_refused: bool = False
    report_markdown: Path | None = None
    report_html: Path | None = None
    figures: dict[str, go.Figure] | None = None
    errors: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class OutputSink(Protocol):
    """One output of a run (see the module docstring). No method may be relied on to raise: :class:`Sinks`
    guards every call, and an error a sink wants the run's summary to show is raised from :meth:`publish` (a
    :class:`~runners.errors.ServetuneError`'s one line)."""

    name: str
    """The output's name in the registry and in the settings' ``outputs``."""

    def on_trial(self, view: StudyView, trial: FrozenTrial) -> None:
        """A trial finished: ``view`` is the study read once for every sink, ``trial`` the finished trial."""
        ...

    def close(self) -> None:
        """The run's trials are done (or the run failed): finish what is in flight (a background redraw)."""
        ...

    def publish(self, view: StudyView, publication: Publication) -> None:
        """Publish from the study as the run left it (not called when the run failed)."""
        ...


SinkFactory = Callable[[SinkContext], OutputSink]
"""How the registry opens a sink for a run; raises :class:`SinkUnavailable` when the sink cannot work."""


class Sinks:
    """The run's sinks, each called under a guard: an error is logged (the first of each sink as a warning, the
    rest at debug level) and the run goes on."""

    def __init__(self, sinks: Iterable[OutputSink]) -> None:
        self.sinks = list(sinks)
        self.failures: dict[str, int] = {}

    @classmethod
    def open(cls, factories: Sequence[tuple[str, SinkFactory]], context: SinkContext,
             warnings: list[str]) -> Sinks:
        """Open each sink for the run; one that is unavailable (or fails to open) is left out with one line in
        ``warnings``."""
        opened: list[OutputSink] = []
        for name, factory in factories:
            try:
                opened.append(factory(context))
            except SinkUnavailable as exc:
                warnings.append(str(exc))
            except Exception as exc:  # an output that cannot open must not stop the run
                warnings.append(f"{name}: {_line(exc)}; this run goes on without it")
        return cls(opened)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sinks]

    def callbacks(self) -> list[Callable[[StudyView, FrozenTrial], None]]:
        """One study callback per sink (the run loop gives each its own copy of the trial), each guarded."""
        return [self._on_trial(sink) for sink in self.sinks]

    def on_trial(self, view: StudyView, trial: FrozenTrial) -> None:
        """Every sink's :meth:`~OutputSink.on_trial`, each with its own copy of ``trial``."""
        for callback in self.callbacks():
            callback(view, copy.deepcopy(trial))

    def close(self) -> None:
        for sink in self.sinks:
            self._guard(sink, "close", sink.close)

    def publish(self, view: StudyView, publication: Publication) -> Publication:
        """Every sink's :meth:`~OutputSink.publish` in order; what one raises is its line in
        ``publication.errors`` (a ServetuneError's own line, else the error's type and first line)."""
        for sink in self.sinks:
            try:
                sink.publish(view, publication)
            except ServetuneError as exc:
                publication.errors[sink.name] = str(exc)
            except Exception as exc:  # an output is a convenience: every result is in the study already
                publication.errors[sink.name] = f"{sink.name} not written ({type(exc).__name__}: {exc})"
        return publication

    def _on_trial(self, sink: OutputSink) -> Callable[[StudyView, FrozenTrial], None]:
        def call(view: StudyView, trial: FrozenTrial) -> None:
            self._guard(sink, f"trial {trial.number}", lambda: sink.on_trial(view, trial))

        return call

    def _guard(self, sink: OutputSink, what: str, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception as exc:  # a sink never stops the run
            count = self.failures[sink.name] = self.failures.get(sink.name, 0) + 1
            log = logger.warning if count == 1 else logger.debug
            log("output %s failed (%s): %s; the run goes on", sink.name, what, _line(exc))


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class RecordingSink:
    """The fake sink: records what it is given (``trials``: (view, trial number) in order, ``closed``,
    ``published``: (view, publication)); with ``fail`` set, every call raises it after recording."""

    def __init__(self, name: str = "recording", *, fail: BaseException | None = None) -> None:
        self.name = name
        self.fail = fail
        self.trials: list[tuple[StudyView, int]] = []
        self.closed = 0
        self.published: list[tuple[StudyView, Publication]] = []

    @classmethod
    def open(cls, context: SinkContext) -> RecordingSink:
        return cls()

    def on_trial(self, view: StudyView, trial: FrozenTrial) -> None:
        self.trials.append((view, trial.number))
        self._maybe_fail()

    def close(self) -> None:
        self.closed += 1
        self._maybe_fail()

    def publish(self, view: StudyView, publication: Publication) -> None:
        self.published.append((view, publication))
        self._maybe_fail()

    def _maybe_fail(self) -> None:
        if self.fail is not None:
            raise self.fail
