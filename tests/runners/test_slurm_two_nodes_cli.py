"""A two-node search through a real Slurm cluster of two slurmd nodes (tests/fixtures/slurm.py) by the
``servetune`` CLI, as docs/multi-node.md shows it (benchmarks/slurm_two_nodes.py): ``servetune run`` with a
Slurm inventory, then ``servetune export`` of the trial, which is the one script every node runs with its rank,
headed with the card nvidia-smi named on the job's node: the trial records that card, not sinfo's GRES type
(``gpu``), which is all the preflight on the login node sees.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from runners.slurm.jobs import ACTIVE
from search.driver.hosts import sim_env
from search.storage import create_or_load, open_storage
from search.trial.records import TrialFacts
from spaces.schema import load_space
from tests.fixtures.slurm import SlurmCluster, start_slurm
from tests.runners.test_slurm_two_nodes import space_file
from tests.search.overnight_kit import cli, cli_env

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[SlurmCluster]:
    cluster = start_slurm(nodes=("node1", "node2"), gpus_per_node=8, cpus=8)
    try:
        yield cluster
    finally:
        cluster.stop()


def test_servetune_run_through_slurm_on_two_nodes_exports_one_script_for_every_rank(two_nodes: SlurmCluster,
                                                                                     tmp_path: Path) -> None:
    space_path = space_file(tmp_path)
    space = load_space(space_path)
    sim = tmp_path / "sim"
    for where in ("", "node1", "node2"):  # the login node's (preflight), then each node's own GPUs
        sim_env(space, sim / where)
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"hosts": [{
        "name": "cluster", "address": "local", "runs_root": str(tmp_path / "runs"), "python": sys.executable,
        "env": {**two_nodes.env, "PATH": f"{sim}/$SERVETUNE_NODE/bin:$PATH",
                "SERVETUNE_SIM_STATE": f"{sim}/$SERVETUNE_NODE/state"},
        "slurm": {"partition": "gpu", "time_limit": "00:10:00", "poll_interval": 0.5}}]}))
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
        argv = subprocess.run(["bash", str(printing), str(rank), "10.0.0.1", "29511"], capture_output=True,
                              text=True, check=True).stdout.split()
        assert argv[:3] == ["/opt/sglang/bin/python", "-m", "sglang.launch_server"]
        assert argv[argv.index("--tp"):argv.index("--tp") + 2] == ["--tp", "16"]
        assert argv[argv.index("--nnodes"):] == ["--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr",
                                                 "10.0.0.1:29511"]
        assert "--mem-fraction-static" in argv and argv[argv.index("--mem-fraction-static") + 1] == "0.85"
