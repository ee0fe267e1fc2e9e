"""The simulated SGLang host as two nodes of one server (``--nnodes 2``): each node a process with its own
simulated GPUs (its own state directory), meeting at ``--dist-init-addr`` on loopback.

What a real two-node SGLang does, and so the simulated host: the ranks wait for each other at init; rank 0
serves HTTP, ranks >= 1 answer SGLang's dummy health check (a background thread from 0.5.5, sglang#12297); each
node prints its own TP ranks; the KV pool is sized from the least free memory of any node, so a foreign process
on node 1 leaves node 1 alone short at CUDA-graph capture; a node that dies takes the others with it after the
watchdog; a node that never comes is a hang at init past ``--dist-timeout``, a DistStoreError, not an OOM.
"""

from __future__ import annotations

import http.client
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runners.engines.sglang import SGLangLogParser
from runners.telemetry import FailureKind, Phase
from tests.fixtures.hog import start_hog, stop_hog
from tests.fixtures.ports import free_port
from tests.simhost.conftest import SimHostFactory, SimProc

PROFILE = "deepseek-v3-tp16-2x8-h100"


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[tuple[SimHostFactory, SimHostFactory]]:
    """Two simulated hosts, each with its own GPUs."""
    pair = (SimHostFactory(tmp_path / "node0"), SimHostFactory(tmp_path / "node1"))
    for f in pair:
        f.tmp_path.mkdir()
    try:
        yield pair
    finally:
        for f in pair:
            f.stop_all()


def start_pair(nodes: tuple[SimHostFactory, SimHostFactory], *flags: str, version: str = "0.5.10",
               ranks: tuple[int, ...] = (0, 1), speed: float = 200) -> list[SimProc]:
    addr = f"127.0.0.2:{free_port('127.0.0.2')}"
    return [nodes[r].start(PROFILE, "--model-path", "m", "--tp", "16", "--nnodes", "2", "--node-rank", str(r),
                           "--dist-init-addr", addr, *flags, speed=speed, sim_flags=("--sim-version", version))
            for r in ranks]


def health(port: int, path: str = "/health") -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


def wait_line(proc: SimProc, text: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in proc.log():
        assert proc.proc.poll() is None or text in proc.log(), proc.log()[-3000:]
        assert time.monotonic() < deadline, proc.log()[-3000:]
        time.sleep(0.05)


def parsed(proc: SimProc) -> SGLangLogParser:
    parser = SGLangLogParser()
    for line in proc.log().splitlines():
        parser.feed(line)
    return parser


@pytest.mark.slow
@pytest.mark.parametrize(("version", "dummy_line", "ping"), [
    ("0.5.10", "Dummy health check server started in background thread at 127.0.0.1:", 200),
    ("0.5.4", "Starting dummy health check server at 127.0.0.1:", 404),
])
def test_two_nodes_meet_rank0_serves_and_rank1_answers_the_dummy_health_check(
        nodes: tuple[SimHostFactory, SimHostFactory], version: str, dummy_line: str, ping: int) -> None:
    head, worker = start_pair(nodes, version=version)
    assert head.wait_ready(60)
    wait_line(worker, dummy_line)
    assert health(worker.port) == 200 and health(worker.port, "/health_generate") == 200
    assert health(worker.port, "/ping") == ping  # /ping is new with the background thread (0.5.5)
    assert health(worker.port, "/generate") == 404  # no HTTP API on rank 1
    info = head.server_info()
    assert info["tp_size"] == 16
    # Each node prints its own ranks; both say custom all-reduce is off across nodes.
    assert {int(r) for r in re.findall(r" TP(\d+)\] Load weight begin", head.log())} == set(range(8))
    assert {int(r) for r in re.findall(r" TP(\d+)\] Load weight begin", worker.log())} == set(range(8, 16))
    for proc in (head, worker):
        assert "Custom allreduce is disabled because this process group spans across nodes." in proc.log()
    assert "max_total_num_tokens=" in head.log() and "max_total_num_tokens=" not in worker.log()


@pytest.mark.slow
def test_a_foreign_process_on_node1_leaves_rank1_alone_out_of_memory_and_the_head_follows_after_the_watchdog(
        nodes: tuple[SimHostFactory, SimHostFactory]) -> None:
    hog = start_hog(nodes[1].state_dir, 2048, gpus="0,1,2,3,4,5,6,7")
    try:
        head, worker = start_pair(nodes, "--mem-fraction-static", "0.9", "--watchdog-timeout", "200")
        assert worker.wait_exit(60) in (-signal.SIGKILL, 137)
        rank1 = parsed(worker)
        assert rank1.fatal is not None and rank1.fatal.kind is FailureKind.OOM
        assert rank1.fatal.phase is Phase.CUDA_GRAPH
        assert " TP8] Scheduler hit an exception" in worker.log()
        # Both nodes sized the KV pool from node 1's free memory (the MIN over the world).
        kv = [re.search(r"KV Cache is allocated\. #tokens: (\d+)", p.log()) for p in (head, worker)]
        assert kv[0] and kv[1] and kv[0].group(1) == kv[1].group(1)
        # The head never gets ready: its start-up waits for rank 1, then the watchdog ends it with NCCL's error.
        assert head.wait_exit(60) in (-signal.SIGKILL, 137)
        assert "fired up and ready" not in head.log()
        rank0 = parsed(head)
        assert rank0.fatal is not None and rank0.fatal.kind is FailureKind.NCCL_ERROR
        assert "remote process exited" in rank0.fatal.reason
    finally:
        stop_hog(hog)


@pytest.mark.slow
def test_a_node_that_never_comes_is_a_hang_at_init_past_the_dist_timeout_not_an_oom(
        nodes: tuple[SimHostFactory, SimHostFactory]) -> None:
    (head,) = start_pair(nodes, "--dist-timeout", "300", ranks=(0,))
    assert head.wait_exit(60) in (-signal.SIGKILL, 137)
    assert "Timed out after 301 seconds waiting for clients. 8/16 clients joined." in head.log()
    fatal = parsed(head).fatal
    assert fatal is not None and fatal.kind is FailureKind.DIST_INIT_TIMEOUT and fatal.phase is Phase.STARTING
    assert not fatal.kind.config_caused
    (worker,) = start_pair(nodes, "--dist-timeout", "300", ranks=(1,))
    assert worker.wait_exit(60) in (-signal.SIGKILL, 137)
    assert "The client socket has timed out after 300000ms while trying to connect to (127.0.0.2, " in worker.log()
    assert parsed(worker).fatal.kind is FailureKind.DIST_INIT_TIMEOUT  # type: ignore[union-attr]
