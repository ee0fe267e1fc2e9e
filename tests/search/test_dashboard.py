"""``servetune dashboard`` serves the study storage and its artifact store on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from optuna.artifacts import FileSystemArtifactStore, upload_artifact
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from search.trial.records import FACTS_ATTR, TrialFacts, write_facts
from tests.fixtures.mlflow_server import group_alive
from tests.fixtures.ports import free_port
from tests.fixtures.trials import build_study, standard_trials


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


@pytest.mark.slow  # starts optuna-dashboard (a few seconds)
def test_dashboard_serves_trials_with_their_artifacts(tmp_path: Path) -> None:
    artifacts = tmp_path / "servetune-artifacts"
    store = FileSystemArtifactStore(str(artifacts / "optuna-artifacts"))
    (artifacts / "optuna-artifacts").mkdir(parents=True)
    study = build_study(f"sqlite:///{tmp_path / 'servetune.db'}", "dash", standard_trials())
    # A trial recorded as the objective records one: attrs and artifacts while it runs, then PRUNED.
    pruned_trial = study.ask({"mem_fraction_static": FloatDistribution(0.6, 0.95, step=0.01)})
    write_facts(pruned_trial, TrialFacts(outcome="oom", phase="cuda_graph", log_tail="Capture cuda graph failed"))
    for name in ("server.log", "launch.sh"):
        (tmp_path / name).write_text(f"{name} of trial {pruned_trial.number}\n")
        upload_artifact(artifact_store=store, file_path=str(tmp_path / name), study_or_trial=pruned_trial)
    study.tell(pruned_trial, state=TrialState.PRUNED)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "search", "dashboard", "--port", str(port)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                studies = get(f"http://127.0.0.1:{port}/api/studies")["study_summaries"]
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
                assert time.monotonic() < deadline, "dashboard did not come up"
                time.sleep(0.3)
        assert [s["study_name"] for s in studies] == ["dash"]
        detail = get(f"http://127.0.0.1:{port}/api/studies/{studies[0]['study_id']}?after=0")
        pruned = next(t for t in detail["trials"] if t["number"] == pruned_trial.number)
        keys = {a["key"] for a in pruned["user_attrs"]}
        assert {"outcome", "phase", "role"} <= keys  # the short attrs people read in the table
        assert FACTS_ATTR not in keys  # the whole record is a system attr, which the table does not show
        assert {a["filename"] for a in pruned["artifacts"]} >= {"server.log", "launch.sh"}
        # Bound to 127.0.0.1 only (the default), not to every address: another loopback address is refused.
        with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.2", port), timeout=5):
            pass
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
        if proc.stdout is not None:
            proc.stdout.close()
    assert not group_alive(proc.pid)
