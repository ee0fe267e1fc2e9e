"""A study stored by servetune 0.1.0 still reads: its trials come back through ``TrialFacts``, and the report,
export, notes, ``trials --json`` and MLflow content made of it are what that release made
(``tests/data/make_stored_study.py`` wrote both files with the release's code), less what was added on
purpose since: the report's verdict, skipped and all-trials sections, and MLflow metric names per level."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from runners.telemetry import FailureKind, Phase
from search.outputs import tracking
from search.outputs.export import export_script
from search.outputs.notes import note_markdown
from search.outputs.report import report_markdown
from search.strategy.view import StudyView
from search.trial.records import TrialFacts, records
from tests.data.make_stored_study import EXPORTED_AT, STUDY
from tests.fixtures.release import (
    ADDED_SECTIONS,
    export_as_now,
    note_as_now,
    release_metrics_by_level,
    release_params,
    release_tags,
    without_added_sections,
)

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> optuna.Study:
    db = tmp_path_factory.mktemp("stored") / "study.db"
    shutil.copy(DATA / "study-0.1.0.db", db)  # a copy: opening it must not touch the committed file
    return optuna.load_study(study_name=STUDY, storage=f"sqlite:///{db}")


@pytest.fixture(scope="module")
def expected() -> dict[str, Any]:
    return dict(json.loads((DATA / "study-0.1.0.expected.json").read_text()))


def test_trials_read_back_as_facts(study: optuna.Study) -> None:
    oom, ok, nccl, dup = records(study)
    assert (oom.state, oom.outcome, oom.phase) == (TrialState.PRUNED, FailureKind.OOM, Phase.DECODE)
    assert oom.oom_phase == "decode" and oom.memory.tried_to_allocate_gib > 0
    assert oom.level_reached == 16 and [lv.max_concurrency for lv in oom.levels][:2] == [1, 16]
    assert (ok.state, ok.outcome, ok.phase) == (TrialState.COMPLETE, "ok", None)
    assert ok.free_after_capture_gib is not None and ok.simulated
    assert ok.levels[-1].output_throughput == pytest.approx(ok.value)
    assert ok.launch_config is not None and ok.argv and ok.engine_version == "0.5.10"
    assert (nccl.state, nccl.outcome) == (TrialState.PRUNED, FailureKind.NCCL_ERROR)
    assert dup.duplicate_of == 1 and not dup.launched and dup.value == ok.value
    assert ok.telemetry.free_after_capture_gib == ok.free_after_capture_gib


def test_report_export_and_notes_are_those_of_the_release(study: optuna.Study, expected: dict[str, Any]) -> None:
    report = report_markdown(StudyView.of(study))
    assert all(f"\n{section}\n" in report for section in ADDED_SECTIONS)
    assert without_added_sections(report) == expected["report"]
    # The export names how many launches its figures hold (a 0.1.0 study has no confirmation repeats).
    launches = "# launches of this configuration: 1 (not confirmed by repeats; figures below are that launch's)\n"
    assert export_script(StudyView.of(study), now=EXPORTED_AT) == export_as_now(
        expected["export"].replace("# measured", launches + "# measured", 1))
    recs = [TrialFacts.from_trial(t) for t in study.get_trials()]
    assert [note_markdown(t) for t in study.get_trials()] == [note_as_now(n, r.objective_metric, r.objective_level)
                                                              for n, r in zip(expected["notes"], recs, strict=True)]


def test_trials_json_and_mlflow_content_are_those_of_the_release(study: optuna.Study,
                                                                  expected: dict[str, Any]) -> None:
    recs = [TrialFacts.from_trial(t) for t in study.get_trials()]
    assert json.loads(json.dumps([r.summary() for r in recs], default=str)) == expected["trials_json"]
    assert [tracking._params(r) for r in recs] == [
        release_params(p, m) for p, m in zip(expected["mlflow_params"], expected["mlflow_metrics"], strict=True)]
    metrics = [sorted([k, v, step] for k, v, step in tracking._metrics(r)) for r in recs]
    assert metrics == [release_metrics_by_level(m, tracking.objective_key(r))
                       for m, r in zip(expected["mlflow_metrics"], recs, strict=True)]
    assert [tracking._tags(STUDY, r) for r in recs] == [
        release_tags(t, r.role) for t, r in zip(expected["mlflow_tags"], recs, strict=True)]


# ---- a study stored at 19b29ef (before search/ was split into parts) ------------------------------


@pytest.fixture(scope="module")
def study_19b29ef(tmp_path_factory: pytest.TempPathFactory) -> optuna.Study:
    db = tmp_path_factory.mktemp("stored") / "study.db"
    shutil.copy(DATA / "study-19b29ef.db", db)
    return optuna.load_study(study_name="stored-19b29ef", storage=f"sqlite:///{db}")


def test_a_study_of_19b29ef_reads_and_recommends_what_that_revision_did(study_19b29ef: optuna.Study) -> None:
    """Its probe, design, repeats and final launches come back as they were queued; the choice, its figure
    and every ``trials --json`` row are that revision's (tests/data/make_study_19b29ef.py made both files)."""
    expected = json.loads((DATA / "study-19b29ef.expected.json").read_text())
    view = StudyView.of(study_19b29ef)
    recs = view.records
    assert recs[0].probe and any(r.design for r in recs) and any(r.final for r in recs)
    assert any(r.confirmation_of is not None and not r.final for r in recs)
    assert all(r.launch_config is not None and r.launch_config_error is None for r in recs if r.launched)
    assert any(r.oom and r.memory.tried_to_allocate_gib for r in recs)
    assert view.choice is not None
    verdict = report_markdown(view).split("## Verdict", 1)[1].split("\n## ", 1)[0]
    # The same trial is recommended. Its figure is, since issue 25, the mean of the launches made after it was
    # chosen (that revision printed their median): the line is that revision's with the mean computed here.
    finals = [r.value for r in recs if r.confirmation_of == view.choice.number and r.final and r.value is not None]
    assert len(finals) >= 2 and view.choice.number == 6
    median = f"= {statistics.median(finals):.2f} tok/s"
    assert median in expected["verdict_best_line"]
    assert next(line for line in verdict.splitlines() if line.startswith("- **Best")) == \
        expected["verdict_best_line"].replace(median, f"= {statistics.mean(finals):.2f} tok/s")
    assert export_script(view).splitlines()[1] == expected["export_first_line"]
    assert json.loads(json.dumps([r.summary() for r in recs], default=str)) == expected["trials_json"]
