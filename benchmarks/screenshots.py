"""Screenshots for the README: the OOM map in optuna-dashboard and the top of the HTML report.

Runs ``make demo``'s search on the simulated host (``servetune run``, the demo's space, workload and seed, on a
free port, in a temporary directory), starts optuna-dashboard over it, and has Debian's Chromium
(Playwright) photograph the study page's OOM map and the report:

    .venv/bin/python benchmarks/screenshots.py [--out docs/screenshots] [--n-trials 14]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.fixtures.browser: the same Chromium and dashboard the browser test drives

from tests.fixtures.browser import chromium, dashboard, run_demo_study  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    parser.add_argument("--n-trials", type=int, default=14)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="servetune-screenshots-") as tmp:
        demo = run_demo_study(Path(tmp), n_trials=args.n_trials, name="demo-sim-dsv4", as_demo=True)
        print(f"ran {args.n_trials} trials of study {demo.name} on the simulated host")
        with dashboard(demo.wd, demo.storage_url, demo.artifacts_dir) as board, chromium() as browser:
            studies = board.get("/api/studies")["study_summaries"]
            study_id = next(s["study_id"] for s in studies if s["study_name"] == demo.name)
            page = browser.new_page(viewport={"width": 1900, "height": 1100})
            page.goto(f"{board.url}/dashboard/studies/{study_id}")
            graph = page.locator('[id="user-defined-plot:servetune-oom-map"]')
            graph.locator(".scatterlayer path.point").first.wait_for(timeout=30_000)
            graph.scroll_into_view_if_needed()
            page.wait_for_timeout(500)  # plotly's transitions
            dashboard_png = args.out / "oom-map-dashboard.png"
            # The card around the graph, as the dashboard shows it.
            graph.locator("xpath=../..").screenshot(path=str(dashboard_png))
            report = browser.new_page(viewport={"width": 1200, "height": 1500})
            report.goto(demo.report_html.as_uri())
            report.locator('[id="servetune-oom-map"] .scatterlayer path.point').first.wait_for(timeout=30_000)
            report.wait_for_timeout(500)
            report_png = args.out / "report.png"
            report.screenshot(path=str(report_png))
        for png in (dashboard_png, report_png):
            print(f"wrote {png.relative_to(ROOT) if png.is_relative_to(ROOT) else png} "
                  f"({png.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
