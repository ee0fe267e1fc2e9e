"""The trial record: one list of level keys, a record that round-trips, and the stored form of this release
reads back to what servetune 0.1.0 made of the same trials."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from runners import loadgen
from runners.telemetry import FailureKind, Phase
from search.outputs import tracking
from search.outputs.export import export_script
from search.outputs.notes import note_markdown
from search.outputs.report import report_markdown
from search.strategy.choice import best_single_launch as best_record
from search.strategy.view import StudyView
from search.trial.records import FACTS_ATTR, LevelResult, TrialFacts, records
from tests.data.make_stored_study import EXPORTED_AT, STUDY
from tests.fixtures.release import (
    export_as_now,
    note_as_now,
    release_metrics_by_level,
    release_params,
    release_tags,
    without_added_sections,
)
from tests.fixtures.trials import make_trial, standard_trials, store_facts

DATA = Path(__file__).resolve().parents[1] / "data"


def test_level_fields_are_the_keys_the_load_generator_emits() -> None:
    assert tuple(LevelResult.model_fields) == loadgen.RECORD_KEYS
    assert {name for name, _ in LevelResult.TABLE + LevelResult.HEADLINE} <= set(LevelResult.model_fields)


def test_a_level_stores_what_it_was_given_without_the_request_description() -> None:
    record = loadgen.summarize([], 2.0, level=4, api="sglang", input_len=64, output_len=16)
    level = LevelResult.model_validate(record)
    stored = level.stored()
    assert set(stored) == set(loadgen.RECORD_KEYS) - {"backend", "num_prompts", "random_input_len",
                                                      "random_output_len", "concurrency"}
    assert stored["mean_ttft_ms"] is None  # measured as "none completed": kept, not dropped
    assert LevelResult.model_validate({"max_concurrency": 8, "output_throughput": 1.5}).stored() == {
        "max_concurrency": 8, "output_throughput": 1.5}
    assert not level.served


def test_facts_round_trip_through_the_trial(tmp_path: Path) -> None:
    trial = make_trial(state=TrialState.PRUNED, mfs=0.9, cgbs=128, outcome="oom", phase="decode",
                       reason="Decode out of memory", memory={"free_after_capture_gib": 1.2},
                       levels=[{"max_concurrency": 1, "completed": 1, "failed": 0, "output_throughput": 9.0}])
    assert set(trial.user_attrs) == {"host", "outcome", "phase", "reason", "role"}  # short, for the dashboard
    assert set(trial.system_attrs) == {FACTS_ATTR}
    facts = TrialFacts.from_trial(trial)
    assert (facts.state, facts.outcome, facts.phase) == (TrialState.PRUNED, FailureKind.OOM, Phase.DECODE)
    assert facts.oom_phase == "decode" and facts.free_after_capture_gib == 1.2
    assert facts.levels[0].output_throughput == 9.0 and facts.level_reached == 1
    assert TrialFacts.from_trial(trial).stored() == trial.system_attrs[FACTS_ATTR]
    assert facts.telemetry.free_after_capture_gib == 1.2


def test_a_running_trial_names_its_host_only() -> None:
    running = standard_trials()[5]
    facts = TrialFacts.from_trial(running)
    assert facts.state == TrialState.RUNNING and facts.host == "gpu-a"
    assert facts.outcome is None and facts.label == "running"


def test_unknown_facts_from_a_newer_release_are_ignored() -> None:
    trial = make_trial(state=TrialState.COMPLETE, mfs=0.8, cgbs=64, value=1.0)
    attrs = dict(trial.system_attrs)
    attrs[FACTS_ATTR] = {**attrs[FACTS_ATTR], "a_fact_of_tomorrow": 42}
    trial.system_attrs = attrs
    assert TrialFacts.from_trial(trial).outcome == "ok"


def test_best_and_best_with_headroom(study: optuna.Study) -> None:
    recs = records(study)
    best = best_record(recs, optuna.study.StudyDirection.MAXIMIZE)
    assert best is not None and best.number == 1
    kept = best_record(recs, optuna.study.StudyDirection.MAXIMIZE, min_free_gib=2.0)
    assert kept is not None and kept.number == 0


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory: pytest.TempPathFactory) -> optuna.Study:
    """The stored 0.1.0 study with each trial's facts written as this release writes them."""
    db = tmp_path_factory.mktemp("rewritten") / "study.db"
    shutil.copy(DATA / "study-0.1.0.db", db)
    old = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{db}")
    new = optuna.create_study(storage=f"sqlite:///{db}", study_name="rewritten", direction="maximize")
    for trial in old.get_trials():
        store_facts(trial, TrialFacts.from_trial(trial))
        new.add_trial(trial)
    return new


