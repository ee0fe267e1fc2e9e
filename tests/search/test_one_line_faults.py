"""Exit codes that mean something, and every error one line (issue 23, rows 10-11), with real processes:
``servetune`` as a subprocess, a foreign process on the simulated GPUs, a real OpenSSH server.

* a run whose every host was retired exits non-zero naming why; so does a run in which no trial ran (the
  timeout passed while another controller held the host, or another process held the lock of its claim: the
  host is busy, said in one line, never an unreachable host with a script's text as the reason);
* a study storage with garbage in the middle (a corrupt SQLite file) is one line in ``trials``, ``status``,
  ``report``, ``export`` and ``sync-mlflow``;
* a storage URL whose driver is not installed (``mysql://``) is one line in ``run``, ``trials`` and
  ``dashboard``, with the password left out;
* an orphaned server (its controller died on another machine) is left alone while its lease is live, then
  stopped by the preflight of the next trial with one line naming the host, its process group and run folder;
* a changed host key is a permanent fault: the host is dropped at once, never retried as transient;
* a full runs root on a local host (a 1 MiB tmpfs in a private mount namespace) is one line, and the trial in
  flight is FAIL ``host_config`` with the file system's reason.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from optuna.trial import TrialState

from runners.errors import HostKeyError, HostMisconfigured
from runners.host import Lease
from runners.inventory import open_host
from runners.telemetry import FailureKind
from search.driver.hosts import local_host
from search.driver.run import RunOptions, run_search
from search.trial.records import TrialFacts
from spaces.schema import load_space
from tests.fixtures.hog import start_hog, stop_hog
from tests.fixtures.mlflow_server import group_alive
from tests.fixtures.procs import wait_for
from tests.fixtures.sshd import SshServer, make_key, public_line
from tests.search.overnight_kit import cli, cli_env, make_space, start_cli, trials
from tests.search.overnight_kit import wait_for as kit_wait_for


def run_args(space: Path, study: str, storage: str, *extra: str) -> tuple[str, ...]:
    return ("run", str(space), "--study", study, "--storage", storage, "--no-mlflow", "--no-live",
            "--confirm-top", "0", *extra)


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.startswith("servetune: error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


# ---- no progress, non-zero ----------------------------------------------------------------------


@pytest.mark.slow
def test_a_run_whose_every_host_was_retired_exits_non_zero(tmp_path: Path) -> None:
    space = make_space(tmp_path / "space.yaml", budget={"n_trials": 2, "max_consecutive_failures": 1})
    hog = start_hog(tmp_path / ".servetune/simhost/state", 30000, "0,1")
    try:
        res = cli(*run_args(space, "retired", f"sqlite:///{tmp_path}/s.db", "--host-cooldown", "1s"), cwd=tmp_path)
    finally:
        stop_hog(hog)
    assert res.returncode == 1, res.stdout + res.stderr
    line = one_error_line(res.stderr)
    assert "every host was retired before the budget was spent" in line and "host_busy" in line
    assert all(t.user_attrs.get("outcome") == "host_busy" for t in trials(f"sqlite:///{tmp_path}/s.db", "retired"))


def test_a_run_in_which_no_trial_ran_exits_non_zero(tmp_path: Path) -> None:
    space = make_space(tmp_path / "space.yaml", budget={"n_trials": 1})
    # The same simulated GPUs (the CLI's sim folder) and host_dir as the CLI's host: the same claim.
    other = local_host(load_space(space), runs_root=str(tmp_path / "runs"), sim_dir=tmp_path / ".servetune/simhost",
                       host_dir=str(tmp_path / "hostdir"))
    other.controller_id = "ctl-other"
    other.renew_lease(Lease("ctl-other", os.getpid(), "another-machine", "their-study", "sqlite:///x.db", 600))
    assert other.claim().ok
    res = cli(*run_args(space, "held", f"sqlite:///{tmp_path}/s.db", "--timeout", "3s"), cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    line = one_error_line(res.stderr)
    assert "no trial ran in this run (stopped by: timeout); local is held by controller ctl-other" in line
    assert "their-study" in line


def test_a_claim_lock_held_by_another_process_is_a_busy_host_in_one_line(tmp_path: Path) -> None:
    """A process that is no controller (here ``flock``, as a hung one would) holds the lock of the host's claim:
    the host is busy, said in one line naming the process and the lock; no trial is failed as an unreachable
    host and no script text reaches the terminal."""
    space = make_space(tmp_path / "space.yaml", budget={"n_trials": 1})
    host = local_host(load_space(space), runs_root=str(tmp_path / "runs"), sim_dir=tmp_path / ".servetune/simhost",
                      host_dir=str(tmp_path / "hostdir"))
    lock = Path(host.gpu_dir()) / "claim.lock"
    locker = subprocess.Popen(["flock", "--exclusive", str(lock), "sleep", "600"], start_new_session=True)
    try:
        assert wait_for(lambda: subprocess.run(["flock", "--nonblock", str(lock), "true"], check=False).returncode
                        == 1), "the lock is held"
        res = cli(*run_args(space, "locked", f"sqlite:///{tmp_path}/s.db", "--timeout", "3s"), cwd=tmp_path)
    finally:
        os.killpg(locker.pid, signal.SIGKILL)
        locker.wait(10)
    assert res.returncode == 1, res.stdout + res.stderr
    line = one_error_line(res.stderr)
    assert "no trial ran in this run (stopped by: timeout)" in line
    assert f"local is busy: process {locker.pid} (flock) has held the lock {lock} for over" in line
    assert all(len(ln) < 400 for ln in res.stderr.splitlines()), res.stderr
    for script_text in ("set --", "export PATH", "#!/usr/bin/env", "flock -w"):
        assert script_text not in res.stdout + res.stderr
    assert trials(f"sqlite:///{tmp_path}/s.db", "locked") == [], "nothing is failed as an unreachable host"


# ---- an orphaned server found before a trial -------------------------------------------------------


@pytest.mark.slow
def test_an_orphan_found_before_a_trial_is_stopped_with_one_line(tmp_path: Path) -> None:
    """A controller on another machine died and left its server running, its lease and its claim behind.
    While its lease is live its server is its trial (nothing is stopped; the run waits). Once the lease has
    expired, the claim is taken over and the preflight of the next trial stops the server, saying so in one
    line (host, process group, run directory); the trial then runs."""
    space = make_space(tmp_path / "space.yaml", budget={"n_trials": 1})
    dead = local_host(load_space(space), runs_root=str(tmp_path / "runs"), sim_dir=tmp_path / ".servetune/simhost",
                      host_dir=str(tmp_path / "hostdir"))
    dead.controller_id = "ctl-dead"
    lease = Lease("ctl-dead", 4242, "another-machine", "their-study", "sqlite:///x.db", 600, machine="another-machine")
    dead.renew_lease(lease)
    assert dead.claim().ok
    ref = dead.start(dead.run_dir("their-study.0123456789ab", "0"), "echo ready; exec sleep 600\n", run_id="run-dead")
    storage = f"sqlite:///{tmp_path}/s.db"
    ctl = start_cli(*run_args(space, "after", storage), cwd=tmp_path)
    try:
        kit_wait_for("the run to wait for the dead controller's claim", lambda: "waiting for it" in ctl.output(),
                     timeout=120)
        assert group_alive(ref.pgid), "a live lease's server is never stopped"
        dead.renew_lease(replace(lease, ttl=1))  # the last heartbeat: it expires a second from now
        assert ctl.finish(180) == 0, ctl.output()
    finally:
        ctl.kill()
        if group_alive(ref.pgid):
            os.killpg(ref.pgid, signal.SIGKILL)
    out = ctl.output()
    lines = [line for line in out.splitlines() if "orphaned server" in line]
    assert lines == [f"stopped an orphaned server on local before the next trial (process group {ref.pgid}, "
                     f"{ref.run_dir})"], out
    assert not group_alive(ref.pgid)
    assert dead.orphans() == [], "nothing is left to stop"
    [trial] = trials(storage, "after")
    assert trial.state == TrialState.COMPLETE, trial.user_attrs.get("reason")


# ---- broken storages ----------------------------------------------------------------------------


def test_a_corrupt_sqlite_study_is_one_line_in_every_command(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    space = make_space(tmp_path / "space.yaml", budget={"n_trials": 1})
    assert cli(*run_args(space, "corrupt", f"sqlite:///{db}"), cwd=tmp_path).returncode == 0
    with sqlite3.connect(db) as conn:  # one file, no write-ahead log beside it
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("PRAGMA journal_mode=DELETE")
    data = bytearray(db.read_bytes())
    middle = len(data) * 2 // 13
    data[middle:middle + 4096] = b"\0garbage" * 512
    db.write_bytes(bytes(data))
    for command in ("trials", "status", "report", "export", "sync-mlflow"):
        res = cli(command, "--study", "corrupt", "--storage", f"sqlite:///{db}", cwd=tmp_path)
        assert res.returncode == 1, (command, res.stdout, res.stderr)
        line = one_error_line(res.stderr)
        assert res.stderr.strip() == line, (command, res.stderr)
        assert "malformed" in line or "not a database" in line, (command, line)


def test_a_storage_whose_driver_is_missing_is_one_line(tmp_path: Path) -> None:
    space = make_space(tmp_path / "space.yaml", budget={"n_trials": 1})
    url = "mysql://tuner:s3cret@127.0.0.1:1/servetune"
    for command in (run_args(space, "my", url), ("trials", "--study", "my", "--storage", url),
                    ("dashboard", "--storage", url)):
        res = cli(*command, cwd=tmp_path, timeout=60)
        assert res.returncode == 1, res.stderr
        line = one_error_line(res.stderr)
        assert "the database driver for mysql is not installed" in line and "fix:" in line
        assert "s3cret" not in res.stdout + res.stderr


# ---- a changed host key is permanent --------------------------------------------------------------


@pytest.mark.ssh
def test_a_changed_host_key_drops_the_host_at_once(tmp_path: Path, sshd: SshServer) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(f"{sshd.known_hosts_name} {public_line(make_key(tmp_path / 'other_host_key'))}\n")
    space = load_space(make_space(tmp_path / "space.yaml", budget={"n_trials": 1}))
    host = open_host(sshd.spec(known, name="rekeyed", runs_root=str(tmp_path / "runs")), ssh_config=None)
    opts = RunOptions(study_name="rekeyed", storage_url=f"sqlite:///{tmp_path}/s.db",
                      artifacts_dir=tmp_path / "artifacts", n_trials=1, timeout=None, confirm_k=0)
    with pytest.raises(HostKeyError) as direct:
        host.run("true")
    assert isinstance(direct.value, HostMisconfigured) and direct.value.fault == "host_key"
    with pytest.raises(HostMisconfigured, match=r"host key for .* has changed"):
        run_search(space, [host], opts)  # dropped by the preflight: the run has no host left
    assert trials(opts.storage_url, "rekeyed") == [], "no trial was failed and retried on it"


# ---- a full runs root -----------------------------------------------------------------------------


def _in_a_full_runs_root(tmp_path: Path, free_kib: int, *args: str) -> subprocess.CompletedProcess[str]:
    """``servetune ARGS`` with its runs root on a 1 MiB tmpfs holding ``free_kib`` KiB free, mounted in a
    private user and mount namespace (``unshare``), so nothing needs root and the mount dies with it."""
    runs = tmp_path / "runs"
    runs.mkdir(exist_ok=True)
    script = (f"mount -t tmpfs -o size=1m tmpfs {runs} && mkdir -p {runs}/.servetune && "
              f"head -c {free_kib * 1024} /dev/zero > {runs}/reserve && "
              f"(dd if=/dev/zero of={runs}/filler bs=4k 2>/dev/null; true) && rm {runs}/reserve && "
              f'exec "$@"')
    return subprocess.run(["unshare", "-Urm", "bash", "-c", script, "servetune", sys.executable, "-m", "search",
                           *args], cwd=tmp_path, env=cli_env(tmp_path), capture_output=True, text=True, timeout=180,
                          check=False)


def test_a_full_runs_root_is_one_line_and_the_trial_in_flight_is_fail_with_its_reason(tmp_path: Path) -> None:
    if subprocess.run(["unshare", "-Urm", "true"], capture_output=True, check=False).returncode != 0:
        pytest.skip("no unprivileged user namespaces here (unshare -Urm): cannot mount a small tmpfs")
    space = make_space(tmp_path / "space.yaml", budget={"n_trials": 1})
    storage = f"sqlite:///{tmp_path}/s.db"
    # Full from the start: the preflight's test write fails, the host is dropped.
    res = _in_a_full_runs_root(tmp_path, 0, *run_args(space, "full", storage))
    assert res.returncode == 1
    line = one_error_line(res.stderr)
    assert "cannot write" in line and "No space left on device" in line and "fix:" in line
    assert trials(storage, "full") == []
    # 16 KiB free: the preflight passes, the trial's own files do not fit.
    res = _in_a_full_runs_root(tmp_path, 16, *run_args(space, "nearly", storage))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "every host was retired" in one_error_line(res.stderr)
    [trial] = trials(storage, "nearly")
    facts = TrialFacts.from_trial(trial)
    assert trial.state == TrialState.FAIL and facts.outcome == FailureKind.HOST_CONFIG
    assert "No space left on device" in facts.reason
