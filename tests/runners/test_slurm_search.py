"""Whole searches through a real Slurm cluster (Debian's slurm-wlm, started in a temp dir by
tests/fixtures/slurm.py), with the simulated GPU host as the server inside each job.

One node with 8 GPUs declared by count; the simulated profile serves at TP 4, so two trials fit at once and a
third waits in the queue. Covered: trials as parallel jobs (their directives and comments, the queue wait apart
from the start-up); a job cancelled from outside (FAIL ``scheduler``, never PRUNED); the node set DOWN mid-trial
(FAIL with Slurm's NODE_FAIL); a job past a real one-minute time limit (FAIL ``scheduler``, TIMEOUT, one line);
an OOM inside the job (PRUNED with its telemetry, as on any host); a directive Slurm rejects (FAIL ``host_config``, the cluster retired); a controller killed with SIGKILL and resumed (its job
cancelled, a job of the same user without servetune's comment left alone); Ctrl-C twice (running and queued jobs
gone); the login node reached over a real sshd. Every daemon is stopped by its PID; every job servetune left is
checked gone through ``squeue``.
"""

from __future__ import annotations

import os
import re
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from optuna.trial import FrozenTrial, TrialState

from runners.events import ServerReady
from runners.inventory import load_inventory
from runners.placement.registry import open_placements
from runners.slurm.jobs import ACTIVE
from search.driver.run import RunOptions, run_search
from search.storage import create_or_load, open_storage
from search.trial.objective import TrialEvent
from search.trial.records import TrialFacts
from spaces.schema import load_space
from tests.fixtures.runs import trial_dir
from tests.fixtures.slurm import SlurmCluster, start_slurm
from tests.fixtures.sshd import SshServer
from tests.search.overnight_kit import BASE, DIES, SURVIVES, cli_env, start_cli
from tests.search.overnight_kit import cli as kit_cli
from tests.search.overnight_kit import make_space as kit_make_space
from tests.search.overnight_kit import trials as kit_trials
from tests.search.overnight_kit import wait_for as kit_wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ALSO_SURVIVES = {**BASE, "mem_fraction_static": 0.60, "cuda_graph_max_bs": 64}
THIRD = {**BASE, "mem_fraction_static": 0.58, "cuda_graph_max_bs": 64}
SMALL = {"input_len": 128, "output_len": 96, "concurrency": [1, 8], "requests_per_level": [1, 8],
         "warmup_requests": 1}
SEED003 = {"input_len": 128, "output_len": 96, "concurrency": [1, 16, 64], "requests_per_level": [1, 16, 64],
           "warmup_requests": 1}
BUDGET = {"startup_timeout": "60s", "benchmark_timeout": "90s", "stop_grace": "5s"}
Hook = Callable[[int, TrialEvent], None]


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    cluster = start_slurm(nodes=("node1",), gpus_per_node=8, cpus=8)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster(slurm: SlurmCluster) -> Iterator[SlurmCluster]:
    """The module's cluster, its node back to idle and no job left after each test."""
    yield slurm
    left = [job for job in slurm.jobs() if job[1] in ACTIVE and job[2].startswith("servetune,")]
    for job_id, _, _ in left:
        slurm.run("scancel", job_id, check=False)
    if slurm.node_state("node1") != "idle":
        slurm.run("scontrol", "update", "nodename=node1", "state=resume", check=False)
    assert not left, f"jobs left behind: {left}"


def make_space(wd: Path, *, workload: dict[str, Any] | None = None, speed: float = 100) -> Path:
    return kit_make_space(wd / "space.yaml", speed=speed, workload=workload or SMALL, safe=False,
                          knobs={"nccl": {"NCCL_PROTO": ["unset", "LL"], "NCCL_ALGO": ["unset", "Ring"]}},
                          base_budget=BUDGET)


