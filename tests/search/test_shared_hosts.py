"""Shared hosts and honest blame, with real controllers on the simulated GPU host.

* two controllers on one host at once (different studies, then one PostgreSQL study): they take turns
  through the host's claim; no trial is killed from outside, the budgets are exact, no server is left;
* a controller SIGKILLed mid-trial: a controller arriving before the dead one's lease expires leaves its
  server alone and waits; after expiry it stops the orphan and runs its own trial;
* a foreign program on the space's port: no trial PRUNED or COMPLETE, the foreign server never benchmarked;
* a server SIGTERMed from outside mid-benchmark: FAIL ``stopped_from_outside``;
* permanent host faults (no nvidia-smi, engine python missing, no SFTP subsystem): the run exits non-zero
  within seconds with one line naming host, fault and fix, before any trial; with a good host beside it,
  only the bad one is dropped;
* the simulated host over SSH without manual set-up: its nvidia-smi is installed on the host.

Every process started here is stopped by its PID or process group.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from optuna.trial import TrialState

from runners.errors import HostMisconfigured
from runners.host import Lease
from runners.inventory import open_host
from runners.telemetry import FailureKind
from search.driver.hosts import local_host, sim_env
from search.driver.run import RunOptions, run_search
from search.trial.records import TrialFacts
from spaces.schema import load_space
from tests.fixtures.mlflow_server import group_alive
from tests.fixtures.postgres import PostgresCluster
from tests.fixtures.sshd import SshServer, start_sshd, write_known_hosts
from tests.search.overnight_kit import (
    SEED003,
    cli,
    cli_env,
    counted,
    lease_files,
    live_servers,
    make_space,
    start_cli,
    study_runs,
    trials,
    wait_for,
)


def run_args(space: Path, study: str, storage: str, *extra: str) -> tuple[str, ...]:
    # No confirmation launches: these tests count the trials of a budget (search.strategy.confirm has its own).
    return ("run", str(space), "--study", study, "--storage", storage, "--no-mlflow", "--no-live",
            "--confirm-top", "0", *extra)


def killed_from_outside(ts: list[Any]) -> list[Any]:
    return [t for t in ts if "SIGTERM" in str(t.user_attrs.get("reason", ""))
            or t.user_attrs.get("outcome") == "stopped_from_outside"]


def server_pgid(run_dir: Path, timeout: float = 60) -> int:
    def read() -> int | None:
        text = (run_dir / "pgid").read_text().strip() if (run_dir / "pgid").exists() else ""
        return int(text) if text.isdigit() else None

    return int(wait_for(f"a server in {run_dir}", read, timeout=timeout))


# ---- two controllers on one host ---------------------------------------------------------------


@pytest.mark.slow
def test_two_controllers_with_their_own_studies_take_turns_on_one_host(tmp_path: Path) -> None:
    space = make_space(tmp_path / "space.yaml", budget={"n_trials": 3})  # one port for both
    runs = []
    try:
        for study in ("alpha", "beta"):
            storage = f"sqlite:///{tmp_path}/{study}.db"
            runs.append((study, storage, start_cli(*run_args(space, study, storage, "--seed", "3"), cwd=tmp_path,
                                                   log=f"{study}.log")))
        for _, _, ctl in runs:
            assert ctl.finish(240) == 0, ctl.output()
    finally:
        for _, _, ctl in runs:
            ctl.kill()
    for study, storage, ctl in runs:
        ts = trials(storage, study)
        assert len(counted(ts)) == 3, [(t.number, t.state, t.user_attrs.get("reason")) for t in ts]
        assert not [t for t in ts if t.state == TrialState.FAIL], "no trial failed for the other's sake"
        assert killed_from_outside(ts) == []
        assert "stopped an orphaned server" not in ctl.output()
    spans = sorted((t.datetime_start, t.datetime_complete, study) for study, storage, _ in runs
                   for t in trials(storage, study))
    for (_, end, a), (start, _, b) in itertools.pairwise(spans):
        assert a == b or end <= start, "trials of the two controllers never ran at once on the host"
    assert live_servers(tmp_path / "runs") == []
    assert not lease_files(tmp_path / "hostdir"), "leases are removed"


@pytest.mark.slow
@pytest.mark.postgres
def test_two_controllers_of_one_postgres_study_on_one_host(tmp_path: Path, postgres: PostgresCluster) -> None:
    space = make_space(tmp_path / "space.yaml", budget={"n_trials": 4})
    ctls = []
    try:
        for seed in ("5", "6"):
            ctls.append(start_cli(*run_args(space, "shared", postgres.url, "--seed", seed), cwd=tmp_path,
                                  log=f"ctl-{seed}.log"))
        for ctl in ctls:
            assert ctl.finish(240) == 0, ctl.output()
    finally:
        for ctl in ctls:
            ctl.kill()
    ts = trials(postgres.url, "shared")
    assert len(counted(ts)) == 4
    assert all(t.state.is_finished() for t in ts)
    assert killed_from_outside(ts) == []
    assert not [t for t in ts if t.state == TrialState.FAIL]
    spans = sorted((t.datetime_start, t.datetime_complete, TrialFacts.from_trial(t).controller) for t in ts)
    for (_, end, a), (start, _, b) in itertools.pairwise(spans):
        assert a == b or end <= start, "trials of the two controllers never ran at once on the host"
    assert live_servers(tmp_path / "runs") == []


@pytest.mark.ssh
@pytest.mark.slow
def test_two_users_runs_roots_on_one_host_never_launch_at_once(tmp_path: Path, sshd: SshServer,
                                                                 known_hosts: Path) -> None:
    """Two controllers, each with its own working folder and runs root (two users' ``~/.servetune/runs``), on
    one host over SSH with one set of (simulated) GPUs, and the default host_dir: they meet in the GPU set's
    claim, so no trial of one runs while the other's does (two servers at once would not fit the GPUs)."""
    sim = sim_env(load_space(make_space(tmp_path / "probe.yaml")), tmp_path / "shared-gpus")
    runs = []
    try:
        for who in ("alice", "bob"):
            wd = tmp_path / who
            space = make_space(wd / "space.yaml", budget={"n_trials": 3})
            spec = sshd.spec(known_hosts, name="gpu-box", runs_root=str(wd / "runs"), env=sim)
            (wd / "hosts.yaml").write_text(yaml.safe_dump({"hosts": [spec.model_dump(exclude_none=True)]}))
            env = cli_env(wd)
            del env["SERVETUNE_HOST_DIR"]  # the default, shared by every user: /var/tmp/servetune
            storage = f"sqlite:///{wd}/{who}.db"
            runs.append((who, storage, start_cli(*run_args(space, who, storage, "--inventory", "hosts.yaml",
                                                           "--seed", "3"), cwd=wd, env=env, log=f"{who}.log")))
        for _, _, ctl in runs:
            assert ctl.finish(300) == 0, ctl.output()
    finally:
        for _, _, ctl in runs:
            ctl.kill()
    spans = []
    for who, storage, _ in runs:
        ts = trials(storage, who)
        assert [t.state for t in ts] == [TrialState.COMPLETE] * 3, [(t.number, t.state, t.user_attrs.get("reason"))
                                                                    for t in ts]
        spans += [(t.datetime_start, t.datetime_complete, who) for t in ts]
        assert live_servers(tmp_path / who / "runs") == []
    spans.sort()
    for (_, end, a), (start, _, b) in itertools.pairwise(spans):
        assert a == b or end <= start, "trials of the two users never ran at once on the GPUs"
    assert "held by controller" in runs[0][2].output() + runs[1][2].output(), "they did meet"


# ---- a SIGKILLed controller and its lease -----------------------------------------------------


@pytest.mark.slow
def test_a_dead_controllers_server_is_left_alone_until_its_lease_expires(tmp_path: Path) -> None:
    space = make_space(tmp_path / "space.yaml", speed=20, workload=SEED003)  # a trial of many seconds
    first = start_cli(*run_args(space, "first", f"sqlite:///{tmp_path}/first.db", "--n-trials", "2"),
                      cwd=tmp_path, log="first.log")
    try:
        pgid = server_pgid(study_runs(tmp_path / "runs", "first") / "0")
        os.kill(first.pid, signal.SIGKILL)
        first.proc.wait(10)
    finally:
        first.kill()
    assert group_alive(pgid)
    # As if the dead controller had run on another machine (so only its lease's expiry can tell), with a
    # lease that lasts 20 s, renewed here (as its heartbeat would) until the second controller has started
    # and seen the host held, however long that takes on a loaded machine; then it is left to expire.
    lease_file = lease_files(tmp_path / "hostdir")[0]
    lease = json.loads(lease_file.read_text())
    lease.update(machine="another-machine", hostname="another-machine", ttl=20)

    def heartbeat() -> None:
        lease["heartbeat"] = int(time.time())
        fresh = lease_file.with_name(".heartbeat.tmp")
        fresh.write_text(json.dumps(lease))
        fresh.replace(lease_file)  # whole, never half-written for a controller reading it

    heartbeat()
    second_storage = f"sqlite:///{tmp_path}/second.db"
    second = start_cli(*run_args(space, "second", second_storage, "--n-trials", "1"), cwd=tmp_path,
                       log="second.log")
    try:
        def held() -> bool:
            heartbeat()
            return "held by" in second.output()

        wait_for("the second controller to see the host held", held, timeout=180, interval=1)
        expires = lease["heartbeat"] + 20
        while time.time() < expires - 1:
            assert group_alive(pgid), "a live lease's server is never stopped"
            assert trials(second_storage, "second") == [], "no trial is created on a held host"
            time.sleep(0.5)
        assert second.finish(240) == 0, second.output()
    finally:
        second.kill()
    assert not group_alive(pgid), "after expiry the orphan is stopped (by the preflight of the next trial)"
    ts = trials(second_storage, "second")
    assert [t.state for t in ts] == [TrialState.COMPLETE]
    assert live_servers(tmp_path / "runs") == []


# ---- a foreign program on the port ----------------------------------------------------------------


class _Foreign(BaseHTTPRequestHandler):
    """Answers every request 200 and remembers it: a foreign server that would look ready."""

    seen: list[str] = []

    def do_GET(self) -> None:
        self.seen.append(f"GET {self.path}")
        self._ok()

    def do_POST(self) -> None:
        self.seen.append(f"POST {self.path}")
        self._ok()

    def _ok(self) -> None:
        body = b'{"status": "ok"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.slow
def test_a_foreign_listener_on_the_port_is_host_trouble_never_measured(tmp_path: Path) -> None:
    space_file = make_space(tmp_path / "space.yaml", budget={"n_trials": 2, "max_consecutive_failures": 1})
    port = yaml.safe_load(space_file.read_text())["port"]
    _Foreign.seen = []
    foreign = ThreadingHTTPServer(("127.0.0.1", port), _Foreign)
    thread = threading.Thread(target=foreign.serve_forever, daemon=True)
    thread.start()
    try:
        storage = f"sqlite:///{tmp_path}/s.db"
        # The inventory pins the port (the built-in host on its own would pick a free one for each launch).
        (tmp_path / "hosts.yaml").write_text(yaml.safe_dump({"hosts": [
            {"name": "local", "address": "local", "runs_root": str(tmp_path / "runs"), "server_port": port}]}))
        res = cli(*run_args(space_file, "foreign", storage, "--host-cooldown", "1s", "--inventory", "hosts.yaml"),
                  cwd=tmp_path)
    finally:
        foreign.shutdown()
        foreign.server_close()
    ts = trials(storage, "foreign")
    assert ts, res.stdout + res.stderr
    assert counted(ts) == [], "nothing is PRUNED or COMPLETE for a port someone else holds"
    assert {t.user_attrs.get("outcome") for t in ts} == {"host_busy"}
    assert all(f"port {port}" in TrialFacts.from_trial(t).reason for t in ts)
    assert not [r for r in _Foreign.seen if r.startswith("POST")], "the foreign server is never benchmarked"
    assert "no hosts left" in res.stdout
    assert live_servers(tmp_path / "runs") == []


@pytest.mark.slow
def test_the_built_in_host_serves_beside_another_server_on_the_spaces_port(tmp_path: Path) -> None:
    """Another demo (or anything) serving on the space's port: the built-in simulated host binds a free loopback
    port for each launch, so the run goes on, and the other server is never touched."""
    space_file = make_space(tmp_path / "space.yaml", budget={"n_trials": 2})
    port = yaml.safe_load(space_file.read_text())["port"]
    _Foreign.seen = []
    foreign = ThreadingHTTPServer(("127.0.0.1", port), _Foreign)
    threading.Thread(target=foreign.serve_forever, daemon=True).start()
    try:
        storage = f"sqlite:///{tmp_path}/s.db"
        res = cli(*run_args(space_file, "beside", storage), cwd=tmp_path)
    finally:
        foreign.shutdown()
        foreign.server_close()
    assert res.returncode == 0, res.stdout + res.stderr
    ts = trials(storage, "beside")
    assert len(counted(ts)) == 2 and not [t for t in ts if t.state == TrialState.FAIL]
    ports = {TrialFacts.from_trial(t).launch_config.port for t in ts}
    assert port not in ports and all(p > 0 for p in ports)
    assert _Foreign.seen == []


# ---- a server stopped from outside ----------------------------------------------------------------


@pytest.mark.slow
def test_a_server_sigtermed_from_outside_mid_benchmark_is_fail_stopped_from_outside(tmp_path: Path) -> None:
    space = make_space(tmp_path / "space.yaml", speed=20, workload=SEED003)
    storage = f"sqlite:///{tmp_path}/s.db"
    ctl = start_cli(*run_args(space, "outside", storage, "--n-trials", "1"), cwd=tmp_path)
    try:
        run_dir = study_runs(tmp_path / "runs", "outside") / "0"
        pgid = server_pgid(run_dir)
        wait_for("the benchmark to start", lambda: (run_dir / "bench.jsonl").exists(), timeout=90)
        os.killpg(pgid, signal.SIGTERM)  # not servetune's doing
        assert ctl.finish(240) == 0, ctl.output()
    finally:
        ctl.kill()
    ts = trials(storage, "outside")
    first = ts[0]
    assert first.state == TrialState.FAIL, first.user_attrs.get("reason")
    assert TrialFacts.from_trial(first).outcome == FailureKind.STOPPED_FROM_OUTSIDE
    assert [t.state for t in ts[1:]] == [TrialState.COMPLETE], "its slot is run again"
    assert live_servers(tmp_path / "runs") == []


# ---- permanent host faults ----------------------------------------------------------------------


@pytest.mark.parametrize(("entry", "needle"), [
    ({"env": {"PATH": "/usr/bin:/bin", "SERVETUNE_SIM_STATE": "/nonexistent"}}, "nvidia-smi is not on PATH"),
    ({"python": "/nonexistent/python3"}, "python '/nonexistent/python3' is not usable"),
])
def test_a_permanent_host_fault_ends_the_run_with_one_line(tmp_path: Path, entry: dict[str, Any],
                                                           needle: str) -> None:
    space = make_space(tmp_path / "space.yaml")
    (tmp_path / "hosts.yaml").write_text(yaml.safe_dump({"hosts": [
        {"name": "gpu-bad", "address": "local", "runs_root": str(tmp_path / "runs"), **entry}]}))
    storage = f"sqlite:///{tmp_path}/s.db"
    res = cli(*run_args(space, "perm", storage, "--inventory", "hosts.yaml"), cwd=tmp_path)
    assert res.returncode != 0
    assert trials(storage, "perm") == [], "dropped by the preflight at once: no trial failed and retried on it"
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("servetune: error: gpu-bad: ") and needle in lines[0] and "fix:" in lines[0]
    assert trials(storage, "perm") == []


@pytest.mark.ssh
def test_a_host_without_sftp_is_dropped_and_the_run_goes_on(tmp_path: Path, ssh_client_key: Path) -> None:
    bare = start_sshd(tmp_path / "sshd-bare", "127.0.0.1", ssh_client_key, sftp=False)
    try:
        known = write_known_hosts(tmp_path / "known_hosts", bare)
        space = load_space(make_space(tmp_path / "space.yaml", budget={"n_trials": 1}))
        opts = RunOptions(study_name="nosftp", storage_url=f"sqlite:///{tmp_path}/s.db",
                          artifacts_dir=tmp_path / "artifacts", n_trials=1, timeout=None, smi_interval=0.5,
                          confirm_k=0)
        bad = open_host(bare.spec(known, name="no-sftp", runs_root=str(tmp_path / "runs-bad")), ssh_config=None)
        started = time.monotonic()
        with pytest.raises(HostMisconfigured, match=r"no-sftp: the SSH server has no SFTP subsystem.*fix:"):
            run_search(space, [bad], opts)
        assert time.monotonic() - started < 30
        assert trials(opts.storage_url, "nosftp") == []

        bad = open_host(bare.spec(known, name="no-sftp", runs_root=str(tmp_path / "runs-bad")), ssh_config=None)
        good = local_host(space, runs_root=str(tmp_path / "runs"), sim_dir=tmp_path / "sim")
        summary = run_search(space, [bad, good], opts)
        assert len(summary.hosts_dropped) == 1 and "no-sftp" in summary.hosts_dropped[0]
        assert [(t.state, t.user_attrs["host"]) for t in summary.study.trials] == [(TrialState.COMPLETE, "local")]
    finally:
        bare.stop()


# ---- the simulated host over SSH, no set-up -------------------------------------------------------


@pytest.mark.ssh
@pytest.mark.slow
def test_the_simulated_host_over_ssh_needs_no_set_up(tmp_path: Path, sshd: SshServer, known_hosts: Path) -> None:
    space = load_space(make_space(tmp_path / "space.yaml", budget={"n_trials": 1}))
    host = open_host(sshd.spec(known_hosts, name="sim-ssh", runs_root=str(tmp_path / "runs")), ssh_config=None)
    assert "PATH" not in host.env
    opts = RunOptions(study_name="bare", storage_url=f"sqlite:///{tmp_path}/s.db",
                      artifacts_dir=tmp_path / "artifacts", n_trials=1, timeout=None, smi_interval=0.5,
                      confirm_k=0)
    summary = run_search(space, [host], opts)
    assert [t.state for t in summary.study.trials] == [TrialState.COMPLETE]
    assert list((tmp_path / "runs" / ".servetune" / "simhost").glob("*/bin/nvidia-smi"))
    assert TrialFacts.from_trial(summary.study.trials[0]).gpu_count == 8  # the profile's simulated host


# ---- who holds a host ---------------------------------------------------------------------------


def test_hosts_check_shows_who_holds_the_host(tmp_path: Path) -> None:
    space = make_space(tmp_path / "space.yaml")
    # The same simulated GPUs (the CLI's sim folder) and host_dir as the CLI's host: the same claim.
    other = local_host(load_space(space), runs_root=str(tmp_path / "runs"), sim_dir=tmp_path / ".servetune/simhost",
                       host_dir=str(tmp_path / "hostdir"))
    other.controller_id = "ctl-other"
    other.renew_lease(Lease("ctl-other", os.getpid(), "another-machine", "their-study", "postgresql://u:***@pg/db",
                            600, machine="another-machine"))
    assert other.claim().ok
    res = cli("hosts", "check", "--space", str(space), cwd=tmp_path, env=cli_env(tmp_path, COLUMNS="400"))
    assert res.returncode == 0, res.stdout + res.stderr
    out = "".join(res.stdout.split())
    assert "runningatrial:controllerctl-other" in out and "their-study" in out
