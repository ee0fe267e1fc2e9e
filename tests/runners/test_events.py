"""What a server session tells the layer above, as typed values (runners/events.py): a real simulated SGLang
server started, made ready and benchmarked through :class:`runners.server.ServerSession` on this machine
emits its phases in order, its readiness with the server info, and one LevelDone per concurrency level."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runners.engines import engine_for
from runners.engines.script import render_script
from runners.events import FatalSeen, LevelDone, PhaseReached, ServerEvent, ServerReady
from runners.host import Host
from runners.server import BenchPlan, ServerSession
from runners.telemetry import FailureKind, Phase
from runners.transport import LocalTransport
from spaces.launch import LaunchConfig
from tests.fixtures.ports import free_port

PROFILE = Path(__file__).resolve().parents[2] / "runners/simhost/profiles/dsv4-flash-nvfp4-tp4-rtxpro6000.yaml"


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    h = Host(LocalTransport(), runs_root=str(tmp_path / "runs"))
    try:
        yield h
    finally:
        h.cleanup_orphans(grace=1)


def _session(host: Host, tmp_path: Path, knobs: dict[str, Any], events: list[ServerEvent]) -> ServerSession:
    options = {"profile": str(PROFILE), "speed": 500.0, "seed": 1, "extra": {"sim-state-dir": str(tmp_path / "st")}}
    launch = LaunchConfig(engine="sim", python=sys.executable, model_path="m", port=free_port(),
                          knobs=knobs, fixed_args=("--tp", "4"), engine_options=options)
    engine = engine_for(launch)
    trial = uuid.uuid4().hex[:8]
    return ServerSession(host, engine, launch, script=render_script(engine, launch, "0.5.10"),
                         run_dir=host.run_dir("events", trial), run_id=f"events-{trial}", python=sys.executable,
                         stop_grace=5, smi_interval=0, on_event=events.append)


def test_a_served_trial_emits_phases_readiness_and_levels(host: Host, tmp_path: Path) -> None:
    events: list[ServerEvent] = []
    with _session(host, tmp_path, {"mem_fraction_static": 0.7, "cuda_graph_max_bs": 8}, events) as s:
        assert s.wait_ready(120) is None
        plan = BenchPlan(api=s.engine.bench_api, levels=(1, 2), requests=(2, 4), input_len=32, output_len=8,
                         warmup=0, model="m", timeout=60)
        result = s.benchmark(plan, timeout=120)
    assert result.failure is None
    phases = [e.phase for e in events if isinstance(e, PhaseReached)]
    assert phases[:3] == [Phase.LOAD_WEIGHTS, Phase.KV_POOL, Phase.CUDA_GRAPH], phases
    ready = [e for e in events if isinstance(e, ServerReady)]
    assert len(ready) == 1 and ready[0].info["simulated"] is True
    assert events.index(ready[0]) > events.index(next(e for e in events if isinstance(e, PhaseReached)))
    levels = [e.record for e in events if isinstance(e, LevelDone)]
    assert [r["max_concurrency"] for r in levels] == [1, 2] and levels == result.levels
    assert not [e for e in events if isinstance(e, FatalSeen)]


def test_a_dying_server_emits_the_fatal_line_it_logged(host: Host, tmp_path: Path) -> None:
    events: list[ServerEvent] = []
    # Seed 000/002 of the calibration: 0.85 with max-bs 32 dies in CUDA-graph capture.
    with _session(host, tmp_path, {"mem_fraction_static": 0.85, "cuda_graph_max_bs": 32}, events) as s:
        failure = s.wait_ready(120)
    assert failure is not None and failure.kind is FailureKind.OOM
    fatal = [e.failure for e in events if isinstance(e, FatalSeen)]
    # The first fatal line is evidence (the scheduler's exception); the classification at the death names the OOM.
    assert len(fatal) == 1 and fatal[0].phase is Phase.CUDA_GRAPH, fatal
    assert not [e for e in events if isinstance(e, ServerReady)]


def test_a_benchmark_whose_token_counts_contradict_the_ask_is_implausible_figure(host: Host, tmp_path: Path) -> None:
    """The load generator beside a real simulated server, its slack made negative (so the server's true counts
    exceed what it allows, as a lying server's would): the sweep's figures are not believed, the session's
    failure is ``implausible_figure`` (FAIL), never a COMPLETE figure."""
    events: list[ServerEvent] = []
    with _session(host, tmp_path, {"mem_fraction_static": 0.7, "cuda_graph_max_bs": 8}, events) as s:
        assert s.wait_ready(120) is None
        assert s.ref is not None
        copy = Path(s.ref.run_dir) / "loadgen.py"
        copy.write_text(copy.read_text().replace("TOKEN_SLACK_ABS = 8", "TOKEN_SLACK_ABS = -4"))
        plan = BenchPlan(api=s.engine.bench_api, levels=(1,), requests=(2,), input_len=32, output_len=8,
                         warmup=0, model="m", timeout=60)
        result = s.benchmark(plan, timeout=120)
    assert result.failure is not None and result.failure.kind is FailureKind.IMPLAUSIBLE_FIGURE
    assert not result.failure.kind.config_caused
    assert result.failure.reason.startswith("implausible token count: the server reported 8 output tokens for 8")
