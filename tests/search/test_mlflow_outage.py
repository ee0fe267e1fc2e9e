"""After an MLflow outage the study's parent run is ended, never left RUNNING (issue 23, row 11), with a real
``mlflow server`` stopped mid-study and started again on the same port and database.

The trial logging breaks at the outage (one warning, later trials skipped); at the end of the run
:meth:`MlflowTracker.end_run` back-fills what MLflow lacks and finishes the parent run. While MLflow is still
down, ``end_run`` is one StudyError line and ``servetune sync-mlflow`` does both later.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow import MlflowClient

from runners.errors import StudyError
from search.outputs.tracking import MlflowTracker
from search.strategy.view import StudyView
from tests.fixtures.mlflow_server import MlflowServer
from tests.fixtures.ports import free_port
from tests.fixtures.trials import build_study, standard_trials

HTTP_ENV = ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")


def parent_status(url: str, tracker: MlflowTracker, name: str) -> str:
    client = MlflowClient(url)
    parents = [r for r in client.search_runs([tracker.experiment_id(name)]) if "servetune.trial" not in r.data.tags]
    assert len(parents) == 1, parents
    return str(parents[0].info.status)


@pytest.mark.slow
def test_the_parent_run_is_ended_after_an_mlflow_outage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in HTTP_ENV:
        monkeypatch.delenv(key, raising=False)
    server = MlflowServer(tmp_path / "mlflow", free_port())
    server.start()
    try:
        study = build_study(f"sqlite:///{tmp_path}/s.db", "outage", standard_trials(tmp_path / "artifacts"))
        tracker = MlflowTracker(server.url)
        tracker.check("outage")  # what a run does first: the experiment and the parent run exist
        callback = tracker.callback()
        callback(StudyView.of(study), study.trials[0])
        assert callback.failures == 0 and parent_status(server.url, tracker, "outage") == "RUNNING"

        server.stop()  # the outage
        callback(StudyView.of(study), study.trials[1])
        assert callback.broken
        with pytest.raises(StudyError, match="unreachable"):
            tracker.end_run(StudyView.of(study), callback)  # still down: one line, nothing half-done

        server.start()  # back, same database
        tracker.end_run(StudyView.of(study), callback)
        assert parent_status(server.url, tracker, "outage") == "FINISHED"
        finished = [t for t in study.trials if t.state.is_finished()]
        assert sorted(tracker.trial_runs("outage")) == [t.number for t in finished], "every trial back-filled"
    finally:
        server.stop()
