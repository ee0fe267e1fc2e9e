"""A stored ``pareto`` study (two values per trial) read by everything that reads a study: the report and its
front figure, ``status``, ``export --pick``, ``trials``, the dashboard notes, MLflow's metrics and the live
progress lines (the trials built as the objective records them, tests/fixtures/trials.py); and the memory-aware
search running a pareto study on the simulated host's pure model."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from benchmarks.simeval import SimEvaluator
from runners.errors import ConfigError, StudyError
from search.cli.views import _line, summary_table
from search.outputs.export import export_script
from search.outputs.figures import FIGURE_IDS, PARETO_FIGURE_ID, study_figures
from search.outputs.html import report_html
from search.outputs.notes import note_markdown
from search.outputs.report import report_markdown
from search.outputs.status import study_status
from search.outputs.tracking import _metrics
from search.storage import create_or_load, open_storage
from search.strategy.strategy import Strategy
from search.strategy.view import StudyView
from search.trial.objective import Objective, TrialEnv
from search.trial.records import FACTS_ATTR, TrialFacts, records
from spaces.schema import Objective as SpaceObjective
from spaces.schema import load_space
from tests.fixtures.trials import DISTRIBUTIONS, level, make_trial, standard_trials

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 29, 7, 30, tzinfo=UTC)
METRICS = ["output_throughput", "p99_tpot_ms"]


def pareto_trial(mfs: float, cgbs: int, out: float, tpot: float, *, free: float, start: float) -> FrozenTrial:
    """A COMPLETE trial of a pareto study: its values are its C=16 level's output throughput and p99 TPOT."""
    made = make_trial(state=TrialState.COMPLETE, mfs=mfs, cgbs=cgbs, value=out, start_min=start,
                      levels=[{**level(16, out), "p99_tpot_ms": tpot}], memory={"free_after_capture_gib": free})
    system: dict[str, Any] = dict(made.system_attrs)
    system[FACTS_ATTR] = {**system[FACTS_ATTR], "objective_metrics": METRICS}
    trial = optuna.trial.create_trial(state=TrialState.COMPLETE, values=[out, tpot], params=made.params,
                                      distributions=DISTRIBUTIONS, user_attrs=made.user_attrs,
                                      system_attrs=system)
    trial.datetime_start, trial.datetime_complete = made.datetime_start, made.datetime_complete
    return trial


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> optuna.Study:
    """#0 1000 tok/s at 20 ms, #1 2000 at 40 (the knee), #2 2400 at 120 (thin headroom), #3 1500 at 60
    (beaten by #1 on both), #4 an OOM in graph capture."""
    url = f"sqlite:///{tmp_path_factory.mktemp('pareto')}/s.db"
    study = create_or_load(open_storage(url, heartbeat=False), "front", directions=["maximize", "minimize"],
                           metric_names=METRICS)
    for trial in [pareto_trial(0.7, 64, 1000.0, 20.0, free=6.0, start=0),
                  pareto_trial(0.8, 128, 2000.0, 40.0, free=4.0, start=5),
                  pareto_trial(0.88, 256, 2400.0, 120.0, free=0.9, start=10),
                  pareto_trial(0.75, 128, 1500.0, 60.0, free=5.0, start=15),
                  standard_trials()[2]]:
        study.add_trial(trial)
    return study


def header(script: str) -> list[str]:
    return [line.removeprefix("# ") for line in script.splitlines() if line.startswith("# ")]


