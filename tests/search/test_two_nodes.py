"""A two-node search over two real sshds (127.0.0.2 and 127.0.0.3, loopback) on the simulated host, through
``servetune run --inventory`` with a host group: the server spans both hosts (rank 0 on the head, rank 1 on the
other), and the configuration that leaves node 1 short of memory dies there alone.

Node 1 has 900 MiB of its GPUs held by a process nvidia-smi does not list (another container's): under the
preflight's threshold, so the node is taken, but the KV pool is sized from the least free memory of any node,
and at ``--mem-fraction-static 0.89`` the CUDA-graph capture of node 1's ranks runs out while node 0's does not.
That trial is PRUNED and its verdict names rank 1 as the first to die, in cuda_graph, with rank 1's memory
ladder; at 0.85 the server serves. Every rank is stopped on both hosts and no simulated GPU memory of ours is
left on either.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from search.storage import create_or_load, open_storage
from search.trial.records import TrialFacts
from spaces.schema import load_space
from tests.fixtures.hog import start_hog, stop_hog
from tests.fixtures.ports import free_port
from tests.fixtures.sshd import SshServer, write_known_hosts
from tests.search.test_ssh_search import SimBox, cli, group

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "runners" / "simhost" / "profiles" / "deepseek-v3-tp16-2x8-h100.yaml"
DIES_ON_RANK1 = {"mem_fraction_static": 0.89}
SERVES = {"mem_fraction_static": 0.85}


def two_node_space(path: Path) -> Path:
    space = {
        "name": "dsv3-two-nodes",
        "engine": {"kind": "sim", "python": "servetune", "version": "0.5.10",
                   "sim": {"profile": str(PROFILE), "speed": 200, "seed": 1}},
        "model_path": "deepseek-ai/DeepSeek-V3",
        "port": free_port(),
        "nodes": 2,
        "fixed_args": ["--tp", "16", "--trust-remote-code", "--dist-timeout", "6000"],
        "knobs": {"mem_fraction_static": {"low": 0.85, "high": 0.89}},
        "workload": {"input_len": 64, "output_len": 16, "concurrency": [1, 4], "requests_per_level": [1, 4],
                     "warmup_requests": 0},
        "objective": {"metric": "output_throughput", "level": 4},
        "budget": {"n_trials": 2, "startup_timeout": "60s", "benchmark_timeout": "60s", "stop_grace": "5s"},
    }
    path.write_text(yaml.safe_dump(space))
    return path


@pytest.fixture
def pair(sshd_b: SshServer, sshd_c: SshServer, tmp_path: Path) -> Iterator[tuple[SimBox, SimBox, Path]]:
    known = write_known_hosts(tmp_path / "known_hosts", sshd_b, sshd_c)
    space_path = two_node_space(tmp_path / "space.yaml")
    space = load_space(space_path)
    boxes = (SimBox(sshd_b, known, space, tmp_path, "a", server_port=free_port()),
             SimBox(sshd_c, known, space, tmp_path, "b", server_port=free_port()))
    try:
        yield boxes[0], boxes[1], space_path
    finally:
        for box in boxes:
            box.cleanup()


def test_two_hosts_run_a_two_node_search_and_a_rank1_only_oom_is_pruned_with_rank1_named(
        pair: tuple[SimBox, SimBox, Path], tmp_path: Path) -> None:
    head, worker, space_path = pair
    hosts = [{**box.spec.model_dump(exclude_defaults=True), "name": name}
             for box, name in ((head, "node-a"), (worker, "node-b"))]
    inv = tmp_path / "hosts.yaml"
    inv.write_text(yaml.safe_dump({"hosts": hosts, "groups": [{"name": "pair", "hosts": ["node-a", "node-b"]}]}))
    storage = f"sqlite:///{tmp_path}/servetune.db"
    study = create_or_load(open_storage(storage), "two")
    study.enqueue_trial(DIES_ON_RANK1)
    study.enqueue_trial(SERVES)

    hog = start_hog(worker.state, 900, "0,1,2,3,4,5,6,7", hidden=True)  # not listed by nvidia-smi
    try:
        res = cli("run", str(space_path), "--study", "two", "--storage", storage, "--inventory", str(inv),
                  "--n-trials", "2", "--no-mlflow", "--no-live", "--artifacts-dir", str(tmp_path / "art"),
                  "--confirm-top", "0", cwd=tmp_path)
    finally:
        stop_hog(hog)
    assert res.returncode == 0, res.stdout + res.stderr
    trials = optuna.load_study(study_name="two", storage=storage).trials
    oom, ok = (TrialFacts.from_trial(t) for t in trials)

    assert trials[0].state == TrialState.PRUNED, oom.reason
    assert oom.outcome == "oom" and oom.phase == "cuda_graph"
    assert oom.reason.startswith("rank 1 of 2 (node-b) died first, in cuda_graph: "), oom.reason
    assert oom.died_first == 1 and oom.nodes == 2 and oom.host == "pair (node-a, node-b)"
    rank0, rank1 = oom.ranks
    assert (rank0.host, rank1.host) == ("node-a", "node-b")
    assert rank1.outcome == "oom" and rank1.phase == "cuda_graph"
    # The memory ladder the model learns from is rank 1's: the binding rank.
    assert oom.memory.tried_to_allocate_gib and oom.memory.free_at_oom_gib is not None
    for figure in ("tried_to_allocate_gib", "free_at_oom_gib", "kv_gib", "weights_gib", "avail_after_kv_gib"):
        assert oom.memory.figure(figure) == rank1.memory.figure(figure), figure
    assert rank1.memory.kv_tokens == rank0.memory.kv_tokens  # one pool size: the least free node's
    assert "==> rank 1 of 2 (node-b) <==" in (oom.log_tail or "")

    assert trials[1].state == TrialState.COMPLETE, ok.reason
    assert ok.nodes == 2 and ok.died_first is None and [r.outcome for r in ok.ranks] == [None, None]
    assert trials[1].value and trials[1].value > 0

    for box, rank in ((head, 0), (worker, 1)):
        for number in (0, 1):
            run = box.run_dir("two", number)
            assert (run / "server.log").read_text(), run
            assert f"--node-rank {rank}" in (run / "launch.sh").read_text()
            assert "--dist-init-addr 127.0.0.2:" in (run / "launch.sh").read_text()
            assert not group(int((run / "pgid").read_text()))  # every rank's process group is gone
        assert box.gpu_pids() == set()  # no simulated GPU memory of ours left on either node
    assert os.path.exists(tmp_path / "art" / "two" / "0" / "server.log")
    assert "==> rank 1 of 2 (node-b) <==" in (tmp_path / "art" / "two" / "0" / "server.log").read_text()

    # The exported launch script: one script, the rank an argument, rendered from the launch the trial ran.
    out = tmp_path / "serve.sh"
    res = cli("export", "--study", "two", "--storage", storage, "--min-free-gib", "0", "-o", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    script = out.read_text()
    assert "--tp 16" in script and "--nnodes 2" in script and "--mem-fraction-static 0.85" in script
    assert '--node-rank "$RANK" --dist-init-addr "$HEAD:$DIST_PORT"' in script
    assert subprocess.run(["bash", "-n", str(out)], check=False).returncode == 0
    bad = subprocess.run(["bash", str(out), "2", "127.0.0.2"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "RANK must be 0-1, got 2" in bad.stderr
    usage = subprocess.run(["bash", str(out)], capture_output=True, text=True, check=False)
    assert usage.returncode != 0 and "RANK HEAD [DIST_PORT]" in usage.stderr
