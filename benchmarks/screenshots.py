"""Screenshots for the docs: every page a user is pointed to, from ``make demo``'s search.

Runs ``make demo``'s search on the simulated host (``servetune run``, the demo's space, workload and seed, on a
free port, in a temporary directory), starts optuna-dashboard and the pinned MLflow's server over it, and has
Debian's Chromium (Playwright) photograph, at 1440 px wide: the study's note in the dashboard (servetune's
choice and why), the figure of the screened configurations and the OOM map on the study page, the MLflow runs
table that servetune's link opens, the MLflow parent run, and the top of the HTML report:

    .venv/bin/python benchmarks/screenshots.py [--out docs/screenshots] [--n-trials 14]

Every figure in them comes from the simulated host (they say so).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.fixtures: the same Chromium, dashboard and MLflow server the browser tests drive

from mlflow import MlflowClient  # noqa: E402

from search.outputs.explain import CHOICE_FIGURE_ID  # noqa: E402
from search.outputs.tracking import experiment_url  # noqa: E402
from tests.fixtures.browser import chromium, dashboard, run_demo_study  # noqa: E402
from tests.fixtures.mlflow_server import MlflowServer  # noqa: E402
from tests.fixtures.ports import free_port  # noqa: E402

WIDTH = 1440
#: Milliseconds a page may take to load or show what is waited for (optuna-dashboard's 5 MB bundle and MLflow's
#: UI on a busy machine).
WAIT_MS = 120_000


def _close_assistant(page: Any) -> None:
    """MLflow 3.17 opens its "Assistant" side panel on a first visit; closed, the screenshot shows the page."""
    close = page.locator('button[aria-label="Close"]')
    if close.count():
        close.first.click()
        page.wait_for_timeout(300)


def _page(browser: Any, height: int) -> Any:
    page = browser.new_page(viewport={"width": WIDTH, "height": height})
    page.set_default_timeout(WAIT_MS)
    page.set_default_navigation_timeout(WAIT_MS)
    return page


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    parser.add_argument("--n-trials", type=int, default=14)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds the demo's search may take")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                         check=False).stdout.strip() or "unknown"
    shots: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="servetune-screenshots-") as tmp:
        demo = run_demo_study(Path(tmp), n_trials=args.n_trials, name="demo-sim-dsv4", as_demo=True,
                              timeout=args.timeout)
        print(f"ran {args.n_trials} trials of study {demo.name} on the simulated host (git {rev})")
        (Path(tmp) / "mlflow-ui").mkdir()
        shutil.copy(demo.wd / "mlruns" / "mlflow.db", Path(tmp) / "mlflow-ui" / "mlflow.db")
        server = MlflowServer(Path(tmp) / "mlflow-ui", free_port())
        server.start()
        try:
            with dashboard(demo.wd, demo.storage_url, demo.artifacts_dir) as board, chromium() as browser:
                studies = board.get("/api/studies")["study_summaries"]
                study_id = next(s["study_id"] for s in studies if s["study_name"] == demo.name)
                page = _page(browser, 1000)

                page.goto(f"{board.url}/dashboard/studies/{study_id}/note")
                page.get_by_text(f"servetune's choice for {demo.name}").first.wait_for()
                page.wait_for_timeout(500)
                shots.append(args.out / "dashboard-note.png")
                page.screenshot(path=str(shots[-1]))

                page.goto(f"{board.url}/dashboard/studies/{study_id}")
                for graph_id, name in ((CHOICE_FIGURE_ID, "dashboard-choice.png"),
                                       ("servetune-oom-map", "oom-map-dashboard.png")):
                    graph = page.locator(f'[id="user-defined-plot:{graph_id}"]')
                    graph.locator(".scatterlayer path.point").first.wait_for()
                    graph.scroll_into_view_if_needed()
                    page.wait_for_timeout(500)  # plotly's transitions
                    shots.append(args.out / name)
                    graph.locator("xpath=../..").screenshot(path=str(shots[-1]))  # the card, as the dashboard shows it

                client = MlflowClient(server.url)
                experiment = client.get_experiment_by_name(demo.name)
                assert experiment is not None
                ml = _page(browser, 1000)
                ml.goto(experiment_url(server.url, experiment.experiment_id))
                ml.get_by_role("grid").get_by_text("trial-0").first.wait_for()
                _close_assistant(ml)
                shots.append(args.out / "mlflow-runs.png")
                ml.screenshot(path=str(shots[-1]))
                parent = client.search_runs([experiment.experiment_id], "tags.`servetune.kind` = 'study'")[0]
                ml.goto(f"{server.url}/#/experiments/{experiment.experiment_id}/runs/{parent.info.run_id}"
                        "?workflowType=machine_learning")
                ml.get_by_text(f"servetune's choice for {demo.name}").first.wait_for()
                _close_assistant(ml)
                ml.wait_for_timeout(500)
                shots.append(args.out / "mlflow-parent.png")
                ml.screenshot(path=str(shots[-1]))

                report = _page(browser, 1500)
                report.goto(demo.report_html.as_uri())
                report.locator('[id="servetune-oom-map"] .scatterlayer path.point').first.wait_for()
                report.wait_for_timeout(500)
                shots.append(args.out / "report.png")
                report.screenshot(path=str(shots[-1]))
        finally:
            server.stop()
    for png in shots:
        print(f"wrote {png.relative_to(ROOT) if png.is_relative_to(ROOT) else png} ({png.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