def test_the_report_leads_with_the_front_and_its_knee(study: optuna.Study) -> None:
    md = report_markdown(StudyView.of(study))
    assert "Objective: the pareto front of maximize output_throughput, minimize p99_tpot_ms at concurrency 16." in md
    assert "- **Knee of the front: trial 1**, `output_throughput` = 2000.0 tok/s, `p99_tpot_ms` = 40.0 ms" in md
    table = md.split("## Pareto front", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ")[0] for line in table.splitlines() if line.startswith("| #")]
    assert rows == ["| #0", "| #1 (knee)", "| #2"]  # by throughput; #3 is beaten by #1 on both metrics
    assert "| #2 | 2400.0 | 120.0 | 1 |" in table
    assert "| #3 | COMPLETE | ok | 1500.00 / 60.00 |" in md  # every trial's values in the trials table


def test_the_front_figure_highlights_the_front_and_marks_the_knee(study: optuna.Study) -> None:
    figures = study_figures(StudyView.of(study))
    assert list(figures) == [PARETO_FIGURE_ID, *FIGURE_IDS]
    traces = {t.name.split(" (")[0]: t for t in figures[PARETO_FIGURE_ID].data}
    assert list(traces["front"].customdata) == [0, 1, 2] and list(traces["front"].y) == [20.0, 40.0, 120.0]
    assert list(traces["other configurations"].customdata) == [3]
    assert list(traces["knee"].customdata) == [1]
    assert figures[PARETO_FIGURE_ID].layout.xaxis.title.text == "output_throughput (tok/s)"
    assert f'id="{PARETO_FIGURE_ID}"' in report_html(StudyView.of(study), figures=figures)


def test_status_names_the_goal_and_the_knee(study: optuna.Study) -> None:
    status = study_status(StudyView.of(study), n_trials=5)
    assert status.direction == "pareto: maximize output_throughput, minimize p99_tpot_ms"
    assert status.best is not None and status.best.number == 1 and status.best.values == [2000.0, 40.0]


def test_export_picks_the_knee_by_default_and_names_the_rule_and_figures(study: optuna.Study) -> None:
    lines = header(export_script(StudyView.of(study), now=NOW))
    assert lines[0] == "servetune export: study front, trial 1"
    assert "objective: pareto front at concurrency 16: maximize output_throughput, minimize p99_tpot_ms" in lines
    assert "front: 3 configuration(s) (trials 0, 1, 2)" in lines
    assert "picked by: --pick knee (closest to the front's ideal point, each metric scaled to [0, 1] over the " \
           "front)" in lines
    assert "picked figures: output_throughput=2000.00, p99_tpot_ms=40.00 (this trial's launch)" in lines


@pytest.mark.parametrize("rule, trial, figures", [
    ("p99_tpot_ms<=30", 0, "output_throughput=1000.00, p99_tpot_ms=20.00"),
    ("p99_tpot_ms<=200", 2, "output_throughput=2400.00, p99_tpot_ms=120.00"),
    ("p99_tpot_ms<=200,output_throughput<2200", 1, "output_throughput=2000.00, p99_tpot_ms=40.00"),
])
def test_export_pick_by_conditions_then_the_first_metric(study: optuna.Study, rule: str, trial: int,
                                                         figures: str) -> None:
    lines = header(export_script(StudyView.of(study), pick=rule, now=NOW))
    assert lines[0] == f"servetune export: study front, trial {trial}"
    assert f"picked by: --pick {rule} (then the best on the first metric)" in lines
    assert f"picked figures: {figures} (this trial's launch)" in lines


def test_export_pick_keeps_to_the_headroom_bar_and_a_trial_given_by_number(study: optuna.Study) -> None:
    # #2 kept 0.9 GiB: with a 2 GiB bar the front of the rest is #0 and #1
    assert header(export_script(StudyView.of(study), pick="p99_tpot_ms<=200", min_free_gib=2.0, now=NOW))[0].endswith("trial 1")
    lines = header(export_script(StudyView.of(study), trial=3, now=NOW))
    assert "picked by: --trial 3 (not on the front)" in lines
    assert "picked figures: output_throughput=1500.00, p99_tpot_ms=60.00 (this trial's launch)" in lines


@pytest.mark.parametrize("kwargs, message", [
    ({"pick": "p99_tpot_ms<=10"}, "--pick p99_tpot_ms<=10: no configuration on the front satisfies it; the front: "
                                  "trial 0: output_throughput=1000, p99_tpot_ms=20; trial 1:"),
    ({"pick": "fastest"}, "--pick: 'fastest' is not 'knee' or METRIC<=NUMBER (or >=, <, >)"),
    ({"pick": "p99_ttft_ms<=10"}, "--pick: p99_ttft_ms is not one of this study's metrics (output_throughput, "
                                  "p99_tpot_ms)"),
    ({"pick": "knee", "trial": 1}, "--pick and --trial both choose the trial: give one of them"),
])
def test_a_bad_pick_is_one_line(study: optuna.Study, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        export_script(StudyView.of(study), **kwargs)
    assert "\n" not in str(err.value) and str(err.value).startswith(message), err.value


def test_pick_on_a_study_with_one_objective_is_one_line(tmp_path: Path) -> None:
    single = optuna.create_study(storage=f"sqlite:///{tmp_path}/one.db", study_name="one", direction="maximize")
    single.add_trial(standard_trials()[0])
    with pytest.raises(ConfigError, match=r"^--pick chooses from a pareto front, and study 'one' has one "
                                          r"objective \(maximize objective\): leave --pick out"):
        export_script(StudyView.of(single), pick="knee")


def test_trials_notes_tracking_and_progress_show_every_value(study: optuna.Study) -> None:
    rec = TrialFacts.from_trial(study.trials[1])
    assert rec.values == [2000.0, 40.0] and rec.value == 2000.0 and rec.objective_metrics == METRICS
    assert rec.summary()["values"] == [2000.0, 40.0]
    assert "**output_throughput** 2000 tok/s, **p99_tpot_ms** 40 ms ·" in note_markdown(study.trials[1])
    assert ("objective.p99_tpot_ms", 40.0, 0) in _metrics(rec)
    assert _line(rec, "output_throughput").startswith("trial 1: COMPLETE output_throughput=2000.0, p99_tpot_ms=40.0")
    assert summary_table(records(study), "output_throughput / p99_tpot_ms").row_count == 5


def test_resuming_a_study_under_another_objective_is_one_line(study: optuna.Study, tmp_path: Path) -> None:
    storage = open_storage(f"sqlite:///{tmp_path}/s.db", heartbeat=False)
    create_or_load(storage, "s", directions=["maximize"], metric_names=["output_throughput"])
    with pytest.raises(StudyError) as err:
        create_or_load(storage, "s", directions=["maximize", "minimize"], metric_names=METRICS)
    assert str(err.value) == ("study 's' exists with 1 objective(s) (maximize: output_throughput); this space's "
                              "objective has 2 (maximize, minimize): run it under another --study name")


def test_the_memory_aware_search_skips_certain_deaths_in_a_pareto_study() -> None:
    """The objective's memory model, skips and margin constraint, with two values per trial (the simulated
    host's pure model through the product's objective, as tests/search/test_memory.py runs it)."""
    base = load_space(ROOT / "spaces" / "demo-sim.yaml")
    objective = SpaceObjective.model_validate({"kind": "pareto", "level": base.target_level, "metrics": [
        {"name": "output_throughput"}, {"name": "mean_tpot_ms"}]})  # the pure model has no p99 TPOT
    space = base.model_copy(update={"objective": objective})
    evaluator = SimEvaluator(space, seed=1)
    run = Objective(TrialEnv(space=space, study_name="t", artifacts_dir=Path("/nonexistent")), evaluator)
    strategy = Strategy(space, None, start_design=False)
    study = optuna.create_study(directions=["maximize", "minimize"])
    nccl = {"nccl.NCCL_PROTO": "unset", "nccl.NCCL_ALGO": "unset"}

    def launch(mfs: float, bs: int, *, ours: bool = True) -> TrialFacts:
        # ours: a proposal of the search's own, which may be skipped; else one the user queued, always launched
        study.enqueue_trial({"mem_fraction_static": mfs, "cuda_graph_max_bs": bs, **nccl},
                            user_attrs={"design": True} if ours else None)
        trial = study.ask()
        try:
            study.tell(trial, run.run(trial, None, strategy.gate(strategy.view(study))))
        except optuna.TrialPruned:
            study.tell(trial, state=TrialState.PRUNED)
        return TrialFacts.from_trial(study.trials[-1])

    for rec in (launch(0.55, 80), launch(0.60, 16)):
        row = next(lv for lv in rec.levels if lv.max_concurrency == space.target_level)
        assert rec.state == TrialState.COMPLETE and rec.values == [row.output_throughput, row.mean_tpot_ms]
        assert rec.measured_margin_gib is not None and rec.feasible  # the margin is a constraint, as ever
    dead = launch(0.86, 64, ours=False)  # the model would skip it already: launched because a user asked
    assert dead.state == TrialState.PRUNED and dead.outcome == "oom" and dead.values is None
    skipped = launch(0.88, 80)  # less free memory than the one that died in graph capture: not launched
    assert skipped.predicted_oom and skipped.state == TrialState.PRUNED and not skipped.feasible
    assert [n for n, _seconds, _died in evaluator.launches] == [0, 1, 2]
