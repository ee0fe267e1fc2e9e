"""The recommended configuration is computed once (``search.strategy.choice.choose``) and every output shows it:
in a study where the best single launch (trial 2, one lucky launch) is not the configuration chosen on its
repeated launches (trial 0), the report, the HTML page, ``status``, ``export``, the MLflow parent run and the
run's last lines all name trial 0 with the same reported figure."""

from __future__ import annotations

import io
import statistics
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient
from optuna.trial import FrozenTrial, TrialState
from rich.console import Console

from search.cli.views import print_run
from search.driver.run import RunSummary, StopReason
from search.outputs.export import export_script
from search.outputs.html import report_html
from search.outputs.report import report_markdown
from search.outputs.status import study_status
from search.outputs.tracking import MlflowTracker
from search.strategy.choice import choose
from search.strategy.view import StudyView
from search.trial.records import FACTS_ATTR
from spaces.schema import load_space
from tests.fixtures.trials import build_study, level, make_trial

ROOT = Path(__file__).resolve().parents[2]
FINALS = (2150.0, 2170.0, 2160.0)


def launch(mfs: float, cgbs: int, value: float, start: float, **tags: Any) -> FrozenTrial:
    trial = make_trial(state=TrialState.COMPLETE, mfs=mfs, cgbs=cgbs, value=value, start_min=start,
                       levels=[level(1, value / 10), level(16, value)], memory={"free_after_capture_gib": 4.0})
    trial.system_attrs = {**trial.system_attrs, FACTS_ATTR: {**trial.system_attrs[FACTS_ATTR], **tags}}
    return trial


@pytest.fixture
def view(tmp_path: Path) -> StudyView:
    trials = [launch(0.80, 128, 2200.0, 0), launch(0.84, 64, 2100.0, 5), launch(0.86, 256, 2500.0, 10),
              launch(0.80, 128, 2230.0, 15, confirmation_of=0)]
    trials += [launch(0.80, 128, v, 20 + i, confirmation_of=0, final=True) for i, v in enumerate(FINALS)]
    return StudyView.of(build_study(f"sqlite:///{tmp_path / 's.db'}", "choice", trials))


@pytest.mark.slow  # every output: reports, figures, an MLflow store
def test_every_output_names_the_one_choice(view: StudyView, tmp_path: Path) -> None:
    reported = statistics.fmean(FINALS)  # the mean of the final launches
    single = max(view.records, key=lambda r: r.value or 0.0)
    assert single.number == 2  # the luckiest launch is not the choice
    choice = view.choice
    assert choice is not None and choice.number == 0 and choice.basis == "confirmed"
    assert choice.value == reported and len(choice.launches) == 5

    verdict = report_markdown(view).split("## Verdict", 1)[1].split("\n## ", 1)[0]
    assert f"- **Best: trial 0**, `output_throughput` = {reported:.1f} tok/s" in verdict
    assert "trial 2" not in verdict
    assert f"<strong>Best: trial 0</strong>, <code>output_throughput</code> = {reported:.1f}" in report_html(view)

    status = study_status(view)
    assert status.best is not None and (status.best.number, status.best.value) == (0, reported)

    header = [line for line in export_script(view).splitlines() if line.startswith("# ")]
    assert header[0] == "# servetune export: study choice, trial 0"
    assert (f"# objective: output_throughput at concurrency 16 = {reported:.2f} tok/s (mean of the 3 launches "
            "made after it was chosen; maximize)") in header
    # one figure in the header: the launches line counts and spreads, it gives no second median
    assert sum(f"{v:.2f}" in " ".join(header) for v in {reported, statistics.median([2200.0, 2230.0, *FINALS])}
               if v != reported) == 0
    assert "median" not in next(line for line in header if line.startswith("# launches of this configuration"))
    # what --min-free-gib excluded: trial 2 (2500) ranks above trial 0 but kept 4.0 GiB only
    bar = [line for line in export_script(view, min_free_gib=5.0 - 1.5).splitlines()
           if line.startswith("# --min-free-gib")]
    assert bar == ["# --min-free-gib 3.5: excluded no configuration that ranks above it"]

    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", str(tmp_path / "mlartifacts"))
    tracker.finish_study(view)
    client = MlflowClient(tracker.tracking_uri)
    parent = next(r for r in client.search_runs([tracker.experiment_id("choice")])
                  if r.data.tags.get("servetune.kind") == "study")
    assert parent.data.tags["servetune.best_trial"] == "0" and parent.data.metrics["best_value"] == reported

    console = Console(file=io.StringIO(), width=200)
    summary = RunSummary(view.study, ran=7, stopped_by=StopReason.BUDGET, host_states=[])
    print_run(console, console, summary, load_space(ROOT / "spaces" / "demo-sim.yaml"))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert f"trial 0, output_throughput={reported:.4g}" in out and "trial 2," not in out


def test_a_free_memory_bar_says_what_it_excluded(view: StudyView) -> None:
    """With a bar the chosen configuration misses, the choice is the best that clears it, and it names the
    configuration the bar kept out."""
    view.study.add_trial(make_trial(state=TrialState.COMPLETE, mfs=0.7, cgbs=64, value=1900.0, start_min=40,
                                    levels=[level(16, 1900.0)], memory={"free_after_capture_gib": 9.0}))
    fresh = StudyView.of(view.study)
    roomy = fresh.records[-1].number
    barred = choose(fresh.records, fresh.goal, min_free_gib=8.0)
    assert barred is not None and barred.number == roomy and barred.excluded == (0,)
    assert fresh.choice is not None and fresh.choice.number == 0  # without the bar: the one choice as before
