"""An unattended overnight search, with faults injected into real processes on the simulated GPU host.

* the controller SIGKILLed mid-trial, then the same command again: the orphaned server is stopped before
  the next trial, the stale trial becomes FAIL ("interrupted"), its configuration is run again, and the
  budget comes out exact;
* signals: the first SIGTERM lets the running trial finish and stops; a second SIGINT aborts it (server
  stopped, even one that ignores SIGTERM; trial FAIL "interrupted");
* a server that never gets ready: FAIL startup_timeout (not an OOM); the host is retired after repeated
  failures and the search ends cleanly ("no hosts left");
* a GPU held by a foreign process: FAIL host_busy (not an OOM); that host is set aside, the other carries on;
* ``--timeout``; ``servetune status`` while the search runs in another process; the morning summary.

Every server is checked gone by its recorded process group; the simulated GPUs are checked empty.
"""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from optuna.trial import TrialState

from search.driver.hosts import local_host
from search.driver.pool import HostState
from search.driver.run import STALE_REASON, RunOptions, StopReason, run_search
from search.storage import create_or_load, open_storage
from search.trial.records import TrialFacts
from spaces.schema import load_space
from tests.fixtures.hog import start_hog, stop_hog
from tests.fixtures.mlflow_server import group_alive
from tests.fixtures.ports import free_port
from tests.search.overnight_kit import (
    DIES,
    SEED003,
    SURVIVES,
    cli,
    counted,
    gpu_pids,
    live_servers,
    make_space,
    start_cli,
    study_runs,
    trials,
    wait_for,
)

STUDY = "night"

pytestmark = pytest.mark.slow  # each test runs real searches with fault injection (7-40 s)


def run_args(space: Path, storage: str, *extra: str) -> tuple[str, ...]:
    return ("run", str(space), "--study", STUDY, "--storage", storage, "--no-mlflow", "--no-live", *extra)


def squash(text: str) -> str:
    """Without whitespace: rich wraps the console output at 80 columns, even inside words."""
    return "".join(text.split())


def server_pgid(run_dir: Path) -> int:
    def read() -> int | None:
        text = (run_dir / "pgid").read_text().strip() if (run_dir / "pgid").exists() else ""
        return int(text) if text.isdigit() else None

    return int(wait_for(f"a server in {run_dir}", read, timeout=60))


def options(wd: Path, **kw: Any) -> RunOptions:
    base: dict[str, Any] = {"study_name": STUDY, "storage_url": f"sqlite:///{wd}/servetune.db",
                            "artifacts_dir": wd / "artifacts", "n_trials": 2, "timeout": None, "seed": 1,
                            "smi_interval": 0.5, "heartbeat_interval": 1, "grace_period": 5}
    base.update(kw)
    return RunOptions(**base)


