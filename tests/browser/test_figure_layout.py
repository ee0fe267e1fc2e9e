"""servetune's figures drawn by plotly.js in a real browser (Debian's Chromium) at the widths they are shown
at: an optuna-dashboard card (560 x 450) and the HTML report (1150 x 560). Nothing overlaps: the legend
neither an axis title nor a tick label, no two titles each other, every legend entry shows (a legend too tall
scrolls and hides entries), and everything stays inside the figure.

The pages come from the session's ``browser`` fixture (``tests/browser/conftest.py``): a second sync Playwright
started in the same worker would fail, as Playwright's sync API refuses to run inside its own running loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState
from plotly.offline import get_plotlyjs

from search.outputs.figures import study_figures
from search.spaces import load_checked_space
from search.strategy.view import StudyView
from search.trial.records import FACTS_ATTR
from tests.fixtures.trials import build_study, level, make_trial

pytestmark = [pytest.mark.browser]

ROOT = Path(__file__).resolve().parents[2]
SIZES = {"dashboard card": (560, 450), "report": (1150, 560)}

# Axis titles, tick labels, subplot and figure titles, the legend: what must not overlap.
BOXES = """(id) => {
  const fig = document.getElementById(id);
  const box = (e) => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const all = (sel) => [...fig.querySelectorAll(sel)].filter(e => e.getBoundingClientRect().width > 0);
  const root = fig.querySelector('.main-svg').getBoundingClientRect();
  return {
    figure: [root.left, root.top, root.right, root.bottom],
    legend: all('.legend .bg').map(box),
    entries: all('.legend .traces').map(e => [e.textContent, box(e)]),
    titles: all('.g-xtitle text, .g-x2title text, .g-ytitle text, .g-y2title text, .annotation-text, .gtitle')
              .map(e => [e.textContent, box(e)]),
    ticks: all('.xtick text, .x2tick text, .ytick text, .y2tick text').map(box),
  };
}"""


def _launch(mfs: float, cgbs: int, value: float, start: float, **tags: Any) -> optuna.trial.FrozenTrial:
    trial = make_trial(state=TrialState.COMPLETE, mfs=mfs, cgbs=cgbs, value=value, start_min=start,
                       simulated=True, levels=[level(1, value / 10), level(16, value)],
                       memory={"gpu_total_gib": 79.19, "avail_before_weights_gib": 75.0, "weights_gib": 15.3,
                               "kv_gib": mfs * 75.0 - 15.8, "graph_gib": 2.4, "free_after_capture_gib":
                               (1 - mfs) * 75.0 - 2.4, "sim_speed": 100, "smi_peak_used_mib": 70000.0})
    trial.system_attrs = {**trial.system_attrs, FACTS_ATTR: {**trial.system_attrs[FACTS_ATTR], **tags}}
    return trial


@pytest.fixture(scope="module")
def view(tmp_path_factory: pytest.TempPathFactory) -> StudyView:
    trials = [_launch(0.70, 64, 2000.0, 0), _launch(0.80, 128, 2100.0, 5), _launch(0.84, 256, 2300.0, 10),
              _launch(0.80, 128, 2150.0, 15, confirmation_of=1), _launch(0.84, 256, 2000.0, 20, confirmation_of=2),
              make_trial(state=TrialState.PRUNED, mfs=0.90, cgbs=128, outcome="oom", phase="decode", start_min=25,
                         simulated=True, reason="CUDA out of memory in decode: tried to allocate 3.94 GiB",
                         memory={"gpu_total_gib": 79.19, "avail_before_weights_gib": 75.0, "weights_gib": 15.3,
                                 "kv_gib": 51.7, "graph_gib": 2.4, "free_after_capture_gib": 5.1,
                                 "tried_to_allocate_gib": 3.94, "free_at_oom_gib": 2.8,
                                 "smi_peak_used_mib": 18000.0})]
    study = build_study(f"sqlite:///{tmp_path_factory.mktemp('layout') / 'f.db'}", "layout", trials)
    return StudyView.of(study, space=load_checked_space(ROOT / "spaces" / "demo-sim.yaml"))


def _overlap(a: list[float], b: list[float]) -> float:
    """The area two boxes (left, top, right, bottom) share."""
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    return w * h if w > 0 and h > 0 else 0.0


@pytest.mark.parametrize("size", list(SIZES))
def test_nothing_overlaps_at_the_dashboard_and_report_widths(view: StudyView, page: Any, size: str,
                                                             tmp_path: Path) -> None:
    width, height = SIZES[size]
    figures = study_figures(view)
    assert any(t.type == "contour" for t in figures["servetune-oom-map"].data)  # the model's boundary is drawn
    # One page holds every figure (plotly.js, 4.6 MB, is parsed once), each in its own box of the given size.
    page_file = tmp_path / "figures.html"
    page_file.write_text(f"<html><head><script>{get_plotlyjs()}</script></head><body style='margin:0'>" + "".join(
        f"<div id='box-{name}'>" + fig.to_html(full_html=False, include_plotlyjs=False, default_width=f"{width}px",
                                               default_height=f"{height}px") + "</div>"
        for name, fig in figures.items()) + "</body></html>")
    page.goto(page_file.as_uri())
    for name in figures:
        page.wait_for_selector(f"#box-{name} .main-svg .legend")
    for name in figures:
        boxes = page.evaluate(BOXES, f"box-{name}")
        fig_box = boxes["figure"]
        for legend in boxes["legend"]:
            assert _overlap(legend, fig_box) == pytest.approx((legend[2] - legend[0]) * (legend[3] - legend[1])), \
                f"{name} at {size}: the legend leaves the figure"
            for text, title in boxes["titles"]:
                assert _overlap(legend, title) == 0, f"{name} at {size}: the legend covers {text!r}"
            for tick in boxes["ticks"]:
                assert _overlap(legend, tick) == 0, f"{name} at {size}: the legend covers a tick label"
            for text, entry in boxes["entries"]:  # a legend too tall for the figure scrolls: entries hidden
                assert _overlap(legend, entry) == pytest.approx((entry[2] - entry[0]) * (entry[3] - entry[1]),
                                                                abs=2.0), f"{name} at {size}: {text!r} is cut off"
        titles = boxes["titles"]
        for i, (text_a, a) in enumerate(titles):
            for text_b, b in titles[i + 1:]:
                assert _overlap(a, b) < 1, f"{name} at {size}: {text_a!r} overlaps {text_b!r}"
