"""In a real browser (Debian's Chromium through Playwright): optuna-dashboard over a finished demo-like study
on the simulated host shows servetune's choice and why on the study's note page, servetune's figures on the
study page, a PRUNED trial's note and files; the HTML report opens with nothing missing and no network, says how
the winner was chosen and fits 1440 px. Screenshots of failures go to ``test-artifacts/browser/``."""

from __future__ import annotations

import re
from typing import Any

import optuna
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState

from search.outputs.explain import CHOICE_FIGURE_ID
from search.outputs.figures import FIGURE_IDS, OUTCOME_CLASSES
from search.strategy.choice import CHOICE_ATTR
from search.strategy.view import StudyView
from tests.fixtures.browser import (
    Dashboard,
    DemoStudy,
    hidden_legend_entries,
    overlapping_text,
    scroll_width,
    watch,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

def study_id(board: Dashboard, name: str) -> int:
    return next(s["study_id"] for s in board.get("/api/studies")["study_summaries"] if s["study_name"] == name)


def test_demo_study_and_where_its_figures_went(demo: DemoStudy, study: optuna.Study, board: Dashboard) -> None:
    trials = study.get_trials(deepcopy=False)
    # The budget counts launches: a configuration the memory model skips (predicted OOM) is a trial on top.
    launched = [t for t in trials if t.user_attrs.get("outcome") != "predicted_oom"]
    assert len(launched) == 5 and trials[0].state == TrialState.PRUNED and trials[1].state == TrialState.COMPLETE
    # The trial that died at C=64 reports intermediate values for the levels it finished only: the sweep runs
    # the target level first (fail fast), so it finished none and shows no 0 where it died.
    assert sorted(trials[0].intermediate_values) == []
    assert "(simulated)" in demo.run_output
    detail = board.get(f"/api/studies/{study_id(board, demo.name)}?after=0")
    assert sorted(g["id"] for g in detail["plotly_graph_objects"]) == sorted([CHOICE_FIGURE_ID, *FIGURE_IDS])
    assert "report.html" in [a["filename"] for a in detail["artifacts"]]
    # MLflow: the parent run holds the figures and the report; trial runs name their levels.
    client = MlflowClient(f"sqlite:///{demo.wd / 'mlruns' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(demo.name)
    assert experiment is not None and experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    parent = client.search_runs([experiment.experiment_id], "tags.`servetune.kind` = 'study'")[0]
    files = sorted(f.path for d in ("figures", "report") for f in client.list_artifacts(parent.info.run_id, d))
    assert files == sorted([f"figures/{g}.html" for g in (CHOICE_FIGURE_ID, *FIGURE_IDS)] + ["report/report.html"])
    died = client.search_runs([experiment.experiment_id], "tags.`servetune.trial` = '0'")[0].data.metrics
    assert died["c64.completed"] == 0  # the level it died in: what failed, no throughput
    assert "c64.output_throughput" not in died and "output_throughput" not in died


def test_study_page_shows_the_oom_map(demo: DemoStudy, study: optuna.Study, board: Dashboard, page: Any) -> None:
    traffic = watch(page.context, (board.url, "data:"))
    page.goto(f"{board.url}/dashboard/studies/{study_id(board, demo.name)}")
    graph = "user-defined-plot:servetune-oom-map"
    page.wait_for_selector(f'[id="{graph}"] .scatterlayer path.point')
    for graph_id in FIGURE_IDS:
        assert page.locator(f'[id="user-defined-plot:{graph_id}"] .main-svg').count() > 0, graph_id
    traces = page.evaluate("""(id) => {
        const gd = document.getElementById(id);
        return [...gd.querySelectorAll('.scatterlayer .trace')].map((el, i) => ({
            outcome: gd.data[i].meta.servetune_outcome,
            numbers: gd.data[i].customdata,
            // an open symbol (a predicted OOM, infrastructure trouble) has no fill: its colour is the stroke
            fills: [...el.querySelectorAll('path.point')].map(
                p => (p.style.fill && p.style.fill !== 'none') ? p.style.fill : p.style.stroke),
        }));
    }""", graph)
    # One mark per trial, each in its outcome's colour.
    numbers = sorted(n for t in traces for n in t["numbers"])
    assert numbers == [t.number for t in study.get_trials(deepcopy=False)]
    assert sum(len(t["fills"]) for t in traces) == len(numbers)
    by_outcome = {t["outcome"]: t for t in traces}
    assert 0 in by_outcome["oom:decode"]["numbers"] and 1 in by_outcome["ok"]["numbers"]
    for outcome, trace in by_outcome.items():
        assert set(trace["fills"]) == {_rgb(OUTCOME_CLASSES[outcome][1])}, outcome
    assert not traffic.blocked and not traffic.bad_status


def test_study_note_names_the_choice_first(demo: DemoStudy, study: optuna.Study, board: Dashboard,
                                          page: Any) -> None:
    choice = StudyView.of(study).choice
    assert choice is not None
    page.goto(f"{board.url}/dashboard/studies/{study_id(board, demo.name)}/note")
    page.get_by_text(f"servetune's choice for {demo.name}").first.wait_for()
    headings = page.locator("h1, h2").all_inner_texts()
    # The note's first heading after its title names the chosen trial and its figure.
    first = next(h for h in headings if h.startswith("Trial "))
    assert first.startswith(f"Trial {choice.number}: output_throughput")
    assert "How the winner was chosen" in headings
    assert scroll_width(page, fit=1440) <= 1440


def test_study_page_has_the_choice_figure_and_fits(demo: DemoStudy, study: optuna.Study, board: Dashboard,
                                                   page: Any) -> None:
    choice = StudyView.of(study).choice
    assert choice is not None
    page.goto(f"{board.url}/dashboard/studies/{study_id(board, demo.name)}")
    graph = f"user-defined-plot:{CHOICE_FIGURE_ID}"
    page.wait_for_selector(f'[id="{graph}"] .scatterlayer path.point')
    title = page.locator(f'[id="{graph}"] .gtitle').text_content() or ""
    assert title.startswith(f"servetune's choice: trial {choice.number},")
    # The study's user attributes (a table on this page, in the order they were first set, five rows to a page)
    # name the choice in one line, in the table's first row.
    cell = page.get_by_text(re.compile(rf"^trial {choice.number}: "))
    cell.first.wait_for()
    assert page.locator("tr", has=cell).first.inner_text().startswith(CHOICE_ATTR)
    attrs = board.get(f"/api/studies/{study_id(board, demo.name)}?after=0")["user_attrs"]
    assert attrs[0]["key"] == CHOICE_ATTR
    assert scroll_width(page, fit=1440) <= 1440
    assert overlapping_text(page, graph) == []


def test_no_figure_on_the_study_page_overlaps_its_text(demo: DemoStudy, board: Dashboard, page: Any) -> None:
    page.goto(f"{board.url}/dashboard/studies/{study_id(board, demo.name)}")
    for graph_id in (CHOICE_FIGURE_ID, *FIGURE_IDS):
        page.wait_for_selector(f'[id="user-defined-plot:{graph_id}"] .main-svg')
    overlaps = {g: overlapping_text(page, f"user-defined-plot:{g}") for g in (CHOICE_FIGURE_ID, *FIGURE_IDS)}
    assert {g: o for g, o in overlaps.items() if o} == {}
    # Every legend entry shows in the dashboard's card (a legend too tall for it scrolls and hides entries).
    hidden = {g: hidden_legend_entries(page, f"user-defined-plot:{g}") for g in (CHOICE_FIGURE_ID, *FIGURE_IDS)}
    assert {g: h for g, h in hidden.items() if h} == {}


def test_pruned_trial_shows_its_note_and_files(demo: DemoStudy, board: Dashboard, page: Any) -> None:
    page.goto(f"{board.url}/dashboard/studies/{study_id(board, demo.name)}/trials?numbers=0")
    page.get_by_text(re.compile(r"Trial 0: PRUNED, oom in decode")).first.wait_for()
    body = page.locator("body").inner_text()
    assert "out of memory" in body.lower()
    for name in ("server.log", "launch.sh", "bench.json"):
        assert page.get_by_text(name, exact=True).count() > 0, name


def test_pruned_trial_page_fits_1440_px(demo: DemoStudy, board: Dashboard, page: Any) -> None:
    page.goto(f"{board.url}/dashboard/studies/{study_id(board, demo.name)}/trials?numbers=0")
    page.get_by_text(re.compile(r"Trial 0: PRUNED")).first.wait_for()
    assert scroll_width(page, fit=1440) <= 1440


def test_params_show_as_their_step(study: optuna.Study, demo: DemoStudy, board: Dashboard, page: Any) -> None:
    """The sampled memory fraction (step 0.01) is stored and shown as 0.85, not 0.8500000000000001."""
    trials = study.get_trials(deepcopy=False)
    # Some were proposed by the sampler (Optuna marks a queued trial with the system attr fixed_params).
    assert any("fixed_params" not in t.system_attrs for t in trials)
    stored = [t.params["mem_fraction_static"] for t in trials]
    assert all(len(repr(v).split(".")[1]) <= 2 for v in stored), stored
    numbers = ",".join(str(t.number) for t in trials)
    page.goto(f"{board.url}/dashboard/studies/{study_id(board, demo.name)}/trials?numbers={numbers}")
    page.get_by_text(f"Trial {trials[-1].number} (trial_id=").first.wait_for()
    page.get_by_text(re.compile(r"^mem_fraction_static\s")).nth(len(trials) - 1).wait_for()
    shown = re.findall(r"^mem_fraction_static[ \t]+(\S+)$", page.locator("body").inner_text(), re.MULTILINE)
    assert shown == [repr(v) for v in stored]


def test_html_report_opens_with_nothing_missing(demo: DemoStudy, page: Any) -> None:
    traffic = watch(page.context, ("file://", "data:"))
    page.goto(demo.report_html.as_uri())
    page.wait_for_selector('[id="servetune-oom-map"] .scatterlayer path.point')
    assert page.locator("h2", has_text="Verdict").count() == 1
    assert page.locator("h2", has_text="Skipped and why").count() == 1
    for graph_id in FIGURE_IDS:
        assert page.locator(f'[id="{graph_id}"] .main-svg').count() > 0, graph_id
    assert page.locator("h2", has_text="How the winner was chosen").count() == 1
    assert scroll_width(page, fit=1440) <= 1440
    for graph_id in (CHOICE_FIGURE_ID, *FIGURE_IDS):
        assert overlapping_text(page, graph_id) == [], graph_id
        assert hidden_legend_entries(page, graph_id) == [], graph_id
    assert traffic.requested == [demo.report_html.as_uri()]
    assert not traffic.blocked and not traffic.failed and not traffic.bad_status
    assert not traffic.console_errors


def _rgb(hex_colour: str) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"
