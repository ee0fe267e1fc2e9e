"""In a real browser (Debian's Chromium through Playwright): optuna-dashboard over a finished demo-like study
on the simulated host shows servetune's figures, a PRUNED trial's note and files; the HTML report opens with
nothing missing and no network. Screenshots of failures go to ``test-artifacts/browser/``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState

from search.outputs.figures import FIGURE_IDS, OUTCOME_CLASSES
from search.storage import load, open_storage
from tests.fixtures.browser import Dashboard, DemoStudy, chromium, dashboard, run_demo_study, watch

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "test-artifacts" / "browser"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoStudy:
    return run_demo_study(tmp_path_factory.mktemp("browser-demo"))


@pytest.fixture(scope="module")
def study(demo: DemoStudy) -> optuna.Study:
    return load(open_storage(demo.storage_url, heartbeat=False, must_exist=True), demo.name)


@pytest.fixture(scope="module")
def board(demo: DemoStudy) -> Iterator[Dashboard]:
    with dashboard(demo.wd, demo.storage_url, demo.artifacts_dir) as running:
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        with chromium() as b:
            yield b
    except RuntimeError as exc:
        pytest.fail(str(exc))


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh page; when the test fails, a screenshot of it is kept under test-artifacts/browser/."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    pg.set_default_timeout(30_000)
    yield pg
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        pg.screenshot(path=str(SCREENSHOTS / f"{request.node.name}.png"), full_page=True)
    context.close()


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
    assert sorted(g["id"] for g in detail["plotly_graph_objects"]) == sorted(FIGURE_IDS)
    assert "report.html" in [a["filename"] for a in detail["artifacts"]]
    # MLflow: the parent run holds the figures and the report; trial runs name their levels.
    client = MlflowClient(f"sqlite:///{demo.wd / 'mlruns' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(demo.name)
    assert experiment is not None and experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    parent = client.search_runs([experiment.experiment_id], "tags.`servetune.kind` = 'study'")[0]
    files = sorted(f.path for d in ("figures", "report") for f in client.list_artifacts(parent.info.run_id, d))
    assert files == sorted([f"figures/{g}.html" for g in FIGURE_IDS] + ["report/report.html"])
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


def test_pruned_trial_shows_its_note_and_files(demo: DemoStudy, board: Dashboard, page: Any) -> None:
    page.goto(f"{board.url}/dashboard/studies/{study_id(board, demo.name)}/trials?numbers=0")
    page.get_by_text(re.compile(r"Trial 0: PRUNED, oom in decode")).first.wait_for()
    body = page.locator("body").inner_text()
    assert "out of memory" in body.lower()
    for name in ("server.log", "launch.sh", "bench.json"):
        assert page.get_by_text(name, exact=True).count() > 0, name


def test_html_report_opens_with_nothing_missing(demo: DemoStudy, page: Any) -> None:
    traffic = watch(page.context, ("file://", "data:"))
    page.goto(demo.report_html.as_uri())
    page.wait_for_selector('[id="servetune-oom-map"] .scatterlayer path.point')
    assert page.locator("h2", has_text="Verdict").count() == 1
    assert page.locator("h2", has_text="Skipped and why").count() == 1
    for graph_id in FIGURE_IDS:
        assert page.locator(f'[id="{graph_id}"] .main-svg').count() > 0, graph_id
    assert traffic.requested == [demo.report_html.as_uri()]
    assert not traffic.blocked and not traffic.failed and not traffic.bad_status
    assert not traffic.console_errors


def _rgb(hex_colour: str) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"
