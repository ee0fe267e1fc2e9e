"""One contract for :class:`search.outputs.sink.OutputSink`, run on every registered output and on the fake.

Each sink opens for a run, meets the protocol under its registry name, takes every finished trial with the study
view and publishes from the view the run left, through :class:`~search.outputs.sink.Sinks`, with nothing raised
into the run; each leaves what that view says where its readers look. A sink that raises is logged once and the
run goes on.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState

from runners.errors import ConfigError
from search._optuna_compat import storage_of, study_id, trial_id
from search.outputs.registry import SINKS, factories
from search.outputs.report import report_markdown
from search.outputs.sink import OutputSink, Publication, RecordingSink, SinkContext, Sinks
from search.settings import Settings
from search.strategy.view import StudyView
from tests.fixtures.trials import build_study, standard_trials

KINDS = [*SINKS, "recording"]


def _notes(study: optuna.Study, sink: OutputSink, publication: Publication) -> None:
    from optuna_dashboard._note import get_note_from_system_attrs

    attrs = storage_of(study).get_study_system_attrs(study_id(study))
    for trial in study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)):
        assert f"# Trial {trial.number}" in get_note_from_system_attrs(attrs, trial_id(trial))["body"]


def _figures(study: optuna.Study, sink: OutputSink, publication: Publication) -> None:
    from optuna_dashboard._custom_plot_data import get_plotly_graph_objects

    assert get_plotly_graph_objects(storage_of(study).get_study_system_attrs(study_id(study)))


def _report(study: optuna.Study, sink: OutputSink, publication: Publication) -> None:
    assert publication.report_markdown is not None and publication.report_html is not None
    assert publication.report_markdown.read_text() == report_markdown(StudyView.of(study))
    assert publication.figures


def _mlflow(study: optuna.Study, sink: OutputSink, publication: Publication) -> None:
    from search.outputs.tracking import MlflowSink

    assert isinstance(sink, MlflowSink)
    client = MlflowClient(sink.tracker.tracking_uri)
    experiment = client.get_experiment_by_name(study.study_name)
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    trials = {run.data.tags.get("servetune.trial") for run in runs} - {None}
    finished = study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL))
    assert trials == {str(t.number) for t in finished}
    assert any(run.info.status == "FINISHED" and "servetune.trial" not in run.data.tags for run in runs)


def _recording(study: optuna.Study, sink: OutputSink, publication: Publication) -> None:
    assert isinstance(sink, RecordingSink)
    finished = study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL))
    assert [number for _, number in sink.trials] == [t.number for t in finished]
    assert sink.closed == 1 and len(sink.published) == 1


#: What each output leaves where its readers look, from the study view it was given. A new output adds one.
LEFT: dict[str, Callable[[optuna.Study, OutputSink, Publication], None]] = {
    "notes": _notes, "figures": _figures, "report": _report, "mlflow": _mlflow, "recording": _recording,
}


def test_every_registered_output_has_a_contract_and_runs_by_default() -> None:
    assert set(LEFT) == set(KINDS)
    assert list(Settings().outputs) == list(SINKS)


@pytest.fixture
def context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SinkContext:
    monkeypatch.chdir(tmp_path)
    settings = Settings(storage=f"sqlite:///{tmp_path}/s.db", mlflow_uri=f"sqlite:///{tmp_path}/mlflow.db",
                        artifacts_dir=tmp_path / "artifacts")
    return SinkContext(settings, "contract")


def _open(kind: str, context: SinkContext) -> OutputSink:
    return RecordingSink.open(context) if kind == "recording" else SINKS[kind](context)


@pytest.mark.parametrize("kind", KINDS)
class TestOutputSinkContract:
    def test_it_meets_the_protocol_under_its_name(self, kind: str, context: SinkContext) -> None:
        sink = _open(kind, context)
        try:
            assert isinstance(sink, OutputSink)
            assert sink.name == kind
        finally:
            sink.close()

    def test_it_takes_the_trials_and_publishes_from_the_view(self, kind: str, context: SinkContext) -> None:
        study = build_study(context.settings.storage, context.study, standard_trials())
        sinks = Sinks([_open(kind, context)])
        for trial in study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)):
            sinks.on_trial(StudyView.of(study), trial)
        sinks.close()
        publication = sinks.publish(StudyView.of(study), Publication(
            context.settings.artifacts_dir / context.study, context.settings.artifacts_dir))
        assert sinks.failures == {} and publication.errors == {}
        LEFT[kind](study, sinks.sinks[0], publication)

    def test_a_study_it_cannot_write_never_stops_the_run(self, kind: str, context: SinkContext,
                                                        tmp_path: Path) -> None:
        """The study's storage refuses writes (its tables are gone) and the report's folder is a file: every
        call returns; what publishing could not do is a line in the publication, never an exception."""
        study = build_study(context.settings.storage, context.study, standard_trials())
        view = StudyView.of(study)
        trials = study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
        with contextlib.closing(sqlite3.connect(tmp_path / "s.db")) as db:
            db.executescript("DROP TABLE study_system_attributes; DROP TABLE trial_system_attributes;")
        (context.settings.artifacts_dir).mkdir(parents=True, exist_ok=True)
        (context.settings.artifacts_dir / context.study).write_text("a file where the report's folder goes")
        sinks = Sinks([_open(kind, context)])
        for trial in trials:
            sinks.on_trial(view, trial)
        sinks.close()
        publication = sinks.publish(view, Publication(context.settings.artifacts_dir / context.study,
                                                      context.settings.artifacts_dir))
        assert all(isinstance(line, str) and "\n" not in line for line in publication.errors.values())


def test_a_sink_that_raises_is_logged_once_and_the_others_go_on(caplog: pytest.LogCaptureFixture,
                                                                tmp_path: Path) -> None:
    study = build_study(f"sqlite:///{tmp_path}/s.db", "s", standard_trials())
    view = StudyView.of(study)
    broken, fine = RecordingSink("broken", fail=RuntimeError("disk on fire")), RecordingSink("fine")
    sinks = Sinks([broken, fine])
    with caplog.at_level(logging.DEBUG, logger="servetune"):
        for callback in sinks.callbacks():
            for trial in study.trials[:3]:
                callback(view, trial)
        sinks.close()
        publication = sinks.publish(view, Publication(tmp_path / "s", tmp_path))
    assert [n for _, n in fine.trials] == [0, 1, 2] and [n for _, n in broken.trials] == [0, 1, 2]
    assert all(v is view for v, _ in fine.trials) and fine.published[0][0] is view
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "output broken failed" in warnings[0] and "disk on fire" in warnings[0]
    assert sinks.failures == {"broken": 4}
    assert publication.errors == {"broken": "broken not written (RuntimeError: disk on fire)"}


def test_an_output_that_cannot_open_is_a_warning_of_the_run(tmp_path: Path) -> None:
    def unavailable(context: SinkContext) -> OutputSink:
        raise RuntimeError("no such server")

    warnings: list[str] = []
    sinks = Sinks.open([("gone", unavailable), ("recording", RecordingSink.open)],
                       SinkContext(Settings(), "s"), warnings)
    assert sinks.names == ["recording"]
    assert warnings == ["gone: no such server; this run goes on without it"]


def test_the_settings_pick_the_outputs_in_the_registrys_order() -> None:
    assert [name for name, _ in factories(["mlflow", "notes"])] == ["notes", "mlflow"]
    with pytest.raises(ConfigError, match=r"outputs: unknown output 'mlfow' \(known: notes, figures, report, mlflow\)"):
        factories(["mlfow"])
