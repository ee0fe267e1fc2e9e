"""The throwaway Slurm cluster itself (tests/fixtures/slurm.py): it comes up with GPUs declared by count,
runs a job on them, and stops every daemon by its PID. Two nodes on one machine: Debian's 22.05 slurmd runs
once per node (``slurmd -N name``, each on its own ``Port=``), both register and a two-node job gets both;
a step on the second node runs through that node's slurmd."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.procs import gone, wait_for
from tests.fixtures.slurm import SlurmCluster, start_slurm

pytestmark = [pytest.mark.slurm]


def _run_job(cluster: SlurmCluster, out: Path, *args: str) -> str:
    job = cluster.run("sbatch", "--parsable", "-o", str(out), *args).stdout.strip()
    assert wait_for(lambda: cluster.run("scontrol", "show", "job", "-o", job).stdout.count("JobState=COMPLETED"),
                    timeout=60), cluster.run("scontrol", "show", "job", "-o", job).stdout
    return job


def test_two_nodes_with_gpus_run_a_two_node_job_and_stop_by_pid(tmp_path: Path) -> None:
    cluster = start_slurm(nodes=("node1", "node2"), gpus_per_node=2)
    pids = dict(cluster.pids)
    try:
        sinfo = cluster.run("sinfo", "-h", "-N", "-o", "%N %T %G").stdout.split("\n")
        assert {line.strip() for line in sinfo if line.strip()} == {"node1 idle gpu:2", "node2 idle gpu:2"}
        out = tmp_path / "job.out"
        job = _run_job(cluster, out, "--nodes=2", "--gres=gpu:2", "--wrap",
                       'echo "nodes=$SLURM_JOB_NODELIST gpus=$CUDA_VISIBLE_DEVICES"; srun --overlap -N1 -n1 '
                       "-w node2 true && echo step-on-node2-ok")
        text = out.read_text()
        assert "nodes=node[1-2] gpus=0,1" in text and "step-on-node2-ok" in text
        assert "launch task StepId=" in (cluster.root / "slurmd-node2.log").read_text()
        assert "NodeList=node[1-2]" in cluster.run("scontrol", "show", "job", "-o", job).stdout
    finally:
        cluster.stop()
    assert all(wait_for(lambda p=pid: gone(p), timeout=15) for pid in pids.values())
    assert not cluster.root.exists()
