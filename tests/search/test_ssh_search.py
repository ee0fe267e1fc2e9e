"""Whole searches over a real OpenSSH server, with the simulated GPU host behind it.

Every host here is a real sshd on a loopback address (tests/fixtures/sshd.py); behind it run the
simulated SGLang server and the simulated nvidia-smi, installed per host (its own state directory, bin
directory and runs_root: the hosts share this machine's filesystem). Trials are enqueued so the outcomes
are the seed incidents, not luck: 0.70 / --cuda-graph-max-bs 32 dies in eager decode at C=64 (seed 003),
0.62 / 64 serves it.

Covered: a search with an OOM and a completed trial; sshd killed mid-trial (FAIL host_unreachable, not
PRUNED; the orphaned server stopped by the next preflight once the host is back); a server that ignores
SIGTERM (SIGKILL); a foreign process on the GPU (FAIL host_busy, no false OOM); two hosts running two
trials at once; ``servetune hosts check`` and ``servetune run`` over SSH. Every sshd is stopped by its PID
(the fixtures); every server by its recorded process group.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from optuna.trial import FrozenTrial, TrialState

from runners.events import LevelDone, PhaseReached
from runners.host import Host
from runners.inventory import HostSpec, open_host
from search.driver.hosts import sim_env
from search.driver.run import RunOptions, run_search
from search.storage import create_or_load, open_storage
from search.trial.objective import Ended, TrialEvent
from search.trial.records import TrialFacts
from spaces.schema import Space, load_space
from tests.fixtures.hog import start_hog, stop_hog
from tests.fixtures.ports import free_port
from tests.fixtures.runs import trial_dir
from tests.fixtures.sshd import SshServer, write_known_hosts
from tests.search.overnight_kit import BASE, DIES, SEED003, SURVIVES
from tests.search.overnight_kit import cli as kit_cli
from tests.search.overnight_kit import make_space as kit_make_space

pytestmark = [pytest.mark.ssh, pytest.mark.slow]  # real searches over a real sshd

ALSO_SURVIVES = {**BASE, "mem_fraction_static": 0.60, "cuda_graph_max_bs": 64}
SSH_BUDGET = {"startup_timeout": "40s", "benchmark_timeout": "60s", "stop_grace": "5s"}
SMALL = {"input_len": 128, "output_len": 96, "concurrency": [1, 8], "requests_per_level": [1, 8],
         "warmup_requests": 1}
Hook = Callable[[int, TrialEvent], None]


# ---- helpers ------------------------------------------------------------------------------------


def make_space(wd: Path, *, workload: dict[str, Any] | None = None, fixed_args: list[str] | None = None,
               budget: dict[str, Any] | None = None) -> Path:
    """``wd/space.yaml``: the demo's knobs with two NCCL choices each, seed 003's workload by default."""
    return kit_make_space(wd / "space.yaml", speed=100, workload=workload or SEED003, budget=budget, safe=False,
                          knobs={"nccl": {"NCCL_PROTO": ["unset", "LL"], "NCCL_ALGO": ["unset", "Ring"]}},
                          fixed_args=fixed_args or (), base_budget=SSH_BUDGET)


class SimBox:
    """One simulated GPU host behind an sshd: its spec, nvidia-smi env, and helpers to look at it."""

    def __init__(self, server: SshServer, known: Path, space: Space, wd: Path, label: str,
                 **fields: Any) -> None:
        self.env = sim_env(space, wd / f"sim-{label}")
        self.runs_root = wd / f"runs-{label}"
        self.spec = server.spec(known, env=self.env, runs_root=str(self.runs_root), **fields)

    def open(self) -> Host:
        return open_host(self.spec, ssh_config=None)

    @property
    def state(self) -> str:
        return self.env["SERVETUNE_SIM_STATE"]

    def gpu_pids(self) -> set[int]:
        """PIDs holding simulated GPU memory, as this host's nvidia-smi reports them."""
        smi = self.env["PATH"].split(":")[0] + "/nvidia-smi"
        res = subprocess.run([smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, check=True)
        return {int(line.split(",")[0]) for line in res.stdout.splitlines() if line.strip()}

    def run_dir(self, study: str, trial: int) -> Path:
        return trial_dir(self.runs_root, study, trial)

    def cleanup(self) -> None:
        """Stop (by recorded process group) whatever a failed test left running under this runs_root."""
        local = HostSpec(address="local", name=self.spec.name, runs_root=str(self.runs_root))
        open_host(local).cleanup_orphans(grace=1)


@pytest.fixture
def boxes() -> Iterator[list[SimBox]]:
    made: list[SimBox] = []
    yield made
    for box in made:
        box.cleanup()


def group(pgid: int) -> list[int]:
    """Live members of process group ``pgid`` on this machine (read from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(entry))
    return found


def search(wd: Path, space_path: Path, hosts: list[Host], enqueue: list[dict[str, Any]], *, n_trials: int,
           hook: Hook | None = None, study: str = "ssh") -> dict[int, FrozenTrial]:
    url = f"sqlite:///{wd}/servetune.db"
    st = create_or_load(open_storage(url), study)
    for params in enqueue:
        st.enqueue_trial(params)
    options = RunOptions(study_name=study, storage_url=url, artifacts_dir=wd / "artifacts", n_trials=n_trials,
                         timeout=None, seed=3, smi_interval=0.2, hook=hook,
                         confirm_k=0)  # exactly the queued trials: no confirmation launches
    try:
        summary = run_search(load_space(space_path), hosts, options)
    finally:
        for h in hosts:
            h.close()
    return {t.number: t for t in summary.study.get_trials()}


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
    env.update(HOME=str(cwd), COLUMNS="240")  # no agent, no ~/.ssh of the machine running the tests
    return kit_cli(*args, cwd=cwd, timeout=240, env=env)


def inventory(path: Path, *boxes: SimBox, names: list[str]) -> Path:
    hosts = [{**box.spec.model_dump(exclude_defaults=True), "name": name}
             for box, name in zip(boxes, names, strict=True)]
    path.write_text(yaml.safe_dump({"hosts": hosts}))
    return path


# ---- searches ----------------------------------------------------------------------------------


def test_search_over_ssh_prunes_the_oom_and_completes_the_survivor(
    sshd: SshServer, known_hosts: Path, tmp_path: Path, boxes: list[SimBox]
) -> None:
    space_path = make_space(tmp_path)
    box = SimBox(sshd, known_hosts, load_space(space_path), tmp_path, "a")
    boxes.append(box)
    logins = sshd.log.read_text().count("Accepted publickey")
    trials = search(tmp_path, space_path, [box.open()], [DIES, SURVIVES], n_trials=2)

    oom, ok = trials[0], trials[1]
    assert oom.state == TrialState.PRUNED
    assert TrialFacts.from_trial(oom).outcome == "oom" and TrialFacts.from_trial(oom).oom_phase == "decode"
    assert TrialFacts.from_trial(oom).level_reached == 0  # fail fast: C=64, the target, runs first and kills it
    assert TrialFacts.from_trial(oom).memory.tried_to_allocate_gib > 0
    assert "CUDA out of memory" in (TrialFacts.from_trial(oom).log_tail or "")
    assert ok.state == TrialState.COMPLETE
    c64 = next(lv.stored() for lv in TrialFacts.from_trial(ok).levels if lv.max_concurrency == 64)
    assert c64["completed"] == 64 and c64["failed"] == 0 and ok.value == pytest.approx(c64["output_throughput"])
    assert TrialFacts.from_trial(ok).stop_method == "term"
    for t in (oom, ok):
        assert TrialFacts.from_trial(t).host == box.spec.name == f"127.0.0.1:{sshd.port}"
        run = box.run_dir("ssh", t.number)
        assert (run / "launch.sh").is_file() and (run / "server.log").read_text()
        assert (run / "exit_code").is_file() and not (run / "scratch").exists()
        assert not group(int((run / "pgid").read_text()))
    assert sshd.log.read_text().count("Accepted publickey") > logins  # it really went through sshd
    assert box.gpu_pids() == set()  # no simulated GPU memory left held


def test_sshd_killed_mid_trial_is_fail_and_its_orphan_is_stopped_when_the_host_is_back(
    sshd_factory: Callable[[str], SshServer], tmp_path: Path, boxes: list[SimBox]
) -> None:
    server = sshd_factory("127.0.0.1")
    known = write_known_hosts(tmp_path / "known_hosts", server)
    space_path = make_space(tmp_path)
    box = SimBox(server, known, load_space(space_path), tmp_path, "a")
    boxes.append(box)
    seen: dict[str, Any] = {}

    def hook(number: int, event: TrialEvent) -> None:
        if number == 0 and isinstance(event, LevelDone) and "pgid" not in seen:
            server.stop()  # sshd and every connection gone while the load generator runs
            pgid = int((box.run_dir("ssh", 0) / "pgid").read_text())
            seen.update(pgid=pgid, members=group(pgid), gpu=box.gpu_pids())
        elif number == 0 and isinstance(event, Ended):
            seen["orphan_at_outcome"] = group(seen["pgid"])
            server.start()  # the host comes back before the next trial
        elif number == 1 and isinstance(event, PhaseReached) and "orphan_at_next_start" not in seen:
            seen["orphan_at_next_start"] = group(seen["pgid"])
            seen["gpu_at_next_start"] = box.gpu_pids()

    trials = search(tmp_path, space_path, [box.open()], [SURVIVES, SURVIVES], n_trials=1, hook=hook)

    lost = trials[0]
    assert lost.state == TrialState.FAIL  # infrastructure, not the config: the sampler learns nothing
    assert TrialFacts.from_trial(lost).outcome == "host_unreachable"
    assert TrialFacts.from_trial(lost).memory.oom_phase is None
    assert TrialFacts.from_trial(lost).stop_error  # the stop could not reach the host
    # The detached server outlived the connection and held its simulated GPU memory ...
    assert seen["members"] and seen["orphan_at_outcome"]
    assert seen["gpu"] & set(seen["members"])
    # ... until the next trial's preflight stopped it by its recorded group.
    assert seen["orphan_at_next_start"] == []
    assert not seen["gpu_at_next_start"] & set(seen["members"])
    assert (box.run_dir("ssh", 0) / "exit_code").is_file()
    assert not (box.run_dir("ssh", 0) / "scratch").exists()
    again = trials[1]
    assert again.state == TrialState.COMPLETE and again.params == lost.params
    assert box.gpu_pids() == set()


def test_server_that_ignores_sigterm_gets_sigkill(
    sshd: SshServer, known_hosts: Path, tmp_path: Path, boxes: list[SimBox]
) -> None:
    space_path = make_space(tmp_path, workload=SMALL, fixed_args=["--sim-ignore-sigterm"],
                            budget={"stop_grace": "2s"})
    box = SimBox(sshd, known_hosts, load_space(space_path), tmp_path, "a")
    boxes.append(box)
    trials = search(tmp_path, space_path, [box.open()], [SURVIVES], n_trials=1)

    t = trials[0]
    assert t.state == TrialState.COMPLETE
    assert "--sim-ignore-sigterm" in TrialFacts.from_trial(t).argv
    # Escalated: TERM, TERM at half the grace, then KILL at its end. (How long that took, ``stop_s``, is a
    # wall-clock figure and not asserted; the server ignores SIGTERM silently, so nothing else shows the TERMs.)
    assert TrialFacts.from_trial(t).stop_method == "kill"
    assert TrialFacts.from_trial(t).stop_error is None
    run = box.run_dir("ssh", 0)
    assert not group(int((run / "pgid").read_text()))
    assert not (run / "exit_code").exists()  # the wrapper was killed too, before it could write one
    assert box.gpu_pids() == set()


def test_foreign_gpu_process_makes_the_host_busy_without_a_false_oom(
    sshd: SshServer, known_hosts: Path, tmp_path: Path, boxes: list[SimBox]
) -> None:
    space_path = make_space(tmp_path, workload=SMALL)
    box = SimBox(sshd, known_hosts, load_space(space_path), tmp_path, "a")
    boxes.append(box)
    hog = start_hog(box.state, 20000, "0,1,2,3")

    def hook(number: int, event: TrialEvent) -> None:
        if number == 0 and isinstance(event, Ended):
            stop_hog(hog)  # the foreign process leaves; the next trial may run

    try:
        trials = search(tmp_path, space_path, [box.open()], [SURVIVES, SURVIVES], n_trials=1, hook=hook)
    finally:
        stop_hog(hog)

    busy = trials[0]
    assert busy.state == TrialState.FAIL
    assert TrialFacts.from_trial(busy).outcome == "host_busy"
    assert str(hog.pid) in TrialFacts.from_trial(busy).reason
    assert not TrialFacts.from_trial(busy).memory  # no memory verdict from a shared GPU
    assert not box.run_dir("ssh", 0).exists()  # no server was started next to the foreign process
    free = trials[1]
    assert free.state == TrialState.COMPLETE and free.params == busy.params  # the config was never at fault
    assert not [t for t in trials.values() if t.state == TrialState.PRUNED]


def test_two_hosts_run_two_trials_at_the_same_time(
    sshd_b: SshServer, sshd_c: SshServer, tmp_path: Path, boxes: list[SimBox]
) -> None:
    known = write_known_hosts(tmp_path / "known_hosts", sshd_b, sshd_c)
    space_path = make_space(tmp_path, workload={**SMALL, "concurrency": [1, 16], "requests_per_level": [1, 16]})
    space = load_space(space_path)
    # One machine plays both hosts, so each binds its own server port (see HostSpec.server_port).
    # Host c keeps its engine's python elsewhere (HostSpec.python): a wrapper only it uses.
    python_c = tmp_path / "python-c"
    python_c.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python_c.chmod(0o755)
    b = SimBox(sshd_b, known, space, tmp_path, "b", server_port=free_port())
    c = SimBox(sshd_c, known, space, tmp_path, "c", server_port=free_port(), python=str(python_c))
    boxes.extend([b, c])
    # Two configurations (the same one twice would wait for its twin rather than run beside it).
    trials = search(tmp_path, space_path, [b.open(), c.open()], [SURVIVES, ALSO_SURVIVES], n_trials=2)

    ran = list(trials.values())
    assert len(ran) == 2 and all(t.state == TrialState.COMPLETE for t in ran)
    assert {TrialFacts.from_trial(t).host for t in ran} == {b.spec.name, c.spec.name}
    first, second = ran
    assert first.datetime_start and first.datetime_complete and second.datetime_start and second.datetime_complete
    assert first.datetime_start < second.datetime_complete and second.datetime_start < first.datetime_complete
    for t in ran:
        box = b if TrialFacts.from_trial(t).host == b.spec.name else c
        assert TrialFacts.from_trial(t).launch_config.port == box.spec.server_port
        assert TrialFacts.from_trial(t).launch_config.python == (str(python_c) if box is c else space.engine.python)
        launch_sh = (box.run_dir("ssh", t.number) / "launch.sh").read_text()
        assert (f"exec {python_c} -m" in launch_sh) == (box is c)
        assert (box.run_dir("ssh", t.number) / "server.log").read_text()
    assert b.gpu_pids() == set() and c.gpu_pids() == set()


# ---- the CLI over SSH ---------------------------------------------------------------------------


def test_cli_hosts_check_reports_free_busy_and_unreachable_hosts(
    sshd_c: SshServer, tmp_path: Path, boxes: list[SimBox]
) -> None:
    known = write_known_hosts(tmp_path / "known_hosts", sshd_c)
    space_path = make_space(tmp_path, workload=SMALL)
    box = SimBox(sshd_c, known, load_space(space_path), tmp_path, "c")
    boxes.append(box)
    inv = inventory(tmp_path / "hosts.yaml", box, names=["gpu-sim"])

    res = cli("hosts", "check", "--space", str(space_path), "--inventory", str(inv), cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    row = next(line for line in res.stdout.splitlines() if "gpu-sim" in line)
    cells = re.split(r"\s{2,}", row.strip())  # host, reachable, engine, GPUs, free MiB, busy, held by, error
    assert cells[1:3] == ["yes", "sim 0.5.10"]
    assert "RTX PRO 6000" in cells[3] and "(simulated)" in cells[3]
    assert cells[5:8] == ["no", "nobody", "-"]

    hog = start_hog(box.state, 20000, "0,1,2,3")
    dead = free_port("127.0.0.3")  # nothing listens there
    try:
        res = cli("hosts", "check", "--space", str(space_path), "--inventory", str(inv),
                  "--host", f"root@127.0.0.3:{dead}", cwd=tmp_path)
    finally:
        stop_hog(hog)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    busy = next(line for line in res.stdout.splitlines() if "gpu-sim" in line)
    assert "compute processes" in busy and str(hog.pid) in busy
    down = re.split(r"\s{2,}", next(line for line in res.stdout.splitlines()
                                    if f"127.0.0.3:{dead}" in line).strip())
    assert down[1:7] == ["no", "-", "-", "-", "-", "-"] and "127.0.0.3" in down[7]  # the error column


def test_cli_run_over_ssh_then_export(sshd_b: SshServer, tmp_path: Path, boxes: list[SimBox]) -> None:
    known = write_known_hosts(tmp_path / "known_hosts", sshd_b)
    space_path = make_space(tmp_path, workload=SMALL)
    box = SimBox(sshd_b, known, load_space(space_path), tmp_path, "b")
    boxes.append(box)
    inv = inventory(tmp_path / "hosts.yaml", box, names=["gpu-box"])
    storage = f"sqlite:///{tmp_path}/servetune.db"
    create_or_load(open_storage(storage), "cli-ssh").enqueue_trial(SURVIVES)

    res = cli("run", str(space_path), "--study", "cli-ssh", "--storage", storage, "--inventory", str(inv),
              "--n-trials", "1", "--no-mlflow", "--no-live", "--artifacts-dir", str(tmp_path / "art"),
              "--confirm-top", "0", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "on gpu-box" in res.stdout and "best" in res.stdout
    study = optuna.load_study(study_name="cli-ssh", storage=storage)
    (t,) = study.trials
    assert t.state == TrialState.COMPLETE and TrialFacts.from_trial(t).host == "gpu-box"
    assert (box.run_dir("cli-ssh", 0) / "server.log").read_text()

    out = tmp_path / "serve.sh"
    res = cli("export", "--study", "cli-ssh", "--storage", storage, "--min-free-gib", "0", "-o", str(out),
              cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "--mem-fraction-static 0.62" in out.read_text()
    assert box.gpu_pids() == set()

