"""Many controllers on one study through PostgreSQL, a real MLflow tracking server, and a host whose sshd
goes away for a while.

* two ``servetune worker`` processes, each owning its own simulated GPU host (inventory ``address: local``
  with its own runs root, state and server port), share one study in a throwaway PostgreSQL cluster
  (``tests/fixtures/postgres.py``) with a budget of 10: exactly 10 COMPLETE+PRUNED trials, none run twice,
  none lost, none left RUNNING or WAITING; both hosts did work;
* their tracking URI is a real ``mlflow server`` (SQLite backend) that is stopped mid-run: the search goes
  on, and ``servetune sync-mlflow`` back-fills every trial once the server is back;
* the sshd of an SSH host (``tests/fixtures/sshd.py``) is stopped for a while: the trials meanwhile are
  FAIL host_unreachable, the host is set aside and tried again after its cooldown, and the search
  completes once sshd is back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from optuna.trial import FrozenTrial, TrialState

from runners.inventory import open_host
from search._optuna_compat import study_id
from search.driver.budget import StudyLock
from search.driver.hosts import sim_env
from search.driver.run import RunOptions, StopReason, run_search
from search.outputs.tracking import MlflowTracker
from search.storage import create_or_load, open_storage
from search.trial.records import TrialFacts
from spaces.schema import load_space
from tests.fixtures.mlflow_server import MlflowServer
from tests.fixtures.ports import free_port
from tests.fixtures.postgres import PostgresCluster
from tests.fixtures.sshd import SshServer, write_known_hosts
from tests.search.overnight_kit import (
    cli,
    counted,
    gpu_pids,
    live_servers,
    make_space,
    start_cli,
    trials,
    wait_for,
)

STUDY = "fleet"


@pytest.mark.slow
@pytest.mark.postgres
def test_two_workers_share_one_postgres_study_and_mlflow_is_back_filled(
        tmp_path: Path, postgres: PostgresCluster) -> None:
    space = make_space(tmp_path / "space.yaml", budget={"n_trials": 10})
    mlflow = MlflowServer(tmp_path / "mlflow", free_port())
    mlflow.root.mkdir()
    mlflow.start()
    workers = []
    try:
        for name, seed in (("gpu-a", "11"), ("gpu-b", "22")):
            wd = tmp_path / name
            wd.mkdir()
            (wd / "hosts.yaml").write_text(yaml.safe_dump({"hosts": [
                {"name": name, "address": "local", "runs_root": str(wd / "runs"), "server_port": free_port()}]}))
            workers.append(start_cli(
                "worker", str(space), "--study", STUDY, "--storage", postgres.url, "--inventory", "hosts.yaml",
                "--mlflow-uri", mlflow.url, "--no-live", "--seed", seed, cwd=wd))

        wait_for("4 finished trials", lambda: len(counted(trials(postgres.url, STUDY))) >= 4, timeout=90,
                 interval=0.3)
        mlflow.stop()  # the tracking server goes away mid-run; the search does not notice
        for w in workers:
            assert w.finish(180) == 0, w.output()
    finally:
        for w in workers:
            w.kill()
        mlflow.stop()

    ts = trials(postgres.url, STUDY)
    done = counted(ts)
    assert len(done) == 10  # exactly the budget: no overshoot from two controllers starting at once
    assert all(t.state.is_finished() for t in ts)  # none left RUNNING or WAITING: none lost
    assert sorted(t.number for t in ts) == list(range(len(ts)))
    ran = [t for t in done if TrialFacts.from_trial(t).launched]
    reused = len(done) - len(ran)
    configs = [tuple(sorted(t.params.items())) for t in ran]
    twice = [(t.number, TrialFacts.from_trial(t).host, t.params, TrialFacts.from_trial(t).probe,
              TrialFacts.from_trial(t).design) for t in ran if configs.count(tuple(sorted(t.params.items()))) > 1]
    assert len(set(configs)) == len(configs), f"a configuration was run twice: {twice}"
    print(f"{len(ran)} trials ran, {reused} reused a measured configuration, "
          f"{sum(1 for t in ts if t.state == TrialState.FAIL)} FAIL")
    by_host = {h: sum(1 for t in ran if TrialFacts.from_trial(t).host == h) for h in ("gpu-a", "gpu-b")}
    assert all(by_host.values()), by_host  # both controllers did work
    for name in ("gpu-a", "gpu-b"):
        assert live_servers(tmp_path / name / "runs") == []
        assert gpu_pids(tmp_path / name / ".servetune/simhost") == ""

    try:
        mlflow.start()  # back, same store: sync-mlflow fills in what the outage missed
        res = cli("sync-mlflow", "--study", STUDY, "--storage", postgres.url, "--mlflow-uri", mlflow.url,
                  cwd=tmp_path / "gpu-a")
        assert res.returncode == 0, res.stderr
        added = int(res.stdout.split("mlflow: ", 1)[1].split()[0])
        assert added > 0, res.stdout  # some trials finished while the server was down
        runs = MlflowTracker(mlflow.url).trial_runs(STUDY)
        assert set(runs) == {t.number for t in ts}
        again = cli("sync-mlflow", "--study", STUDY, "--storage", postgres.url, "--mlflow-uri", mlflow.url,
                    cwd=tmp_path / "gpu-a")
        assert "0 run(s) added" in again.stdout
    finally:
        mlflow.stop()


@pytest.mark.slow
@pytest.mark.ssh
def test_sshd_down_for_a_while_then_back(tmp_path: Path, sshd_factory: Callable[[str], SshServer]) -> None:
    sshd = sshd_factory("127.0.0.1")
    known = write_known_hosts(tmp_path / "known_hosts", sshd)
    space = load_space(make_space(tmp_path / "space.yaml", budget={"max_consecutive_failures": 2}))
    spec = sshd.spec(known, runs_root=str(tmp_path / "runs"), env=sim_env(space, tmp_path / "sim"),
                     server_port=free_port())
    host = open_host(spec, ssh_config=None, connect_timeout=5)
    storage = f"sqlite:///{tmp_path}/servetune.db"
    create_or_load(open_storage(storage), STUDY)
    outage: dict[str, float] = {}

    def now() -> list[FrozenTrial]:
        return trials(storage, STUDY)

    def unreachable() -> int:
        return sum(1 for t in now() if TrialFacts.from_trial(t).outcome == "host_unreachable")

    def break_and_mend() -> None:
        wait_for("a first trial", lambda: counted(now()), timeout=60, interval=0.1)
        sshd.stop()  # listener and connections: as a reboot or a network cut would
        outage["down"] = time.monotonic()
        wait_for("the host to be set aside", lambda: unreachable() >= 2, timeout=60, interval=0.1)
        time.sleep(0.5)
        sshd.start()
        outage["up"] = time.monotonic()

    mender = threading.Thread(target=break_and_mend, daemon=True)
    mender.start()
    try:
        options = RunOptions(study_name=STUDY, storage_url=storage, artifacts_dir=tmp_path / "artifacts",
                             n_trials=4, timeout=120, seed=1, smi_interval=0.5, heartbeat_interval=1,
                             grace_period=5, cooldown=2.0, max_set_asides=3)
        summary = run_search(space, [host], options)
    finally:
        mender.join(timeout=60)
        host.close()
    assert "up" in outage, "sshd was never brought back"
    assert summary.stopped_by == StopReason.BUDGET
    ts = summary.study.get_trials()
    assert len(counted(ts)) == 4  # the search completed after sshd came back
    failed = [t for t in ts if t.state == TrialState.FAIL]
    assert len(failed) >= 2
    assert all(TrialFacts.from_trial(t).outcome == "host_unreachable" for t in failed)  # FAIL, never PRUNED
    assert summary.host_states[0].set_aside_count >= 1  # set aside, then tried again
    assert live_servers(tmp_path / "runs") == []
    assert gpu_pids(tmp_path / "sim") == ""


@pytest.mark.postgres
@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_the_budget_lock_is_shared_by_separate_storages(
        backend: str, tmp_path: Path, postgres: PostgresCluster) -> None:
    """What makes the budget exact across controllers: two storages (as two processes hold) exclude each
    other while one creates a trial (a PostgreSQL advisory lock; an flock beside a SQLite file)."""
    url = postgres.url if backend == "postgresql" else f"sqlite:///{tmp_path}/lock.db"
    first, second = open_storage(url), open_storage(url)
    key = study_id(create_or_load(first, "lock-" + backend))
    locks = [StudyLock(first, key, url), StudyLock(second, key, url)]
    entered = threading.Event()

    def contend() -> None:
        with locks[1]():
            entered.set()

    try:
        with locks[0]():
            t = threading.Thread(target=contend, daemon=True)
            t.start()
            assert not entered.wait(0.5)  # held by the other "controller"
        assert entered.wait(5)  # and free once released
        t.join(5)
    finally:
        for lock in locks:
            lock.close()
        for storage in (first, second):
            storage.engine.dispose()
