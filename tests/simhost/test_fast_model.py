"""The pure model's fast path (``run_level(fast=True)``: stretches of decode steps summed at once) gives the figures
the live server's scheduler gives by planning and committing every batch of :class:`BatchEngine`
(``run_level(fast=False)``, what ``runners/simhost/scheduler.py`` does on its clock), on random configurations of
several shipped profiles; and it calls the engine's own step cost, so a change to that cost moves both."""

from __future__ import annotations

import random
import zlib

import pytest

from runners.simhost.engine import RuntimeSpec
from runners.simhost.launch import SimLaunch
from runners.simhost.model import LevelResult, Workload, plan_startup, run_level, run_warmup
from runners.simhost.profile import load_profile, shipped_profile

PROFILES = ("llama31-8b-h100", "deepseek-v3-tp8-h200", "mixtral-8x22b-tp8-a100-40g-pcie",
            "qwen3-32b-b200", "llama31-70b-tp4-h100")
FIGURES = ("duration_s", "output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
           "mean_e2e_latency_ms")


def _draws(name: str, rng: random.Random) -> list[tuple[SimLaunch, Workload]]:
    profile = load_profile(shipped_profile(name))
    tp = profile.host.gpu_count if profile.host.gpu_count <= 8 else 8
    out = []
    for _ in range(6):
        argv = ["--model-path", "m", "--tp", str(tp),
                "--mem-fraction-static", f"{rng.choice([0.7, 0.8, 0.85, 0.9]):g}",
                "--cuda-graph-max-bs", str(rng.choice([8, 32, 64, 160, 256])),
                "--chunked-prefill-size", str(rng.choice([2048, 4096, 8192, 16384]))]
        if rng.random() < 0.3:
            argv.append("--disable-cuda-graph")
        wl = Workload(input_len=rng.choice([128, 900, 2048, 6000]), output_len=rng.choice([16, 64, 200, 700]),
                      concurrency=(rng.choice([1, 4, 16, 64, 128]),),
                      requests_per_level=rng.choice([None, 40, 200]))
        out.append((SimLaunch.from_argv(argv, {}, "0.5.10"), wl))
    return out


def _spec(name: str, launch: SimLaunch) -> RuntimeSpec | None:
    plan = plan_startup(load_profile(shipped_profile(name)), launch)
    if plan.failure is not None or plan.runtime is None:
        return None
    return plan.runtime


def _close(a: LevelResult, b: LevelResult) -> None:
    assert (a.ok, a.completed, a.retracted, a.decode_mode, a.died_phase) == (
        b.ok, b.completed, b.retracted, b.decode_mode, b.died_phase)
    for f in FIGURES:
        x, y = getattr(a, f), getattr(b, f)
        assert (x is None) == (y is None), f
        if x is not None:
            assert x == pytest.approx(y, rel=0.01), f


@pytest.mark.parametrize("name", PROFILES)
def test_fast_path_gives_the_step_by_step_figures(name: str) -> None:
    rng = random.Random(zlib.crc32(name.encode()))
    compared = 0
    for launch, wl in _draws(name, rng):
        spec = _spec(name, launch)
        if spec is None:
            continue
        _, died, _ = run_warmup(spec)
        if died is not None:
            continue
        c = wl.concurrency[0]
        fast, slow = run_level(spec, wl, c), run_level(spec, wl, c, fast=False)
        _close(fast, slow)
        compared += 1
    assert compared >= 2, f"{name}: too few configurations started to compare"


def test_fast_path_follows_a_change_to_the_step_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path costs its steps with RuntimeSpec.decode_step_s, not a copy: doubling that cost moves the
    fast figure as it moves the step-by-step one."""
    launch = SimLaunch.from_argv(["--model-path", "m"], {}, "0.5.10")
    spec = _spec("llama31-8b-h100", launch)
    assert spec is not None
    wl = Workload(input_len=512, output_len=300, concurrency=(16,), requests_per_level=32)
    before = run_level(spec, wl, 16)
    original = RuntimeSpec.decode_step_s

    def doubled(self: RuntimeSpec, n: int, kv_tokens: float = 0.0) -> tuple[float, bool]:
        secs, graph = original(self, n, kv_tokens)
        return 2 * secs, graph

    monkeypatch.setattr(RuntimeSpec, "decode_step_s", doubled)
    fast, slow = run_level(spec, wl, 16), run_level(spec, wl, 16, fast=False)
    _close(fast, slow)
    assert fast.mean_tpot_ms == pytest.approx(2 * (before.mean_tpot_ms or 0), rel=0.01)
