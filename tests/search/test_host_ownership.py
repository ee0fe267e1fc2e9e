"""The host's GPUs are the host's: a process that appears on them during a trial makes the trial FAIL
``host_busy`` (never PRUNED, never a verdict on the configuration), with the evidence in its reason.

Every process started here is stopped by its PID or process group.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from runners.host import Host, Lease
from runners.telemetry import FailureKind
from search.driver.hosts import local_host
from search.storage import open_storage, study_uid
from search.trial.records import TrialFacts
from spaces.schema import load_space
from tests.fixtures.hog import start_hog, stop_hog
from tests.search.overnight_kit import (
    cli,
    cli_env,
    live_servers,
    make_space,
    start_cli,
    study_runs,
    trials,
    wait_for,
)

GATED_PYTHON = """#!/usr/bin/env bash
# The engine's python, but a server waits for the test's gate file before it starts (the preflight and the
# version checks run at once): the test puts a foreign process on the GPUs in between.
if [ "$1 $2" = "-m runners.simhost.server" ]; then
  while [ ! -e {gate} ]; do sleep 0.05; done
fi
exec {python} "$@"
"""


@pytest.mark.slow
def test_a_process_that_appears_on_the_gpus_during_a_trial_is_host_busy_never_pruned(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    python = tmp_path / "gated-python"
    python.write_text(GATED_PYTHON.format(gate=gate, python=sys.executable))
    python.chmod(0o755)
    space = make_space(tmp_path / "space.yaml")
    (tmp_path / "hosts.yaml").write_text(yaml.safe_dump({"hosts": [
        {"name": "local", "address": "local", "runs_root": str(tmp_path / "runs"), "python": str(python)}]}))
    storage = f"sqlite:///{tmp_path}/s.db"
    ctl = start_cli("run", str(space), "--study", "hog", "--storage", storage, "--no-mlflow", "--no-live",
                    "--confirm-top", "0", "--n-trials", "1", "--inventory", "hosts.yaml", cwd=tmp_path,
                    env=cli_env(tmp_path))
    hog = None
    try:
        wait_for("the first server's run directory", lambda: (study_runs(tmp_path / "runs", "hog") / "0" / "pgid")
                 .exists(), timeout=60)
        # After the preflight found the GPUs free, before the server looks at them: 80 GiB on GPU 0.
        hog = start_hog(tmp_path / ".servetune/simhost/state", 80 * 1024, gpus="0")
        gate.touch()
        first = wait_for("trial 0 to end", lambda: next((t for t in trials(storage, "hog")
                                                         if t.number == 0 and t.state.is_finished()), None),
                         timeout=120)
        stop_hog(hog)
        assert ctl.finish(240) == 0, ctl.output()
    finally:
        if hog is not None:
            stop_hog(hog)
        ctl.kill()
    facts = TrialFacts.from_trial(first)
    assert first.state == TrialState.FAIL, (first.state, facts.reason)
    assert facts.outcome == FailureKind.HOST_BUSY
    assert "another process appeared on the GPUs" in facts.reason and f"pid {hog.pid}" in facts.reason
    assert "out of memory" in facts.reason.lower(), "the engine's own error is kept"
    ts = trials(storage, "hog")
    assert not [t for t in ts if t.state == TrialState.PRUNED], "nothing is blamed on a configuration"
    assert ts[-1].state == TrialState.COMPLETE, "once the GPUs are free again the search goes on"
    assert live_servers(tmp_path / "runs") == []


# ---- lease files are data ---------------------------------------------------------------------------


def _cli_host(tmp_path: Path, space: Path, **env: str) -> Host:
    """A Host on the same simulated GPUs and host_dir as the CLI's local host in ``tmp_path``."""
    host = local_host(load_space(space), runs_root=str(tmp_path / "runs"), sim_dir=tmp_path / ".servetune/simhost",
                      host_dir=str(tmp_path / "hostdir"))
    host.env.update(env)
    return host


