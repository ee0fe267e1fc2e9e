"""A server spanning two nodes, watched as one (:class:`runners.nodes.NodeSession`), on two simulated hosts of
this machine (each its own simulated GPUs): ready only with the head ready and every rank alive; a rank that dies
while the head serves ends the benchmark at once, the verdict names that rank, and every rank is stopped.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from runners.engines import engine_for
from runners.engines.nodes import render_nodes
from runners.host import Host
from runners.nodes import NodeSession
from runners.server import BenchPlan, ServerSession
from runners.telemetry import FailureKind, Phase
from runners.transport import LocalTransport
from search.driver.hosts import sim_env
from spaces.launch import LaunchConfig, engine_options
from spaces.schema import Space
from tests.fixtures.ports import free_port

pytestmark = pytest.mark.slow

PROFILE = Path(__file__).resolve().parents[2] / "runners" / "simhost" / "profiles" / "deepseek-v3-tp16-2x8-h100.yaml"
SPACE = Space.model_validate({
    "name": "nodes", "engine": {"kind": "sim", "python": sys.executable, "sim": {"profile": str(PROFILE),
                                                                                 "speed": 50, "seed": 1}},
    "model_path": "m", "nodes": 2, "fixed_args": ["--tp", "16", "--dist-timeout", "3000"],
    "knobs": {"mem_fraction_static": {"low": 0.85, "high": 0.85}},
})


def rank_server(pgid: int) -> int:
    """The simulated server's PID in the process group ``pgid`` (read from /proc)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[2]) == pgid and b"runners.simhost.server" in cmdline and stat[0] != "Z":
            return int(entry)
    raise AssertionError(f"no simulated server in process group {pgid}")


@pytest.fixture
def session(tmp_path: Path) -> Iterator[NodeSession]:
    hosts = [Host(LocalTransport(f"node-{n}"), runs_root=str(tmp_path / f"runs-{n}"),
                  env=sim_env(SPACE, tmp_path / f"sim-{n}")) for n in "ab"]
    launch = LaunchConfig.from_params(SPACE, {"mem_fraction_static": 0.85}, port=free_port())
    engine = engine_for(launch)
    ports = [launch.port, free_port()]
    ranks = render_nodes(engine, launch, "0.5.10", ["127.0.0.1", "127.0.0.1"], free_port(), ports=ports)
    run_id = f"nodes-{uuid.uuid4().hex[:8]}"
    sessions = [ServerSession(h, engine, launch.model_copy(update={"port": p}), script=r.script,
                              run_dir=h.run_dir("nodes", "0"), run_id=f"{run_id}-{rank}", python=sys.executable,
                              stop_grace=5, smi_interval=0.2)
                for rank, (h, p, r) in enumerate(zip(hosts, ports, ranks, strict=True))]
    assert engine_options(SPACE)["profile"] == str(PROFILE)
    nodes = NodeSession(sessions)
    try:
        yield nodes
    finally:
        nodes.stop()


def test_a_rank_killed_while_the_head_serves_ends_the_benchmark_and_is_named(session: NodeSession) -> None:
    session.start()
    assert session.wait_ready(120) is None
    assert all(not s.dead for s in session.sessions)
    plan = BenchPlan(api="sglang", levels=(4,), requests=(400,), input_len=64, output_len=256, warmup=0, model="m",
                     timeout=120)
    worker = session.sessions[1]
    assert worker.ref is not None

    server = rank_server(worker.ref.pgid)

    def kill_rank1_soon() -> None:
        time.sleep(1.0)
        os.kill(server, signal.SIGKILL)  # rank 1's server process alone, as the kernel's OOM killer would

    threading.Thread(target=kill_rank1_soon, daemon=True).start()
    result = session.benchmark(plan, timeout=120)
    assert result.failure is not None
    assert session.first_dead() == 1
    assert result.failure.reason.startswith("rank 1 of 2 (node-b) died first, in ")
    assert result.failure.kind is FailureKind.CRASH and "SIGKILL" in result.failure.reason
    assert result.failure.phase is Phase.SERVING  # rank 1 had started: it answered its health check
    stop = session.stop()
    assert stop is not None and not stop.survivors
    assert all(s.stop_result is not None for s in session.sessions)  # every rank's stop verified
    assert session.check_gpus_free() == []
