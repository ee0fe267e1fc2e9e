"""The report's verdict, skipped and trial sections; the self-contained HTML report; where it is attached
(optuna-dashboard study artifact, MLflow parent run); the CLI around it (report --format, status, --version)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient

from search.outputs.explain import CHOICE_FIGURE_ID
from search.outputs.figures import FIGURE_IDS
from search.outputs.html import publish, report_html
from search.outputs.report import report_markdown
from search.outputs.status import study_status
from search.outputs.tracking import MlflowTracker
from search.storage import artifact_store
from search.strategy.view import StudyView
from tests.fixtures.trials import build_study, standard_trials


def section(text: str, title: str) -> str:
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def test_verdict(study: optuna.Study) -> None:
    verdict = section(report_markdown(StudyView.of(study)), "Verdict")
    assert "**Best: trial 1**, `output_throughput` = 2400.0 tok/s at concurrency 16:" in verdict
    assert "`cuda_graph_max_bs=256`, `mem_fraction_static=0.88`" in verdict
    assert "**Confirmed by:** one benchmark sweep on host `gpu-a`." in verdict
    assert "**Headroom:** 0.82 GiB free per GPU after CUDA graph capture (**thin**: below 2 GiB)." in verdict
    # Trial 2 (0.93, 256) is the nearest death to the best (0.88, 256): it died in graph capture.
    # It describes the chosen configuration: what pressing harder on its own memory knobs did.
    assert "**What bound it:** the CUDA graph pool (graph capture ran out of memory): at " \
           "`mem_fraction_static=0.88`, `cuda_graph_max_bs=256` it survived with 0.82 GiB free after CUDA graph " \
           "capture; pressing harder on memory, trial 2 (`mem_fraction_static=0.93`, `cuda_graph_max_bs=256`) " \
           "died there." in verdict


def test_skipped_and_all_trials(study: optuna.Study) -> None:
    text = report_markdown(StudyView.of(study))
    skipped = section(text, "Skipped and why")
    assert "| #4 | FAIL | infrastructure trouble (host_busy): not counted, the sampler learns nothing from it; " \
           "GPU 0 on gpu-b is busy" in skipped
    assert "| #5 | RUNNING | still running when the report was made |" in skipped
    assert "#0 |" not in skipped
    table = section(text, "All trials")
    assert "| # | state | outcome | value | `mem_fraction_static` | `cuda_graph_max_bs` | `nccl.NCCL_ALGO` |" in table
    assert "| #2 | PRUNED | oom in cuda_graph | - | 0.93 | 256 | unset | - | CUDA out of memory" in table
    assert len(re.findall(r"^\| #\d+ \|", table, re.MULTILINE)) == 6


class _Resources(HTMLParser):
    """Every URL an HTML page would load (scripts, styles, images, frames, icons)."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.ids: list[str] = []
        self.inline_script_chars = 0
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("id"):
            self.ids.append(str(found["id"]))
        for key in ("src", "href"):
            if found.get(key) and tag in ("script", "link", "img", "iframe", "embed", "source"):
                self.urls.append(str(found[key]))
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.inline_script_chars += len(data)


def test_html_report_is_self_contained(study: optuna.Study) -> None:
    page = report_html(StudyView.of(study))
    parser = _Resources()
    parser.feed(page)
    assert parser.urls == ["data:,"]  # the inline favicon, nothing else to fetch
    assert parser.inline_script_chars > 1_000_000  # plotly.js itself
    assert set(FIGURE_IDS) <= set(parser.ids)
    assert "<h2>Verdict</h2>" in page and "<table>" in page
    assert page.index("<h2>Verdict</h2>") < page.index('id="servetune-oom-map"') < page.index(
        "<h2>All trials</h2>")


@pytest.mark.slow
def test_publish_attaches_the_report_to_the_study_and_mlflow(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from optuna_dashboard._custom_plot_data import get_plotly_graph_objects
    from optuna_dashboard.artifact._backend import list_study_artifacts

    monkeypatch.chdir(tmp_path)
    st = build_study(f"sqlite:///{tmp_path / 'r.db'}", "r", standard_trials())
    (tmp_path / "artifacts").mkdir()
    published = publish(StudyView.of(st), tmp_path / "out", artifact_store=artifact_store(tmp_path / "artifacts"))
    assert published.markdown.read_text() == report_markdown(StudyView.of(st))
    assert published.html.read_text().startswith("<!DOCTYPE html>")
    attrs = st._storage.get_study_system_attrs(st._study_id)
    assert sorted(get_plotly_graph_objects(attrs)) == sorted([CHOICE_FIGURE_ID, *FIGURE_IDS])
    assert [a["filename"] for a in list_study_artifacts(attrs)] == ["report.html"]

    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}", str(tmp_path / "mlruns"))
    tracker.sync(st)
    tracker.finish_study(StudyView.of(st), figures=published.figures, report=published.html)
    client = MlflowClient(tracker.tracking_uri)
    experiment_id = tracker.experiment_id("r")
    parent = client.search_runs([experiment_id], "tags.`servetune.kind` = 'study'")[0]
    names = sorted(f.path for d in ("figures", "report") for f in client.list_artifacts(parent.info.run_id, d))
    assert names == sorted([f"figures/{g}.html" for g in (CHOICE_FIGURE_ID, *FIGURE_IDS)] + ["report/report.html"])
    figure_page = Path(client.download_artifacts(parent.info.run_id, "figures/servetune-oom-map.html",
                                                 str(tmp_path / "dl")))
    parser = _Resources()
    parser.feed(figure_page.read_text())
    assert parser.urls == [] and parser.inline_script_chars > 1_000_000  # opens without the network


def test_status_clock_stops_with_the_study(tmp_path: Path) -> None:
    st = build_study(f"sqlite:///{tmp_path / 's.db'}", "s", standard_trials()[:5])  # no RUNNING trial
    status = study_status(StudyView.of(st))
    assert status.state == "idle"
    assert status.elapsed_s == 19 * 60 + 4  # first start 22:00:00 to last end 22:19:04, whatever now is


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "search", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, check=False)


@pytest.mark.slow
def test_cli_report_status_version(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    build_study(url, "c", standard_trials())
    out = _cli("report", "--study", "c", "--storage", url, "--format", "html", "-o", "r.html", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    md = _cli("report", "--study", "c", "--storage", url, cwd=tmp_path)
    assert md.stdout.startswith("# servetune report: c\n")
    bad = _cli("report", "--study", "c", "--storage", url, "--format", "pdf", cwd=tmp_path)
    assert bad.returncode == 1 and bad.stderr == "servetune: error: --format: 'pdf' is not one of md, html\n"
    table = _cli("status", "--study", "c", "--storage", url, cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert "{" not in table.stdout and "best: trial 1" in table.stdout and "trials: search " in table.stdout
    as_json = json.loads(_cli("status", "--study", "c", "--storage", url, "--json", cwd=tmp_path).stdout)
    assert as_json["best"]["number"] == 1 and as_json["state"] == "running"
    version = _cli("--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("servetune ")
