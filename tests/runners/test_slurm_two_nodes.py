"""A server spanning two nodes through a real Slurm cluster of two slurmd nodes (tests/fixtures/slurm.py), with
the simulated GPU host as both ranks: one job of two nodes per trial, rank 0 in the batch script on the head
node, rank 1 started as a step of the same job on the second node (``srun --overlap --nodelist``).

Both fake nodes are this machine, so each node's simulated GPUs are told apart by the node's name: the
inventory's environment names ``$SERVETUNE_NODE``, which servetune exports on every node of a job before the
host's environment. Node 2 has 900 MiB of every GPU held by a process nvidia-smi does not list, so at
``--mem-fraction-static 0.89`` rank 1 alone runs out in CUDA-graph capture (as benchmarks/two_nodes.py shows on
two SSH hosts): the trial is PRUNED ``oom`` and the verdict names rank 1.

The same cluster then runs a search by the ``servetune`` CLI, as docs/multi-node.md shows it
(benchmarks/slurm_two_nodes.py): ``servetune run`` with a
Slurm inventory, then ``servetune export`` of the trial, which is the one script every node runs with its rank,
headed with the card nvidia-smi named on the job's node: the trial records that card, not sinfo's GRES type
(``gpu``), which is all the preflight on the login node sees.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from optuna.trial import TrialState

from runners.inventory import load_inventory
from runners.placement.registry import open_placements
from runners.slurm.jobs import ACTIVE
from search.driver.hosts import sim_env
from search.driver.run import RunOptions, run_search
from search.storage import create_or_load, open_storage
from search.trial.records import TrialFacts
from spaces.schema import load_space
from tests.fixtures.ports import free_port
from tests.fixtures.runs import trial_dir
from tests.fixtures.slurm import SlurmCluster, start_slurm
from tests.search.overnight_kit import cli, cli_env

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "runners/simhost/profiles/deepseek-v3-tp16-2x8-h100.yaml"


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[SlurmCluster]:
    cluster = start_slurm(nodes=("node1", "node2"), gpus_per_node=8, cpus=8)
    try:
        yield cluster
    finally:
        cluster.stop()


def space_file(wd: Path) -> Path:
    data = {
        "name": "dsv3-two-nodes-slurm",
        "engine": {"kind": "sim", "python": sys.executable, "version": "0.5.10",
                   "sim": {"profile": str(PROFILE), "speed": 50, "seed": 1}},
        "model_path": "deepseek-ai/DeepSeek-V3",
        "port": free_port(),
        "nodes": 2,
        "fixed_args": ["--tp", "16", "--trust-remote-code", "--dist-timeout", "600"],
        "knobs": {"mem_fraction_static": {"low": 0.85, "high": 0.90, "step": 0.01}},
        "correctness": {"enabled": False},
        "workload": {"input_len": 128, "output_len": 32, "concurrency": [1, 4], "requests_per_level": [1, 4],
                     "warmup_requests": 0},
        "objective": {"metric": "output_throughput", "level": 4},
        "budget": {"startup_timeout": "300s", "benchmark_timeout": "300s", "stop_grace": "5s"},
    }
    path = wd / "space.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def inventory(wd: Path, cluster: SlurmCluster, **slurm: object) -> Path:
    """Each node's own simulated GPUs (the login node's for the preflight, then node1's and node2's, told apart by
    ``$SERVETUNE_NODE``) and an inventory of the cluster as one host."""
    space = load_space(wd / "space.yaml")
    sim = wd / "sim"
    for where in ("", "node1", "node2"):
        sim_env(space, sim / where)
    env = {**cluster.env, "PATH": f"{sim}/$SERVETUNE_NODE/bin:$PATH", "SERVETUNE_SIM_STATE": f"{sim}/$SERVETUNE_NODE/state"}
    inv = wd / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"hosts": [{
        "name": "cluster", "address": "local", "runs_root": str(wd / "runs"), "env": env, "python": sys.executable,
        "slurm": {"partition": "gpu", "time_limit": "00:10:00", "poll_interval": 0.5, **slurm}}]}))
    return inv


def test_a_two_node_server_is_one_job_and_a_rank_1_oom_is_pruned_naming_the_rank(two_nodes: SlurmCluster,
                                                                                 tmp_path: Path) -> None:
    space_path = space_file(tmp_path)
    space = load_space(space_path)
    sim = tmp_path / "sim"
    inv = inventory(tmp_path, two_nodes, gpu_memory_mib=81559)
    hog = subprocess.Popen([sys.executable, "-m", "runners.simhost.hog", "--mib", "900", "--gpus",
                            "0,1,2,3,4,5,6,7", "--state-dir", str(sim / "node2" / "state"), "--hidden"],
                           cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True)
    url = f"sqlite:///{tmp_path}/servetune.db"
    study = create_or_load(open_storage(url), "two")
    study.enqueue_trial({"mem_fraction_static": 0.89})
    study.enqueue_trial({"mem_fraction_static": 0.85})
    hosts = [h for spec in load_inventory(inv) for h in open_placements(spec, ssh_config=None)]
    try:
        assert hog.stdout is not None
        hog.stdout.readline()  # registered on node 2's GPUs
        options = RunOptions(study_name="two", storage_url=url, artifacts_dir=tmp_path / "artifacts", n_trials=2,
                             timeout=None, seed=3, smi_interval=0.5, confirm_k=0)
        summary = run_search(space, hosts, options)
    finally:
        for h in hosts:
            h.close()
        os.kill(hog.pid, signal.SIGTERM)
        hog.wait(10)
        if hog.stdout is not None:
            hog.stdout.close()
    trials = {t.number: t for t in summary.study.get_trials()}

    oom, ok = TrialFacts.from_trial(trials[0]), TrialFacts.from_trial(trials[1])
    assert trials[0].state == TrialState.PRUNED, oom.reason
    assert oom.outcome == "oom" and oom.died_first == 1
    assert "rank 1 of 2 (cluster#1:rank1) died first, in cuda_graph" in oom.reason
    assert "CUDA out of memory" in oom.reason
    assert trials[1].state == TrialState.COMPLETE, ok.reason
    for n in (0, 1):
        head = trial_dir(tmp_path / "runs", "two", n)
        rank1 = head.parent / f"{n}-rank1"
        script = (head / "job.sbatch").read_text()
        assert "#SBATCH --nodes=2" in script and "#SBATCH --gres=gpu:8" in script  # one job, 8 GPUs a node
        assert (head / "nodes").read_text().split() == ["node1", "node2"]
        # Each rank's command names the head's address as the job found it (Slurm's NodeAddr).
        for rank, rank_dir in ((0, head), (1, rank1)):
            launch = (rank_dir / "launch.sh").read_text()
            assert f"--node-rank {rank}" in launch and '--dist-init-addr "$SERVETUNE_HEAD_ADDR"' in launch
        assert (rank1 / "exit_code").is_file()  # rank 1 ran, and ended, as a step of the job
    assert "CUDA out of memory" in (trial_dir(tmp_path / "runs", "two", 0).parent / "0-rank1" / "server.log").read_text()
    assert "rank1" in {r.host.split(":")[-1] for r in oom.ranks}
    assert not [j for j, s, comment in two_nodes.jobs() if comment.startswith("servetune,") and s in ACTIVE]


def test_servetune_run_through_slurm_on_two_nodes_exports_one_script_for_every_rank(two_nodes: SlurmCluster,
                                                                                     tmp_path: Path) -> None:
    space_path = space_file(tmp_path)
    inv = inventory(tmp_path, two_nodes)
    storage = f"sqlite:///{tmp_path}/servetune.db"
    create_or_load(open_storage(storage), "two").enqueue_trial({"mem_fraction_static": 0.85})
    env = cli_env(tmp_path, **two_nodes.env)

    run = cli("run", str(space_path), "--inventory", str(inv), "--study", "two", "--storage", storage,
              "--n-trials", "1", "--no-mlflow", "--no-live", "--confirm-top", "0", cwd=tmp_path, timeout=600, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "trial 0: COMPLETE output_throughput=" in run.stdout, run.stdout
    assert not [j for j, state, comment in two_nodes.jobs() if comment.startswith("servetune,") and state in ACTIVE]
    # The preflight on the login node sees only sinfo's GRES type; the trial records the card nvidia-smi named.
    assert two_nodes.run("sinfo", "-h", "-o", "%G").stdout.split() == ["gpu:8"]
    facts = TrialFacts.from_trial(create_or_load(open_storage(storage), "two").trials[0])
    assert (facts.gpu_name, facts.gpu_count, facts.nodes) == ("NVIDIA H100 80GB HBM3", 16, 2)

    out = tmp_path / "serve.sh"
    res = cli("export", "--study", "two", "--storage", storage, "--min-free-gib", "0", "--engine", "sglang",
              "--python", "/opt/sglang/bin/python", "-o", str(out), cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    script = out.read_text()
    assert "# GPU: NVIDIA H100 80GB HBM3 x 8 per node on 2 nodes (TP 16;" in script  # nvidia-smi's, on the node
    assert "SERVETUNE_HEAD_ADDR" not in script and "SERVETUNE_NODE" not in script  # nothing of the job's
    printing = tmp_path / "print.sh"
    printing.write_text(script.replace("\nexec ", "\nprintf '%s\\n' "))
    for rank in (0, 1):
        argv = subprocess.run(["bash", str(printing), str(rank), "127.0.0.2", "29511"], capture_output=True,
                              text=True, check=True).stdout.split()
        assert argv[:3] == ["/opt/sglang/bin/python", "-m", "sglang.launch_server"]
        assert argv[argv.index("--tp"):argv.index("--tp") + 2] == ["--tp", "16"]
        assert argv[argv.index("--nnodes"):] == ["--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr",
                                                 "127.0.0.2:29511"]
        assert "--mem-fraction-static" in argv and argv[argv.index("--mem-fraction-static") + 1] == "0.85"
