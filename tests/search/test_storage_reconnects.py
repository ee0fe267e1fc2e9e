"""Storage that reconnects: a PostgreSQL restart, or every session cut (``pg_terminate_backend``), while a
run goes on. The run rides it out (the running trial goes on, the study lock's connection is opened again)
and completes with every trial recorded; only when the database stays away longer than ``--storage-retry``
does the run stop, in one line, losing nothing it had recorded.

Every process started here is stopped by its PID or process group; the cluster by its own ``pg_ctl``.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from optuna.storages import _cached_storage
from optuna.trial import TrialState

import search.driver.budget as budget
import search.storage as storage_module
from search.driver.budget import fail_phantoms
from search.storage import create_or_load, open_storage
from search.trial.records import note_host
from tests.fixtures.postgres import PostgresCluster, start_postgres
from tests.search.overnight_kit import (
    SEED003,
    cli_env,
    counted,
    live_servers,
    make_space,
    start_cli,
    study_runs,
    trials,
    wait_for,
)


@pytest.fixture
def own_postgres() -> Iterator[PostgresCluster]:
    """A cluster of this test alone: it is restarted and stopped."""
    cluster = start_postgres()
    try:
        yield cluster
    finally:
        cluster.stop()


def run_args(space: Path, study: str, storage: str, *extra: str) -> tuple[str, ...]:
    return ("run", str(space), "--study", study, "--storage", storage, "--no-mlflow", "--no-live",
            "--confirm-top", "0", *extra)


@pytest.mark.postgres
@pytest.mark.slow
def test_a_postgres_restart_and_cut_sessions_mid_run_lose_nothing(tmp_path: Path,
                                                                  own_postgres: PostgresCluster) -> None:
    space = make_space(tmp_path / "space.yaml", speed=100, workload=SEED003, budget={"n_trials": 3})
    ctl = start_cli(*run_args(space, "restart", own_postgres.url, "--seed", "2", "--storage-retry", "2m"),
                    cwd=tmp_path, env=cli_env(tmp_path))
    try:
        runs = study_runs(tmp_path / "runs", "restart")
        wait_for("trial 0's server", lambda: (runs / "0" / "pgid").exists(), timeout=60)
        own_postgres.restart(down_for=3)  # longer than a heartbeat: the trial goes on meanwhile
        wait_for("trial 1", lambda: len(trials(own_postgres.url, "restart")) >= 2, timeout=120)
        assert own_postgres.terminate_backends() >= 1
        assert ctl.finish(300) == 0, ctl.output()
    finally:
        ctl.kill()
    out = ctl.output()
    assert "connection lost" in out and "connection back" in out, out
    ts = trials(own_postgres.url, "restart")
    assert [t.state for t in ts] == [TrialState.COMPLETE] * 3, [(t.number, t.state, t.user_attrs.get("reason"))
                                                                for t in ts]
    assert len(counted(ts)) == 3
    assert live_servers(tmp_path / "runs") == []


@pytest.mark.postgres
@pytest.mark.slow
def test_a_database_that_stays_away_stops_the_run_in_one_line(tmp_path: Path,
                                                              own_postgres: PostgresCluster) -> None:
    space = make_space(tmp_path / "space.yaml", speed=100, workload=SEED003, budget={"n_trials": 3})
    ctl = start_cli(*run_args(space, "gone", own_postgres.url, "--storage-retry", "3s"), cwd=tmp_path,
                    env=cli_env(tmp_path))
    try:
        runs = study_runs(tmp_path / "runs", "gone")
        wait_for("trial 0's server", lambda: (runs / "0" / "pgid").exists(), timeout=60)
        own_postgres.stop(remove=False)
        assert ctl.finish(120) == 1, ctl.output()
    finally:
        ctl.kill()
    out = ctl.output()
    errors = [line for line in out.splitlines() if line.startswith("servetune: error:")]
    assert len(errors) == 1 and "the run stopped" in errors[0], out
    assert "Traceback" not in out
    assert live_servers(tmp_path / "runs") == [], "its servers are stopped"
    own_postgres.start()
    ts = trials(own_postgres.url, "gone")
    assert [t.number for t in ts] == [0], "what was recorded is still there"


def test_a_phantom_trial_left_by_a_retried_creation_does_not_hold_the_budget(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A creation retried after its commit went through leaves a RUNNING trial that never names its host and
    has no heartbeat (Optuna never takes it for stale): it is failed once it is old, and a real trial is not."""
    storage = open_storage(f"sqlite:///{tmp_path}/s.db", heartbeat=False)
    study = create_or_load(storage, "phantom")
    phantom = study.ask()
    real = study.ask()
    note_host(real, "gpu-a")
    fail_phantoms(study)
    assert {t.number: t.state for t in study.get_trials()} == {0: TrialState.RUNNING, 1: TrialState.RUNNING}
    monkeypatch.setattr(budget, "PHANTOM_AGE", 0.0)
    fail_phantoms(study)
    assert {t.number: t.state for t in study.get_trials()} == {phantom.number: TrialState.FAIL,
                                                               real.number: TrialState.RUNNING}


def test_every_backend_call_of_optunas_cached_storage_is_retried() -> None:
    """A Study holds Optuna's _CachedStorage, which calls its backend's private methods (``_get_trials``,
    ``_create_new_trial``, ...): each one that talks to the database must be retried, or a dropped connection
    during it stops the run (it did, between two retried calls)."""
    source = inspect.getsource(_cached_storage)
    called = set(re.findall(r"self\._backend\.(\w+)\(", source))
    not_the_database = {"get_heartbeat_interval", "get_heartbeat_stale_trial_callback"}
    assert called - not_the_database, "Optuna's cache no longer calls its backend as this test reads it"
    assert sorted(called - not_the_database - set(storage_module._RETRIED)) == []