def inventory(wd: Path, cluster: SlurmCluster, login: dict[str, Any] | None = None, **slurm: Any) -> Path:
    """An inventory with the cluster as its one host; ``login``: how to reach the login node (this machine)."""
    entry = {"name": "cluster", "address": "local", **(login or {}), "runs_root": str(wd / "runs"),
             "env": cluster.env,
             "slurm": {"partition": "gpu", "time_limit": "00:10:00", "poll_interval": 0.5, **slurm}}
    path = wd / "inventory.yaml"
    path.write_text(yaml.safe_dump({"hosts": [entry]}))
    return path


def search(wd: Path, space_path: Path, inv: Path, enqueue: list[dict[str, Any]], *, n_trials: int,
           hook: Hook | None = None, study: str = "slurm") -> dict[int, FrozenTrial]:
    url = f"sqlite:///{wd}/servetune.db"
    st = create_or_load(open_storage(url), study)
    for params in enqueue:
        st.enqueue_trial(params)
    hosts = [h for spec in load_inventory(inv) for h in open_placements(spec, ssh_config=None)]
    options = RunOptions(study_name=study, storage_url=url, artifacts_dir=wd / "artifacts", n_trials=n_trials,
                         timeout=None, seed=3, smi_interval=0.5, hook=hook, confirm_k=0)
    try:
        summary = run_search(load_space(space_path), hosts, options)
    finally:
        for h in hosts:
            h.close()
    return {t.number: t for t in summary.study.get_trials()}


def job_of(wd: Path, study: str, trial: int) -> str:
    return (trial_dir(wd / "runs", study, trial) / "job_id").read_text().strip()


# ---- searches ----------------------------------------------------------------------------------


def test_trials_run_as_parallel_jobs_and_a_third_waits_in_the_queue(cluster: SlurmCluster, tmp_path: Path) -> None:
    space_path = make_space(tmp_path)
    inv = inventory(tmp_path, cluster, max_jobs=3)
    running: dict[int, set[str]] = {}
    lock = threading.Lock()

    def hook(number: int, event: TrialEvent) -> None:
        if isinstance(event, ServerReady):
            with lock:
                running[number] = {j for j, state, _ in cluster.jobs() if state == "RUNNING"}

    trials = search(tmp_path, space_path, inv, [SURVIVES, ALSO_SURVIVES, THIRD], n_trials=3, hook=hook)

    assert [t.state for t in trials.values()] == [TrialState.COMPLETE] * 3
    facts = {n: TrialFacts.from_trial(t) for n, t in trials.items()}
    assert {f.host for f in facts.values()} <= {"cluster#1", "cluster#2", "cluster#3"}
    jobs = {n: job_of(tmp_path, "slurm", n) for n in trials}
    assert len(set(jobs.values())) == 3  # one job per trial
    # Two jobs ran at once (8 GPUs, TP 4 each) ...
    assert any(len(seen) >= 2 for seen in running.values())
    # ... so the third waited in the queue, and that wait is not in its start-up time.
    assert max(f.queue_s or 0 for f in facts.values()) > 0
    for n, f in facts.items():
        run_dir = trial_dir(tmp_path / "runs", "slurm", n)
        script = (run_dir / "job.sbatch").read_text()
        assert "#SBATCH --gres=gpu:4" in script and "#SBATCH --nodes=1" in script
        # The comment names the study and its id (the run folder), so recovery finds this study's jobs.
        assert run_dir.parent.name.startswith("slurm.") and run_dir.parent.name != "slurm."
        assert f"#SBATCH --comment=servetune,study={run_dir.parent.name},trial={n}," in script
        assert "#SBATCH --partition=gpu" in script and "#SBATCH --time=00:10:00" in script
        assert f.stop_method == "term"
        assert (trial_dir(tmp_path / "runs", "slurm", n) / "exit_code").is_file()
        assert "servetune simulated host" in (trial_dir(tmp_path / "runs", "slurm", n) / "server.log").read_text()
    assert not [j for j in cluster.jobs() if j[0] in jobs.values() and j[1] not in ("COMPLETED",)]
    # The correctness gate's reference server is a job with the trial's GPUs too (without them Slurm packed it
    # beside the trials' jobs on GPUs they held, and it died of OOM loading its weights).
    references = sorted((tmp_path / "runs").glob("slurm.*/*-reference/job.sbatch"))
    assert references and all("#SBATCH --gres=gpu:4" in p.read_text() for p in references)


