"""MLflow tracking against a real SQLite store and a real ``mlflow server`` on loopback.

One child run per finished trial with params, per-level metrics and tags; logging and ``sync`` are
idempotent; a callback that cannot reach MLflow never stops the study, and ``sync`` back-fills afterwards.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pytest
from mlflow import MlflowClient
from mlflow.entities import Run
from mlflow.environment_variables import MLFLOW_HTTP_REQUEST_MAX_RETRIES, MLFLOW_HTTP_REQUEST_TIMEOUT
from optuna.artifacts import FileSystemArtifactStore
from optuna.trial import TrialState

from runners.errors import StudyError
from runners.telemetry import FailureKind
from search.outputs.tracking import (
    HTTP_ENV_DEFAULTS,
    RECORD_ARTIFACT,
    MlflowTracker,
    SyncResult,
    experiment_url,
    record_document,
    run_name,
    run_status,
    shared_view,
    simulated,
)
from search.strategy.view import StudyView
from search.trial.records import FACTS_ATTR, TrialFacts
from tests.fixtures.mlflow_server import MlflowServer
from tests.fixtures.ports import free_port
from tests.fixtures.trials import (
    artifact_files,
    build_study,
    launch_config,
    level,
    make_trial,
    optuna_callback,
    standard_trials,
    store_artifacts,
)

#: The trial's files, and the record servetune writes beside them (``trial.json``).
ARTIFACTS = ["bench.json", "launch.sh", "nvidia-smi.csv", "server.log", "trial.json"]
HTTP_ENV = ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")


@dataclass
class Local:
    root: Path
    tracker: MlflowTracker
    client: MlflowClient
    store: FileSystemArtifactStore
    storage: str


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    """The default tracker (``sqlite:///mlruns/mlflow.db``, artifacts in ``mlruns/``) in a fresh directory."""
    root = tmp_path_factory.mktemp("tracking")
    store = FileSystemArtifactStore(str(root / "optuna-artifacts"))
    (root / "optuna-artifacts").mkdir()
    with pytest.MonkeyPatch.context() as mp:
        # NOTE: the default URI is relative to the working directory, as it is for `servetune run`.
        mp.chdir(root)
        tracker = MlflowTracker(optuna_artifact_store=store)
        tracker.experiment_id("warm-up")  # creates mlruns/ and the MLflow tables once for the module
        client = MlflowClient(tracker.tracking_uri)
        yield Local(root, tracker, client, store, f"sqlite:///{root / 'optuna.db'}")


def runs_by_trial(tracker: MlflowTracker, name: str) -> dict[int, Run]:
    return tracker.trial_runs(name)


def artifact_names(client: MlflowClient, run: Run) -> list[str]:
    return sorted(f.path for f in client.list_artifacts(run.info.run_id))


def _record(client: MlflowClient, run: Run, into: Path) -> Any:
    """The run's ``trial.json``, downloaded as a user would."""
    into.mkdir(parents=True, exist_ok=True)
    return json.loads(Path(client.download_artifacts(run.info.run_id, RECORD_ARTIFACT, str(into))).read_text())


def test_default_locations(local: Local) -> None:
    assert local.tracker.tracking_uri == "sqlite:///mlruns/mlflow.db"
    assert (local.root / "mlruns" / "mlflow.db").is_file()
    assert local.tracker.artifact_location == (local.root / "mlruns" / "artifacts").as_uri()
    assert MlflowTracker("http://127.0.0.1:5000").artifact_location is None  # the server's own default
    assert MlflowTracker("http://127.0.0.1:5000", "/data/art").artifact_location == "file:///data/art"


def test_one_child_run_per_trial(local: Local) -> None:
    study = build_study(local.storage, "qwen-log", standard_trials(local.root / "artifacts" / "qwen-log"))
    tracker, client = local.tracker, local.client
    finished = [t for t in study.trials if t.state.is_finished()]
    assert [tracker.log_trial("qwen-log", t) for t in study.trials] == [True] * 5 + [False]  # #5 RUNNING
    runs = runs_by_trial(tracker, "qwen-log")
    assert sorted(runs) == [t.number for t in finished]

    experiment = client.get_experiment(tracker.experiment_id("qwen-log"))
    assert experiment.name == "qwen-log"
    # MLflow 3's UI opens it in the classic runs view; the description says the units.
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert "tokens/s" in experiment.tags["mlflow.note.content"]
    assert experiment.artifact_location == (local.root / "mlruns" / "artifacts").as_uri()
    parents = client.search_runs([experiment.experiment_id], "tags.`servetune.kind` = 'study'")
    assert len(parents) == 1 and parents[0].data.tags["servetune.study"] == "qwen-log"
    parent_id = parents[0].info.run_id

    ok = runs[0]
    assert ok.info.status == "FINISHED" and ok.info.run_name == "trial-0"
    assert ok.data.params == {
        "mem_fraction_static": "0.8", "cuda_graph_max_bs": "128", "nccl.NCCL_ALGO": "Ring",
        "fixed_args": "--tp 4 --trust-remote-code --moe-runner-backend triton", "engine": "sglang",
        "engine_version": "0.5.10", "host": "gpu-a", "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_count": "4",
        "model_path": "/models/Qwen3-30B-A3B",
        # What the trial was given, not what it measured: params, so that MLflow draws no chart of a constant.
        "mem.gpu_total_gib": "79.19", "mem.weights_gib": "15.3",
    }
    assert not [k for k in ok.data.metrics if k in ("mem.gpu_total_gib", "mem.weights_gib")]
    assert not [k for k in ok.data.metrics if k.endswith((".burstiness", ".seed", ".time_scale"))]
    tags = ok.data.tags
    assert tags["mlflow.parentRunId"] == parent_id
    assert {k: tags[k] for k in ("servetune.study", "servetune.trial", "servetune.state", "servetune.outcome",
                                 "engine", "servetune.simulated")} == {
        "servetune.study": "qwen-log", "servetune.trial": "0", "servetune.state": "COMPLETE",
        "servetune.outcome": "ok", "engine": "sglang", "servetune.simulated": "false"}
    assert "servetune.oom_phase" not in tags
    assert tags["servetune.role"] == "search"
    # The run's description is the trial's dashboard note.
    assert tags["mlflow.note.content"].startswith("## Trial 0: COMPLETE")
    # Each level's figures under their own names: a row of the runs table never mixes levels.
    assert {k: v for k, v in ok.data.metrics.items() if k.endswith(("output_throughput", "p99_ttft_ms",
                                                                      "mean_tpot_ms"))} == {
        "c1.output_throughput": 180.0, "c16.output_throughput": 2100.0, "c1.p99_ttft_ms": 90.0,
        "c16.p99_ttft_ms": 1440.0, "c1.mean_tpot_ms": 5.25, "c16.mean_tpot_ms": 9.0}
    assert "output_throughput" not in ok.data.metrics
    assert ok.data.metrics["mem.free_after_capture_gib"] == 4.1
    assert ok.data.metrics["mem.kv_tokens"] == 380000
    assert ok.data.metrics["objective"] == 2100.0
    # The objective again, named by level and unit so that MLflow's runs table (metric columns in JavaScript's
    # default sort order) shows it first.
    assert ok.data.metrics["Objective.c16.output_throughput_tok_s"] == 2100.0
    assert sorted(ok.data.metrics)[0] == "Objective.c16.output_throughput_tok_s"
    primary = client.get_experiment(experiment.experiment_id).tags["mlflow.experiment.primaryMetric.name"]
    assert primary == "Objective.c16.output_throughput_tok_s"  # the metric MLflow's charts view puts first
    assert artifact_names(client, ok) == ARTIFACTS
    # The trial's whole record as one JSON artifact: Optuna's facts and the servetune.facts system attr.
    record = _record(client, ok, local.root / "download-0")
    assert record == json.loads(json.dumps(record_document(finished[0]), default=str))
    assert record["number"] == 0 and record["state"] == "COMPLETE" and record["values"] == [2100.0]
    assert record["params"] == {"mem_fraction_static": 0.8, "cuda_graph_max_bs": 128, "nccl.NCCL_ALGO": "Ring"}
    assert record[FACTS_ATTR] == json.loads(json.dumps(finished[0].system_attrs[FACTS_ATTR]))
    assert record[FACTS_ATTR]["gpu_name"] == "NVIDIA H100 80GB HBM3" and len(record[FACTS_ATTR]["levels"]) == 2

    oom = runs[2]
    # A launch that died is FAILED (MLflow's KILLED reads as "someone stopped it"); what happened is in its name.
    assert oom.info.status == "FAILED" and oom.info.run_name == "trial-2 oom"
    assert oom.data.tags["servetune.state"] == "PRUNED"
    assert oom.data.tags["servetune.outcome"] == "oom"
    assert oom.data.tags["servetune.oom_phase"] == "cuda_graph"
    assert oom.data.metrics["mem.tried_to_allocate_gib"] == 3.94
    assert "objective" not in oom.data.metrics
    assert not [k for k in oom.data.metrics if k.startswith("Objective")]
    assert runs[3].data.tags["servetune.oom_phase"] == "decode"
    # Trial 3 died at C=16: that level served no request, so only its counts are there, no throughput 0.
    died = runs[3].data.metrics
    assert died["c1.failed"] == 0.0 and died["c16.failed"] == 64.0 and died["c16.completed"] == 0.0
    assert died["c1.output_throughput"] == 185.0
    assert not [k for k in died if k.startswith("c16.") and k not in ("c16.completed", "c16.failed")]

    fail = runs[4]
    assert fail.info.status == "FAILED" and fail.data.tags["servetune.outcome"] == "host_busy"
    assert fail.data.params["host"] == "gpu-b" and "engine_version" not in fail.data.params
    assert fail.data.tags["servetune.artifacts"] == "none recorded"
    # A trial without files still has its record.
    assert artifact_names(client, fail) == [RECORD_ARTIFACT]
    assert _record(client, fail, local.root / "download-4")[FACTS_ATTR]["outcome"] == "host_busy"

    # Idempotent: logging again adds nothing, sync finds everything present.
    assert [tracker.log_trial("qwen-log", t) for t in finished] == [False] * 5
    assert tracker.sync(study) == SyncResult(added=0, present=5)
    assert len(client.search_runs([experiment.experiment_id], "tags.`servetune.kind` = 'trial'")) == 5

    tracker.finish_study(StudyView.of(study))
    parent = client.get_run(parent_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics["best_value"] == 2400.0 and parent.data.tags["servetune.best_trial"] == "1"
    assert sorted(parent.data.metrics)[0] == "Best.c16.output_throughput_tok_s"
    assert parent.data.metrics["Best.c16.output_throughput_tok_s"] == 2400.0
    assert parent.data.metrics["n_pruned"] == 2 and parent.data.metrics["n_failed"] == 1
    assert parent.data.metrics["n_complete"] == 2 and parent.data.metrics["n_running"] == 1
    # The chosen configuration as the parent's params (the knobs' own names: the runs table's knob columns), its
    # figure in the objective's column, servetune's study note as its description.
    assert parent.data.params == {"choice.trial": "1", "mem_fraction_static": "0.88", "cuda_graph_max_bs": "256",
                                  "nccl.NCCL_ALGO": "unset"}
    assert parent.data.metrics["Objective.c16.output_throughput_tok_s"] == 2400.0
    assert parent.info.run_name == "qwen-log (choice: trial 1)"
    assert parent.data.tags["mlflow.note.content"].startswith("# servetune's choice for qwen-log")


def test_artifacts_from_optuna_store_when_local_dir_is_gone(local: Local, tmp_path: Path) -> None:
    launch = launch_config(0.8, 64)
    files = artifact_files(launch, "0.5.10", [level(16, 1000.0)], "ready to roll")
    ids = store_artifacts(local.store, files)
    gone = tmp_path / "deleted-run-dir"
    trial = make_trial(state=TrialState.COMPLETE, mfs=0.8, cgbs=64, value=1000.0, levels=[level(16, 1000.0)],
                       artifacts_dir=gone, artifact_ids=ids, write_files=False)
    assert not gone.exists()
    study = build_study(local.storage, "qwen-store", [trial])
    assert local.tracker.sync(study) == SyncResult(added=1, present=0)
    run = runs_by_trial(local.tracker, "qwen-store")[0]
    assert artifact_names(local.client, run) == ARTIFACTS
    got = local.client.download_artifacts(run.info.run_id, "launch.sh", str(tmp_path))
    assert Path(got).read_text() == files["launch.sh"]
    assert "servetune.artifacts" not in run.data.tags


def test_partial_run_is_replaced(local: Local) -> None:
    study = build_study(local.storage, "qwen-partial", standard_trials()[:1])
    experiment_id = local.tracker.experiment_id("qwen-partial")
    # An attempt that died half-way: a RUNNING run with the trial's tag.
    partial = local.client.create_run(experiment_id, tags={"servetune.kind": "trial", "servetune.trial": "0"})
    assert local.tracker.sync(study) == SyncResult(added=1, present=0)
    runs = local.client.search_runs([experiment_id], "tags.`servetune.kind` = 'trial'")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert local.client.get_run(partial.info.run_id).info.lifecycle_stage == "deleted"


def _objective(trial: optuna.Trial) -> float:
    x = trial.suggest_float("mem_fraction_static", 0.6, 0.95)
    trial.set_user_attr("outcome", "ok")
    trial.set_user_attr("levels", [level(16, 1000.0 * x)])
    if trial.number == 1:
        trial.set_user_attr("outcome", "oom")
        trial.set_user_attr("phase", "decode")
        raise optuna.TrialPruned("oom in decode")
    return 1000.0 * x


def test_callback_survives_unreachable_mlflow_and_sync_backfills(
        local: Local, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    for key in HTTP_ENV:
        monkeypatch.delenv(key, raising=False)  # the tracker sets them; undone after the test
    bad = MlflowTracker(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    study = optuna.create_study(storage=local.storage, study_name="qwen-offline", direction="maximize")
    callback = bad.callback()
    with caplog.at_level(logging.WARNING, logger="search.outputs.tracking"):
        study.optimize(_objective, n_trials=3, callbacks=[optuna_callback(callback)])
    # Detected once, then skipped for the rest of the run: no retry (and its wait) per trial.
    assert len(study.trials) == 3 and callback.failures == 1 and callback.skipped == 2 and callback.broken
    # Fail fast: the tracker set MLflow's HTTP settings to no retries and a short timeout, and MLflow reads them.
    assert {key: os.environ[key] for key in HTTP_ENV} == HTTP_ENV_DEFAULTS
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "0"
    assert MLFLOW_HTTP_REQUEST_MAX_RETRIES.get() == 0
    assert MLFLOW_HTTP_REQUEST_TIMEOUT.get() == int(HTTP_ENV_DEFAULTS["MLFLOW_HTTP_REQUEST_TIMEOUT"])
    warnings = [r.getMessage() for r in caplog.records if r.name == "search.outputs.tracking"]
    assert len(warnings) == 1 and "unreachable" in warnings[0] and "sync-mlflow" in warnings[0]

    with pytest.raises(StudyError, match=r"^MLflow at http://127\.0\.0\.1:\d+: syncing study 'qwen-offline' "
                                         r"failed: unreachable \(connection refused\)$"):
        bad.sync(study)

    assert local.tracker.sync(study) == SyncResult(added=3, present=0)
    assert local.tracker.sync(study) == SyncResult(added=0, present=3)
    runs = runs_by_trial(local.tracker, "qwen-offline")
    assert runs[1].data.tags["servetune.state"] == "PRUNED"
    assert runs[1].data.tags["servetune.oom_phase"] == "decode"


def test_callback_logs_each_trial(local: Local) -> None:
    study = optuna.create_study(storage=local.storage, study_name="qwen-online", direction="maximize")
    study.optimize(_objective, n_trials=3, callbacks=[optuna_callback(local.tracker.callback())])
    runs = runs_by_trial(local.tracker, "qwen-online")
    assert sorted(runs) == [0, 1, 2]
    assert runs[0].data.metrics["objective"] == study.trials[0].value
    assert local.tracker.sync(study) == SyncResult(added=0, present=3)


def test_deleted_experiment_is_a_study_error(local: Local) -> None:
    experiment_id = local.client.create_experiment("qwen-deleted")
    local.client.delete_experiment(experiment_id)
    tracker = MlflowTracker(local.tracker.tracking_uri)
    with pytest.raises(StudyError, match=r"experiment 'qwen-deleted' \(id \d+\) is deleted: restore it"):
        tracker.experiment_id("qwen-deleted")


def test_mlflow_is_imported_lazily() -> None:
    code = ("import sys, search.outputs.tracking, search.outputs.export, search.outputs.report, search.outputs.notes; "
            "sys.exit(any(m.split('.')[0] in ('mlflow', 'optuna_dashboard') for m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[2], timeout=60)
    assert result.returncode == 0


# ---- a real `mlflow server` ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"), free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.slow
def test_real_mlflow_server(mlflow_server: MlflowServer, local: Local, monkeypatch: pytest.MonkeyPatch,
                            tmp_path: Path) -> None:
    for key in HTTP_ENV:
        monkeypatch.delenv(key, raising=False)
    study = build_study(local.storage, "qwen-remote", standard_trials(tmp_path / "artifacts"))
    tracker = MlflowTracker(mlflow_server.url)
    callback = tracker.callback()
    callback(StudyView.of(study), study.trials[0])
    assert callback.failures == 0
    assert tracker.sync(study) == SyncResult(added=4, present=1)
    assert tracker.sync(study) == SyncResult(added=0, present=5)
    tracker.finish_study(StudyView.of(study))

    client = MlflowClient(mlflow_server.url)
    runs = runs_by_trial(tracker, "qwen-remote")
    assert sorted(runs) == [0, 1, 2, 3, 4]
    assert runs[1].data.params["engine_version"] == "0.5.23"
    assert runs[2].data.tags["servetune.oom_phase"] == "cuda_graph"
    assert runs[1].data.metrics["c16.output_throughput"] == 2400.0
    experiment = client.get_experiment(tracker.experiment_id("qwen-remote"))
    assert experiment.artifact_location.startswith("mlflow-artifacts:")
    assert artifact_names(client, runs[0]) == ARTIFACTS  # uploaded through the server's artifact proxy
    record = _record(client, runs[2], tmp_path / "download")
    assert record["state"] == "PRUNED" and record[FACTS_ATTR]["phase"] == "cuda_graph"


def test_background_logging_drains_every_trial(local: Local) -> None:
    # `servetune run` logs on a worker thread so MLflow's latency is off the trials' critical path;
    # finish_study waits for it, so nothing queued is lost.
    study = build_study(local.storage.replace("optuna.db", "bg.db"), "bg", standard_trials())
    callback = local.tracker.callback(background=True)
    for trial in study.trials:
        callback(StudyView.of(study), trial)
    local.tracker.finish_study(StudyView.of(study))  # drains first
    finished = {t.number for t in study.trials if t.state.is_finished()}
    assert set(local.tracker.trial_runs("bg")) == finished


def test_statuses_names_and_the_simulated_flag_read_as_what_happened() -> None:
    ok = TrialFacts(number=1, state=TrialState.COMPLETE, value=10.0, outcome="ok", engine="sim", simulated=True,
                    params={"mem_fraction_static": 0.8}, objective_metric="output_throughput", objective_level=64)
    oom = TrialFacts(number=2, state=TrialState.PRUNED, outcome=FailureKind.OOM, engine="sglang")
    # A skip launched nothing, so its record says nothing of a simulated run: its study's engine does.
    skip = TrialFacts(number=3, state=TrialState.PRUNED, outcome=FailureKind.PREDICTED_OOM, engine="sim")
    fail = TrialFacts(number=4, state=TrialState.FAIL, outcome=FailureKind.HOST_BUSY)
    assert [run_status(r) for r in (ok, oom, skip, fail)] == ["FINISHED", "FAILED", "FINISHED", "FAILED"]
    assert [run_name(r) for r in (ok, oom, skip)] == ["trial-1", "trial-2 oom", "trial-3 skipped (predicted OOM)"]
    assert [simulated(r) for r in (ok, oom, skip)] == [True, False, True]
    view = json.loads(shared_view(ok, "parent-id"))
    assert view["selectedColumns"][:2] == ["metrics.`Objective.c64.output_throughput_tok_s`",
                                           "params.`mem_fraction_static`"]
    assert view["orderByKey"] == "metrics.`Objective.c64.output_throughput_tok_s`" and not view["orderByAsc"]
    assert experiment_url("http://127.0.0.1:5000/", "7") == (
        "http://127.0.0.1:5000/#/experiments/7/runs?viewStateShareKey=servetune&workflowType=machine_learning")
