"""One job slot of a real Slurm cluster (two slurmd nodes on loopback) driven directly, below the search:
the launch config's node count reaches ``sbatch --nodes``, the job's node list (head node first) is what a
multi-node launch script sees, ``beside`` runs on the head node inside the allocation, and the stop ends the
job with SIGTERM and checks Slurm lists it as ended."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from runners.errors import HostMisconfigured
from runners.host import Resources
from runners.slurm import JobRef, SlurmHost, SlurmSpec
from runners.transport import LocalTransport
from tests.fixtures.procs import wait_for
from tests.fixtures.slurm import SlurmCluster, start_slurm

pytestmark = [pytest.mark.slurm]

#: A stand-in server: prints the nodes the job gave it, then waits for SIGTERM and exits 0 on it.
SERVER = """echo "head=$SERVETUNE_HEAD nodes=$SERVETUNE_NODES gpus=$CUDA_VISIBLE_DEVICES"
exec python3 -c 'import signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
print("serving", flush=True)
time.sleep(600)'
"""


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[SlurmCluster]:
    cluster = start_slurm(nodes=("node1", "node2"), gpus_per_node=2)
    try:
        yield cluster
    finally:
        cluster.stop()


def _host(cluster: SlurmCluster, tmp_path: Path, **spec: object) -> SlurmHost:
    return SlurmHost(LocalTransport("c#1"), SlurmSpec.model_validate({"poll_interval": 0.5, **spec}), cluster="c",
                     slot=1, runs_root=str(tmp_path / "runs"), env=cluster.env)


def test_a_two_node_job_gets_both_nodes_head_first_and_stops_on_sigterm(two_nodes: SlurmCluster,
                                                                         tmp_path: Path) -> None:
    host = _host(two_nodes, tmp_path)
    ref = host.start(host.run_dir("s", "0"), SERVER, "s-0-x", resources=Resources(nodes=2, gpus_per_node=2))
    assert isinstance(ref, JobRef)
    script = (Path(ref.run_dir) / "job.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --gres=gpu:2" in script
    assert host.wait_scheduled(ref, stop=threading.Event(), timeout=60) is None
    assert host.nodes(ref) == ("node1", "node2")
    log = Path(ref.run_dir) / "server.log"
    assert wait_for(lambda: log.exists() and "serving" in log.read_text(), timeout=30), log
    assert "head=node1 nodes=node1 node2 gpus=0,1" in log.read_text()
    assert (Path(ref.run_dir) / "nodes").read_text().split() == ["node1", "node2"]
    assert host.beside(ref).run("echo $SLURM_JOB_ID").stdout.strip() == ref.job_id  # inside the allocation
    assert host.alive(ref) and host.scheduler_end(ref) is None

    stop = host.stop(ref, grace=10)

    assert stop.method == "term" and not stop.survivors
    assert (Path(ref.run_dir) / "exit_code").read_text().strip() == "0"  # the server exited on SIGTERM
    assert not host.job(ref).active and not host.alive(ref)
    assert host.scheduler_end(ref) is None  # servetune's own stop is no fault


def test_a_job_that_waits_past_queue_timeout_is_cancelled_and_fails(two_nodes: SlurmCluster, tmp_path: Path) -> None:
    host = _host(two_nodes, tmp_path)
    # Three nodes from a two-node partition can never run: the job pends until the limit.
    ref = host.start(host.run_dir("s", "1"), SERVER, "s-1-x", resources=Resources(nodes=3, gpus_per_node=1))
    failure = host.wait_scheduled(ref, stop=threading.Event(), timeout=2)
    assert failure is not None and failure.kind.value == "scheduler"
    assert "waited in the queue longer than 2s" in failure.reason and "cancelled" in failure.reason
    assert wait_for(lambda: not host.job(ref).active, timeout=30)
    assert host.scheduler_end(ref) is None  # cancelled by servetune itself: no outside cancel


def test_the_preflight_reads_the_partitions_gpus_on_the_login_node(two_nodes: SlurmCluster, tmp_path: Path) -> None:
    host = _host(two_nodes, tmp_path, partition="gpu", gpu_memory_mib=81559)
    info = host.preflight("sim", sys.executable, f"{sys.executable} -c 'print(1)'", gpus_needed=4)
    assert [(g.index, g.total_mib) for g in info.gpus] == [(0, 81559), (1, 81559)]  # per node
    assert not info.busy  # Slurm hands a job free GPUs
    with pytest.raises(HostMisconfigured, match="2 node\\(s\\) with 2 GPU\\(s\\) each, the space needs 8"):
        host.preflight("sim", sys.executable, f"{sys.executable} -c 'print(1)'", gpus_needed=8)
    with pytest.raises(HostMisconfigured, match="sinfo lists no nodes in partition 'nope'"):
        _host(two_nodes, tmp_path, partition="nope").preflight("sim", sys.executable, "true")
