"""The report as one self-contained HTML page (:func:`report_html`: no network, no other file, plotly.js
inlined) with the study's figures after the verdict, and :func:`publish`: both reports written next to the
trial artifacts, the dashboard figures refreshed and the HTML attached to the study (an optuna-dashboard study
artifact), all from one :class:`~search.strategy.view.StudyView`."""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from optuna.artifacts import upload_artifact

from search.files import write_file
from search.outputs.explain import CHOICE_FIGURE_ID, choice_figure
from search.outputs.figures import Boundary, save_to_dashboard, study_figures
from search.outputs.notes import write_choice_notes
from search.outputs.report import report_markdown, report_parts
from search.strategy.view import StudyView

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from search._optuna_compat import ArtifactStore

__all__ = ["Published", "publish", "report_html"]

_CSS = """
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; }
th { background: #f3f3f3; }
blockquote { border-left: 4px solid #e0a000; margin: 0.5em 0; padding: 0.3em 1em; background: #fff8e0; }
code { background: #f3f3f3; padding: 0 0.2em; }
.figure { margin: 1em 0 2em; }
"""


def report_html(view: StudyView, *, figures: dict[str, go.Figure] | None = None,
                boundary: Boundary | None = None) -> str:
    """The report as one self-contained HTML page: the verdict, the figures (``figures``, default
    :func:`search.outputs.figures.study_figures`), then the rest of :func:`report_markdown`. plotly.js is inlined, so
    the page loads nothing from anywhere."""
    import markdown
    from plotly.offline import get_plotlyjs

    figures = figures if figures is not None else _figures(view, boundary)
    head, body = report_parts(view)

    def render(lines: list[str]) -> str:
        return markdown.markdown("\n".join(lines), extensions=["tables"], output_format="html")

    config = {"displaylogo": False, "responsive": True}
    divs = ['<div class="figure">'
            + fig.to_html(full_html=False, include_plotlyjs=False, div_id=graph_id, config=config,
                          default_height="560px") + "</div>"
            for graph_id, fig in figures.items()]
    title = html.escape(f"servetune report: {view.name}")
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        # An inline favicon: without one the browser asks the file's folder for favicon.ico.
        '<link rel="icon" href="data:,">',
        f"<title>{title}</title>", f"<style>{_CSS}</style>",
        f'<script type="text/javascript">{get_plotlyjs()}</script>', "</head>", "<body>",
        render(head), "<h2>Figures</h2>", *divs, render(body), "</body>", "</html>", "",
    ])


def _figures(view: StudyView, boundary: Boundary | None) -> dict[str, go.Figure]:
    """The screened configurations' figure first, then :func:`search.outputs.figures.study_figures`."""
    return {CHOICE_FIGURE_ID: choice_figure(view), **study_figures(view, boundary=boundary)}


@dataclass(frozen=True)
class Published:
    """What :func:`publish` wrote: the two report files and the figures it drew."""

    markdown: Path
    html: Path
    figures: dict[str, go.Figure]


def publish(view: StudyView, directory: Path, *, artifact_store: ArtifactStore | None = None,
            boundary: Boundary | None = None) -> Published:
    """Write ``report.md`` and ``report.html`` into ``directory``, refresh the dashboard figures (the
    screened configurations first, :func:`~search.outputs.explain.choice_figure`), write the study's note
    (servetune's choice and why) and the notes of the chosen trial and of the one Optuna calls best, and (with
    an ``artifact_store``) attach the HTML report to the study as an optuna-dashboard study artifact.

    Raises ConfigError when a file cannot be written (a full disk, a directory in the way)."""
    figures = _figures(view, boundary)
    md_path, html_path = directory / "report.md", directory / "report.html"
    write_file(md_path, report_markdown(view), parents=True)
    write_file(html_path, report_html(view, figures=figures))
    save_to_dashboard(view.study, figures)
    write_choice_notes(view)
    if artifact_store is not None:
        upload_artifact(artifact_store=artifact_store, file_path=str(html_path), study_or_trial=view.study,
                        mimetype="text/html", encoding="utf-8")
    return Published(markdown=md_path, html=html_path, figures=figures)