def test_controller_killed_mid_trial_then_resumed(tmp_path: Path) -> None:
    space = make_space(tmp_path / "space.yaml")
    storage = f"sqlite:///{tmp_path}/servetune.db"
    create_or_load(open_storage(storage), STUDY).enqueue_trial(SURVIVES)
    args = run_args(space, storage, "--n-trials", "3", "--seed", "1")

    first = start_cli(*args, cwd=tmp_path, log="killed.log")
    pgid = server_pgid(study_runs(tmp_path / "runs", STUDY) / "0")
    os.kill(first.pid, signal.SIGKILL)  # kill -9: no cleanup of any kind
    first.proc.wait(10)
    assert group_alive(pgid), "the server outlives its controller (it is detached)"
    assert trials(storage, STUDY)[0].state == TrialState.RUNNING

    res = cli(*args, cwd=tmp_path)  # the same command again resumes
    assert res.returncode == 0, res.stdout + res.stderr
    assert not group_alive(pgid)
    assert squash(f"stopped an orphaned server: local:{study_runs(tmp_path / 'runs', STUDY)}/0") in squash(res.stdout)

    ts = trials(storage, STUDY)
    dead = ts[0]
    assert dead.state == TrialState.FAIL
    assert TrialFacts.from_trial(dead).outcome == "interrupted" and TrialFacts.from_trial(dead).reason == STALE_REASON
    retried = [t for t in ts if TrialFacts.from_trial(t).retried_from == 0]
    assert len(retried) == 1
    again = retried[0]
    assert again.params == dead.params == SURVIVES
    assert again.state == TrialState.COMPLETE and TrialFacts.from_trial(again).launched  # really run
    assert (study_runs(tmp_path / "runs", STUDY) / str(again.number) / "server.log").read_text()
    assert len(counted(ts)) == 3  # the budget is exact: the FAIL'd trial does not count
    assert not [t for t in ts if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert live_servers(tmp_path / "runs") == []
    assert gpu_pids(tmp_path / ".servetune/simhost") == ""


def test_first_signal_lets_the_trial_finish_then_stops(tmp_path: Path) -> None:
    space = make_space(tmp_path / "space.yaml", speed=200)
    storage = f"sqlite:///{tmp_path}/servetune.db"
    ctl = start_cli(*run_args(space, storage, "--n-trials", "5"), cwd=tmp_path)
    server_pgid(study_runs(tmp_path / "runs", STUDY) / "0")
    ctl.proc.send_signal(signal.SIGTERM)
    assert ctl.finish(60) == 130, ctl.output()
    ts = trials(storage, STUDY)
    assert [t.state for t in ts] == [TrialState.COMPLETE]  # finished, and no trial after it
    assert "stoppedby:signal" in squash(ctl.output())
    assert live_servers(tmp_path / "runs") == []


def test_second_signal_aborts_the_trial_and_stops_its_server(tmp_path: Path) -> None:
    # A server that ignores SIGTERM: the stop has to escalate to SIGKILL.
    space = make_space(tmp_path / "space.yaml", speed=50, env={"SERVETUNE_SIM_IGNORE_SIGTERM": "1"},
                       budget={"stop_grace": "1s"})
    storage = f"sqlite:///{tmp_path}/servetune.db"
    ctl = start_cli(*run_args(space, storage, "--n-trials", "5"), cwd=tmp_path)
    pgid = server_pgid(study_runs(tmp_path / "runs", STUDY) / "0")
    ctl.proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    assert ctl.proc.poll() is None and group_alive(pgid)  # the first one waits for the trial
    ctl.proc.send_signal(signal.SIGINT)
    assert ctl.finish(30) == 130, ctl.output()
    assert not group_alive(pgid)
    [t] = trials(storage, STUDY)
    assert t.state == TrialState.FAIL
    assert TrialFacts.from_trial(t).outcome == "interrupted" and TrialFacts.from_trial(t).reason == "interrupted"
    assert TrialFacts.from_trial(t).stop_method == "kill"
    assert "stoppedby:aborted" in squash(ctl.output())
    assert gpu_pids(tmp_path / ".servetune/simhost") == ""


def test_server_that_never_gets_ready_is_a_startup_timeout(tmp_path: Path) -> None:
    # Sim speed 0.01: loading the weights takes hours of wall time, so /health never answers.
    space = load_space(make_space(tmp_path / "space.yaml", speed=0.01, budget={
        "startup_timeout": "2s", "stop_grace": "1s", "max_consecutive_failures": 2}))
    host = local_host(space, runs_root=str(tmp_path / "runs"), sim_dir=tmp_path / "sim")
    summary = run_search(space, [host], options(tmp_path, cooldown=60, max_set_asides=1))
    assert summary.stopped_by == StopReason.NO_HOSTS  # retired after 2 failures in a row: a clean end
    assert summary.host_states[0].state == HostState.RETIRED
    ts = summary.study.get_trials()
    assert len(ts) == 2
    for t in ts:
        assert t.state == TrialState.FAIL  # not PRUNED: the sampler learns nothing from it
        assert TrialFacts.from_trial(t).outcome == "startup_timeout"
        assert TrialFacts.from_trial(t).reason.startswith("not ready after 2s")
    assert live_servers(tmp_path / "runs") == []
    assert gpu_pids(tmp_path / "sim") == ""


def test_busy_gpu_is_fail_host_busy_and_that_host_is_set_aside(tmp_path: Path) -> None:
    space = load_space(make_space(tmp_path / "space.yaml", budget={"max_consecutive_failures": 2}))
    busy = local_host(space, runs_root=str(tmp_path / "runs-a"), sim_dir=tmp_path / "sim-a", name="gpu-a",
                      server_port=free_port())
    good = local_host(space, runs_root=str(tmp_path / "runs-b"), sim_dir=tmp_path / "sim-b", name="gpu-b",
                      server_port=free_port())
    hog = start_hog(tmp_path / "sim-a/state", 30000, "0,1")
    try:
        # No confirmation launches: the test counts each host's trials.
        summary = run_search(space, [busy, good], options(tmp_path, n_trials=4, cooldown=120, confirm_k=0))
    finally:
        stop_hog(hog)
    ts = summary.study.get_trials()
    on_a = [t for t in ts if TrialFacts.from_trial(t).host == "gpu-a"]
    on_b = [t for t in ts if TrialFacts.from_trial(t).host == "gpu-b"]
    assert len(on_a) == 2  # two failures in a row, then set aside
    for t in on_a:
        assert t.state == TrialState.FAIL and TrialFacts.from_trial(t).outcome == "host_busy"
        assert f"pid {hog.pid}" in TrialFacts.from_trial(t).reason
    assert len(on_b) == 4 and all(t.state == TrialState.COMPLETE for t in on_b)  # the other carried on
    assert not any(TrialFacts.from_trial(t).outcome == "oom" for t in ts)
    states = {s.host: s for s in summary.host_states}
    assert states["gpu-a"].state == HostState.SET_ASIDE and states["gpu-a"].set_aside_count == 1
    assert summary.stopped_by == StopReason.BUDGET
    assert live_servers(tmp_path / "runs-a") == [] and live_servers(tmp_path / "runs-b") == []


def test_timeout_ends_the_search_after_the_running_trial(tmp_path: Path) -> None:
    space = load_space(make_space(tmp_path / "space.yaml"))
    host = local_host(space, runs_root=str(tmp_path / "runs"), sim_dir=tmp_path / "sim")
    summary = run_search(space, [host], options(tmp_path, n_trials=100, timeout=2.0))
    assert summary.stopped_by == StopReason.TIMEOUT
    ts = summary.study.get_trials()
    assert 1 <= len(ts) < 100 and summary.ran == len(ts)
    assert all(t.state == TrialState.COMPLETE for t in ts)  # the running trial was let finish, not aborted
    # No trial was started once the deadline had passed: every trial but the last (the one running at the
    # deadline) finished before it. The timeout counts from before the first trial started, so the deadline
    # is at most 2 s after that start.
    first_start = ts[0].datetime_start
    assert first_start is not None
    deadline = first_start + timedelta(seconds=2)
    assert all(t.datetime_complete is not None and t.datetime_complete <= deadline for t in ts[:-1])
    assert live_servers(tmp_path / "runs") == []


def test_status_while_running_and_the_morning_summary(tmp_path: Path) -> None:
    space = make_space(tmp_path / "space.yaml", speed=100, workload=SEED003, safe=False)
    storage = f"sqlite:///{tmp_path}/servetune.db"
    study = create_or_load(open_storage(storage), STUDY)
    study.enqueue_trial(DIES)
    study.enqueue_trial(SURVIVES)
    ctl = start_cli(*run_args(space, storage, "--n-trials", "3", "--seed", "2", "--confirm-top", "0"), cwd=tmp_path)
    try:
        def status() -> dict[str, Any]:
            res = cli("status", "--study", STUDY, "--storage", storage, "--json", cwd=tmp_path)
            assert res.returncode == 0, res.stderr
            return dict(json.loads(res.stdout))

        running = wait_for("a running trial in `servetune status`", lambda: (s := status())["running"] and s,
                           timeout=60, interval=0.2)
        assert running["n_trials"] == 3  # the run's budget, read from the study
        assert running["running"][0]["host"] == "local"
        assert running["hosts"]["local"]["state"] == "running"
        later = wait_for("a finished trial in `servetune status`",
                         lambda: (s := status())["trials"]["done"] >= 1 and s, timeout=60, interval=0.2)
        assert later["remaining_trials"] <= 2 and later["eta_s"] is not None
        assert ctl.finish(120) == 0, ctl.output()
    finally:
        ctl.kill()

    final = status()
    assert final["trials"]["done"] == 3 and final["trials"]["running"] == 0
    # The best is the survivor (trial 1) or the sampled third trial, whichever measured higher: their
    # simulated throughputs are close and the simulated host's timings are real (a loaded machine reorders them).
    done = [t for t in create_or_load(open_storage(storage), STUDY).trials if t.state == TrialState.COMPLETE]
    best = max(done, key=lambda t: t.value or 0.0).number
    assert final["best"]["number"] == best and best in (1, 2) and final["eta_s"] == 0
    report = tmp_path / "artifacts" / STUDY / "report.md"
    text = report.read_text()
    assert "morningsummary" in squash(ctl.output())
    for needle in ("## Best configuration", f"Trial {best}:", "## OOM boundary", "## Failures by cause", "| oom |",
                   "decode"):
        assert needle in text, needle
    res = cli("report", "--study", STUDY, "--storage", storage, cwd=tmp_path)
    assert res.returncode == 0 and res.stdout == text