def test_a_job_cancelled_from_outside_is_fail_with_slurms_reason(cluster: SlurmCluster, tmp_path: Path) -> None:
    space_path = make_space(tmp_path, workload=SEED003, speed=30)  # a sweep long enough to be cut
    inv = inventory(tmp_path, cluster)
    cancelled: list[str] = []

    def hook(number: int, event: TrialEvent) -> None:
        if number == 0 and isinstance(event, ServerReady) and not cancelled:
            cancelled.append(job_of(tmp_path, "slurm", 0))
            cluster.run("scancel", cancelled[0])  # someone else (an admin, the user by hand) cancels it

    trials = search(tmp_path, space_path, inv, [SURVIVES, ALSO_SURVIVES], n_trials=1, hook=hook)

    t = trials[0]
    facts = TrialFacts.from_trial(t)
    assert t.state == TrialState.FAIL  # Slurm's doing, not the configuration's: never PRUNED
    assert facts.outcome == "scheduler"
    assert f"job {cancelled[0]} CANCELLED" in facts.reason and "cancelled by someone else" in facts.reason
    assert any(x.state == TrialState.COMPLETE for x in trials.values())  # the search went on


def test_the_node_set_down_mid_trial_is_fail_node_fail(cluster: SlurmCluster, tmp_path: Path) -> None:
    space_path = make_space(tmp_path, workload=SEED003, speed=30)  # a sweep long enough to be cut
    inv = inventory(tmp_path, cluster)
    downed: list[bool] = []

    def hook(number: int, event: TrialEvent) -> None:
        if number == 0 and isinstance(event, ServerReady) and not downed:
            downed.append(True)
            cluster.set_node("node1", "down", "servetune test: node lost")

    trials = search(tmp_path, space_path, inv, [SURVIVES], n_trials=1, hook=hook)

    t = trials[0]
    facts = TrialFacts.from_trial(t)
    assert downed and t.state == TrialState.FAIL
    assert facts.outcome == "scheduler"
    assert "NODE_FAIL" in facts.reason and "a node of the job failed" in facts.reason
    assert facts.memory.oom_phase is None  # no false OOM


def test_a_job_past_its_time_limit_is_fail_scheduler_in_one_line(cluster: SlurmCluster, tmp_path: Path) -> None:
    # A sweep far longer than the job's real one-minute --time, and budgets longer still: Slurm's limit, not
    # servetune's, ends the trial (slurmctld checks limits about every 30 s, so the job ends 60-90 s in).
    space_path = kit_make_space(tmp_path / "space.yaml", speed=2, workload=SEED003, safe=False, base_budget={
        "startup_timeout": "600s", "benchmark_timeout": "900s", "stop_grace": "5s"})
    data = yaml.safe_load(space_path.read_text())
    data["correctness"] = {"enabled": False}  # no reference server: the trial's own job meets the limit
    space_path.write_text(yaml.safe_dump(data))
    inv = inventory(tmp_path, cluster, time_limit="00:01:00")

    trials = search(tmp_path, space_path, inv, [SURVIVES], n_trials=1)

    t = trials[0]
    facts = TrialFacts.from_trial(t)
    job = job_of(tmp_path, "slurm", 0)
    assert t.state == TrialState.FAIL  # the scheduler's limit, not the configuration's fault: never PRUNED
    assert facts.outcome == "scheduler"
    assert f"Slurm job {job} TIMEOUT" in facts.reason and "the job reached its time limit" in facts.reason
    assert "\n" not in facts.reason  # one line
    assert facts.memory.oom_phase is None
    assert "#SBATCH --time=00:01:00" in (trial_dir(tmp_path / "runs", "slurm", 0) / "job.sbatch").read_text()
    assert {s for j, s, _ in cluster.jobs() if j == job} == {"TIMEOUT"}


