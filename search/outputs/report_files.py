"""The morning report as a run's output (:mod:`search.outputs.sink`): ``report.md`` and ``report.html`` in the
study's folder of the artifacts directory, the dashboard's figures and choice notes, the HTML as a study artifact
(:func:`search.outputs.html.publish`)."""

from __future__ import annotations

from optuna.trial import FrozenTrial

from search.outputs.html import publish
from search.outputs.sink import Publication, SinkContext
from search.storage import artifact_store
from search.strategy.view import StudyView

__all__ = ["ReportSink"]


class ReportSink:
    """Writes the report once, when the run publishes; the sinks after it get its files and figures in the
    :class:`~search.outputs.sink.Publication`. Raises ConfigError (one line) when a file cannot be written."""

    name = "report"

    @classmethod
    def open(cls, context: SinkContext) -> ReportSink:
        return cls()

    def on_trial(self, view: StudyView, trial: FrozenTrial) -> None:
        pass

    def close(self) -> None:
        pass

    def publish(self, view: StudyView, publication: Publication) -> None:
        if publication.files_refused:  # the disk that refused a trial's files would refuse the report too
            return
        published = publish(view, publication.directory, artifact_store=artifact_store(publication.artifacts_dir))
        publication.report_markdown, publication.report_html = published.markdown, published.html
        publication.figures = published.figures
