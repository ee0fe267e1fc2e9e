"""The browser tests' fixtures: one finished demo-like study on the simulated host (with its MLflow store),
optuna-dashboard and an MLflow server over it, Debian's Chromium, and a fresh 1440-px page per test whose
screenshot is kept under ``test-artifacts/browser/`` when the test fails (a test's call report is kept on its
item for that)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest

from search.storage import load, open_storage
from tests.fixtures.browser import Dashboard, DemoStudy, chromium, dashboard, run_demo_study
from tests.fixtures.mlflow_server import MlflowServer
from tests.fixtures.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "test-artifacts" / "browser"
#: The width the pages must fit without a horizontal scroll bar (a laptop's browser window).
WIDTH = 1440


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoStudy:
    return run_demo_study(tmp_path_factory.mktemp("browser-demo"))


@pytest.fixture(scope="session")
def study(demo: DemoStudy) -> optuna.Study:
    return load(open_storage(demo.storage_url, heartbeat=False, must_exist=True), demo.name)


@pytest.fixture(scope="session")
def board(demo: DemoStudy) -> Iterator[Dashboard]:
    with dashboard(demo.wd, demo.storage_url, demo.artifacts_dir) as running:
        yield running


@pytest.fixture(scope="session")
def mlflow_ui(demo: DemoStudy, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """``mlflow server`` (the UI of the pinned MLflow) over a copy of the demo's MLflow store; the runs'
    artifacts stay where the demo logged them (file URIs)."""
    root = tmp_path_factory.mktemp("mlflow-ui")
    shutil.copy(demo.wd / "mlruns" / "mlflow.db", root / "mlflow.db")
    server = MlflowServer(root, free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    try:
        with chromium() as b:
            yield b
    except RuntimeError as exc:
        pytest.fail(str(exc))


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh page, 1440 px wide; when the test fails, a screenshot of it is kept under test-artifacts/browser/."""
    context = browser.new_context(viewport={"width": WIDTH, "height": 1000})
    pg = context.new_page()
    pg.set_default_timeout(30_000)
    pg.set_default_navigation_timeout(90_000)  # optuna-dashboard's 5 MB bundle on a loaded machine
    yield pg
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        pg.screenshot(path=str(SCREENSHOTS / f"{request.node.name}.png"), full_page=True)
    context.close()