def test_an_oom_inside_the_job_is_pruned_with_its_telemetry(cluster: SlurmCluster, tmp_path: Path) -> None:
    space_path = make_space(tmp_path, workload=SEED003)
    inv = inventory(tmp_path, cluster)

    trials = search(tmp_path, space_path, inv, [DIES], n_trials=1)

    t = trials[0]
    facts = TrialFacts.from_trial(t)
    assert t.state == TrialState.PRUNED
    assert facts.outcome == "oom" and facts.oom_phase == "decode"
    assert (facts.memory.tried_to_allocate_gib or 0) > 0
    assert "CUDA out of memory" in (facts.log_tail or "")


@pytest.mark.timeout(600)  # two whole runs, each trial with the gate's reference job: minutes on a loaded machine
def test_a_controller_killed_with_sigkill_leaves_no_job_after_the_next_run(cluster: SlurmCluster,
                                                                            tmp_path: Path) -> None:
    space_path = make_space(tmp_path)
    inv = inventory(tmp_path, cluster)
    storage = f"sqlite:///{tmp_path}/servetune.db"
    create_or_load(open_storage(storage), "slurm").enqueue_trial(SURVIVES)
    args = ("run", str(space_path), "--study", "slurm", "--storage", storage, "--no-mlflow", "--no-live",
            "--inventory", str(inv), "--n-trials", "2", "--seed", "1")
    first = start_cli(*args, cwd=tmp_path, log="killed.log")
    job = kit_wait_for("trial 0's job", lambda: (trial_dir(tmp_path / "runs", "slurm", 0) / "job_id").exists()
                       and job_of(tmp_path, "slurm", 0), timeout=60)
    kit_wait_for("the job running", lambda: (job, "RUNNING") in {(j, s) for j, s, _ in cluster.jobs()},
                 timeout=60)
    os.kill(first.pid, signal.SIGKILL)  # kill -9: no cleanup of any kind
    first.proc.wait(10)
    assert (job, "RUNNING") in {(j, s) for j, s, _ in cluster.jobs()}, "the job outlives its controller"
    # Another user's job and another live controller's are never touched: a job of this user without
    # servetune's comment runs beside it and is left alone.
    other = cluster.run("sbatch", "--parsable", "--gres=gpu:1", "-o", "/dev/null", "--comment=not-servetune",
                        "--wrap", "sleep 300").stdout.strip()

    res = kit_cli(*args, cwd=tmp_path, timeout=480, env=cli_env(tmp_path))

    assert res.returncode == 0, res.stdout + res.stderr
    states = {j: s for j, s, _ in cluster.jobs()}
    assert states.get(job) == "CANCELLED"  # the orphan was cancelled by the recovery
    assert states.get(other) in ("RUNNING", "PENDING")
    cluster.run("scancel", other)
    kit_wait_for("the other job gone", lambda: other not in {j for j, s, _ in cluster.jobs() if s in ACTIVE})
    assert [j for j, s, comment in cluster.jobs() if comment.startswith("servetune,") and s in ACTIVE] == []


def test_a_directive_slurm_rejects_is_fail_and_retires_the_cluster(cluster: SlurmCluster, tmp_path: Path) -> None:
    space_path = make_space(tmp_path)
    inv = inventory(tmp_path, cluster, directives=["--constraint=no-such-feature"])

    trials = search(tmp_path, space_path, inv, [SURVIVES], n_trials=2)

    t = trials[0]
    facts = TrialFacts.from_trial(t)
    assert t.state == TrialState.FAIL and facts.outcome == "host_config"
    assert "sbatch" in facts.reason and "fix: correct the slurm: settings" in facts.reason
    assert len(trials) == 1  # the cluster is retired: waiting will not make Slurm accept it
    assert not [j for j, s, comment in cluster.jobs() if comment.startswith("servetune,") and s in ACTIVE]