@pytest.mark.slow
def test_broken_and_future_lease_files_neither_crash_nor_hold_the_host(tmp_path: Path) -> None:
    """A string heartbeat, a null ttl, a huge pid, garbage: each ignored with one line naming the file. A
    heartbeat a year in the host's future (holding the claim) holds the host for one ttl, not a year."""
    space = make_space(tmp_path / "space.yaml")
    other = _cli_host(tmp_path, space)
    other.controller_id = "ctl-future"
    other.renew_lease(Lease("ctl-future", 4242, "elsewhere", "theirs", "sqlite:///x.db", 3,
                            machine="another-machine"))
    assert other.claim().ok
    folder = Path(other.gpu_dir()) / "leases"
    data = json.loads((folder / "ctl-future.json").read_text())
    (folder / "ctl-future.json").write_text(json.dumps({**data, "heartbeat": data["heartbeat"] + 365 * 86400}))
    broken = {"string-heartbeat": {**data, "heartbeat": "soon"}, "null-ttl": {**data, "ttl": None},
              "huge-pid": {**data, "pid": 10**30}}
    for name, bad in broken.items():
        (folder / f"{name}.json").write_text(json.dumps({**bad, "controller": name}))
    (folder / "garbage.json").write_bytes(b"\x00\xff{not json")

    check = cli("hosts", "check", "--space", str(space), cwd=tmp_path, env=cli_env(tmp_path, COLUMNS="400"))
    storage = f"sqlite:///{tmp_path}/s.db"
    res = cli("run", str(space), "--study", "leases", "--storage", storage, "--no-mlflow", "--no-live",
              "--confirm-top", "0", "--n-trials", "1", cwd=tmp_path)
    for out in (check.stdout + check.stderr, res.stdout + res.stderr):
        assert "Traceback" not in out, out
        for name in (*broken, "garbage"):
            assert sum(f"ignored lease file {folder}/{name}.json" in line for line in out.splitlines()) == 1, out
    assert res.returncode == 0, res.stdout + res.stderr
    # The first to look (hosts check) capped it in the file, so the run found it expired by then.
    assert "ctl-future.json" in check.stderr and "in the host's future" in check.stderr, check.stderr
    assert [t.state for t in trials(storage, "leases")] == [TrialState.COMPLETE], "the host was not held a year"


def test_a_cuda_visible_devices_split_is_two_gpu_sets(tmp_path: Path) -> None:
    """Two hosts on one machine, each given half of its GPUs (CUDA_VISIBLE_DEVICES in the inventory's env):
    two GPU sets, two claims; the same half by index or by UUID: one."""
    space = make_space(tmp_path / "space.yaml")
    whole = _cli_host(tmp_path, space)
    halves = [_cli_host(tmp_path, space, CUDA_VISIBLE_DEVICES=cvd) for cvd in ("0,1,2,3", "4,5,6,7")]
    assert len({whole.gpu_dir(), *(h.gpu_dir() for h in halves)}) == 3
    uuids = [line.split(",")[1].strip() for line in
             whole.run("nvidia-smi --query-gpu=index,uuid --format=csv,noheader").stdout.splitlines()[:4]]
    by_uuid = _cli_host(tmp_path, space, CUDA_VISIBLE_DEVICES=",".join(uuids))
    assert by_uuid.gpu_dir() == halves[0].gpu_dir()


# ---- run directories ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_studies_of_one_name_never_share_a_run_directory(tmp_path: Path) -> None:
    """Two clones' ``make demo`` (one study name, two databases) on one host and runs root."""
    space = make_space(tmp_path / "space.yaml")
    for db in ("one", "two"):
        res = cli("run", str(space), "--study", "demo", "--storage", f"sqlite:///{tmp_path}/{db}.db", "--no-mlflow",
                  "--no-live", "--confirm-top", "0", "--n-trials", "1", cwd=tmp_path)
        assert res.returncode == 0, res.stdout + res.stderr
    folders = sorted((tmp_path / "runs").glob("demo.*"))
    assert len(folders) == 2 and all((f / "0" / "server.log").exists() for f in folders)
    uids = {f.name for f in folders}
    for db in ("one", "two"):
        storage = open_storage(f"sqlite:///{tmp_path}/{db}.db")
        uids.discard(f"demo.{study_uid(storage, optuna.load_study(study_name='demo', storage=storage))}")
    assert uids == set(), "each folder is its study's"