def test_the_new_record_makes_what_the_old_attrs_made(rewritten: optuna.Study) -> None:
    expected: dict[str, Any] = json.loads((DATA / "study-0.1.0.expected.json").read_text())
    trials = rewritten.get_trials()
    assert all(set(t.user_attrs) <= {"host", "outcome", "phase", "reason", "role", "duplicate_of"} for t in trials)
    assert all(FACTS_ATTR in t.system_attrs for t in trials)
    assert without_added_sections(report_markdown(StudyView.of(rewritten))) == expected["report"].replace(
        f"report: {STUDY}", "report: rewritten")
    # The export names how many launches its figures hold (a 0.1.0 study has no confirmation repeats).
    launches = "# launches of this configuration: 1 (not confirmed by repeats; figures below are that launch's)\n"
    assert export_script(StudyView.of(rewritten), now=EXPORTED_AT) == export_as_now(expected["export"].replace(
        f"study {STUDY},", "study rewritten,").replace("# measured", launches + "# measured", 1))
    recs_now = records(rewritten)
    assert [note_markdown(t) for t in trials] == [note_as_now(n, r.objective_metric, r.objective_level)
                                                  for n, r in zip(expected["notes"], recs_now, strict=True)]
    recs = records(rewritten)
    assert json.loads(json.dumps([r.summary() for r in recs], default=str)) == expected["trials_json"]
    assert [tracking._params(r) for r in recs] == [
        release_params(p, m) for p, m in zip(expected["mlflow_params"], expected["mlflow_metrics"], strict=True)]
    assert [sorted([k, v, s] for k, v, s in tracking._metrics(r)) for r in recs] == [
        release_metrics_by_level(m, tracking.objective_key(r))
        for m, r in zip(expected["mlflow_metrics"], recs, strict=True)]
    assert [tracking._tags(STUDY, r) for r in recs] == [
        release_tags(t, r.role) for t, r in zip(expected["mlflow_tags"], recs, strict=True)]


def test_a_record_stored_as_a_user_attr_still_reads() -> None:
    """Studies written before the record moved to a system attr hold it as the user attr ``servetune.facts``."""
    trial = make_trial(state=TrialState.PRUNED, mfs=0.9, cgbs=128, outcome="oom", phase="decode",
                       reason="Decode out of memory", memory={"free_after_capture_gib": 1.2})
    record = trial.system_attrs[FACTS_ATTR]
    trial.system_attrs = {}
    trial.user_attrs = {**trial.user_attrs, FACTS_ATTR: record}
    facts = TrialFacts.from_trial(trial)
    assert (facts.outcome, facts.free_after_capture_gib) == (FailureKind.OOM, 1.2)


def test_the_dashboard_attrs_are_short_and_the_record_keeps_the_whole_reason() -> None:
    reason = "CUDA out of memory. " + "x" * 5000
    trial = make_trial(state=TrialState.PRUNED, mfs=0.9, cgbs=128, outcome="oom", phase="decode", reason=reason)
    assert all(len(str(v)) <= 200 for v in trial.user_attrs.values())
    assert trial.user_attrs["role"] == "search"
    assert TrialFacts.from_trial(trial).reason == reason


def test_one_schema_of_memory_figures() -> None:
    """The memory figures are written once (runners.telemetry.MemoryFigures): what a run fills, what a trial
    stores, the outputs' labels and MLflow's params are that schema."""
    from runners.telemetry import MemoryFigures, Telemetry
    from search.outputs.text import MEMORY_LABELS
    from search.outputs.tracking import MEM_PARAMS
    from search.trial.records import MemoryFacts

    names = MemoryFigures.names()
    assert tuple(MemoryFacts.model_fields) == names
    assert tuple(Telemetry.model_fields) == (*names, "simulated", "extra")
    assert tuple(MEMORY_LABELS) == names and MEMORY_LABELS["free_after_capture_gib"] == \
        "free after CUDA graph capture (GiB)"
    assert set(MEM_PARAMS) - {"sim_speed"} == {"gpu_total_gib", "mem_fraction_static", "cuda_graph_max_bs",
                                               "chunked_prefill_size", "context_len", "avail_before_weights_gib",
                                               "weights_gib", "max_running_requests"}
    tele = Telemetry(simulated=True)
    tele.weights_gib = 12.5
    tele.merge({"kv_gib": 40.0, "swa_tokens": 1024, "graph_gib": None})
    assert tele.to_dict() == {"weights_gib": 12.5, "kv_gib": 40.0, "simulated": True, "swa_tokens": 1024}
    facts = MemoryFacts.model_validate(tele.to_dict())
    assert facts.figure("swa_tokens") == 1024 and facts.weights_gib == 12.5