@pytest.mark.timeout(600)
def test_ctrl_c_twice_leaves_no_job_running_or_queued(cluster: SlurmCluster, tmp_path: Path) -> None:
    space_path = make_space(tmp_path, workload=SEED003, speed=20)  # trials long enough to be interrupted
    inv = inventory(tmp_path, cluster, max_jobs=3)
    storage = f"sqlite:///{tmp_path}/servetune.db"
    args = ("run", str(space_path), "--study", "slurm", "--storage", storage, "--no-mlflow", "--no-live",
            "--inventory", str(inv), "--n-trials", "6", "--seed", "1")
    ctl = start_cli(*args, cwd=tmp_path, log="ctl.log")

    def ours() -> dict[str, str]:
        return {j: s for j, s, comment in cluster.jobs() if comment.startswith("servetune,") and s in ACTIVE}

    def two_running_one_queued() -> dict[str, str] | None:
        jobs = ours()
        return jobs if sorted(jobs.values()) == ["PENDING", "RUNNING", "RUNNING"] else None

    # Two jobs run (8 GPUs, TP 4 each) and a third waits in the queue (trials' own jobs or the correctness
    # gate's reference jobs: each is a job with the trial's GPUs).
    seen = kit_wait_for("two jobs running and one queued", two_running_one_queued, timeout=180)
    queued = next(j for j, s in seen.items() if s == "PENDING")
    ctl.proc.send_signal(signal.SIGINT)
    kit_wait_for("the first SIGINT noted", lambda: "SIGINT: finishing the running trials" in ctl.output())
    ctl.proc.send_signal(signal.SIGINT)  # the second aborts the running trials and the queued one
    kit_wait_for("the second SIGINT noted", lambda: "second SIGINT: aborting" in ctl.output())
    assert ctl.finish(180) == 130, ctl.output()
    assert ours() == {}
    out = ctl.output()
    assert "stoppedby:aborted" in "".join(out.split())
    # Every trial still running at the second SIGINT is interrupted, the one whose job was queued among them; a
    # trial that ended before it (on a loaded machine one may) says so in the log before that line.
    before = out.partition("second SIGINT: aborting")[0]
    ended = {int(n) for n in re.findall(r"^trial (\d+): (?:COMPLETE|FAIL|PRUNED)\b", before, re.MULTILINE)}
    outcomes = {t.number: TrialFacts.from_trial(t).outcome for t in kit_trials(storage, "slurm")}
    aborted = {n: o for n, o in outcomes.items() if n not in ended}
    assert aborted and set(aborted.values()) == {"interrupted"}, outcomes
    owner = next(p for p in (tmp_path / "runs").glob("slurm.*/*/job_id") if p.read_text().strip() == queued)
    assert int(owner.parent.name.split("-")[0]) in aborted  # its trial number (a reference's folder: N-reference)


@pytest.mark.ssh
def test_a_search_through_a_login_node_over_ssh(cluster: SlurmCluster, tmp_path: Path, sshd: SshServer,
                                                 known_hosts: Path) -> None:
    space_path = make_space(tmp_path)
    login = sshd.spec(known_hosts).model_dump(include={"address", "port", "user", "key_file", "known_hosts"})
    inv = inventory(tmp_path, cluster, login)
    logins = sshd.log.read_text().count("Accepted publickey")

    trials = search(tmp_path, space_path, inv, [SURVIVES], n_trials=1)

    t = trials[0]
    assert t.state == TrialState.COMPLETE, TrialFacts.from_trial(t).reason
    assert TrialFacts.from_trial(t).stop_method == "term"
    assert "#SBATCH --gres=gpu:4" in (trial_dir(tmp_path / "runs", "slurm", 0) / "job.sbatch").read_text()
    assert sshd.log.read_text().count("Accepted publickey") > logins  # sbatch, srun, squeue went through sshd
