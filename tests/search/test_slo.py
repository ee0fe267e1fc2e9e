"""max_rate_under_slo's rate search: bracketing then bisection, checked on a known curve and on the simulated
host's pure model against a fine sweep of the rate."""

from __future__ import annotations

from typing import Any

import pytest

from runners.simhost.model import Workload, predict_from_argv
from runners.simhost.profile import load_profile, shipped_profile
from search.trial.slo import find_max_rate, violations
from spaces.schema import RateSearch, Slo


def knee(at: float, calls: list[float] | None = None) -> Any:
    """A server whose p99 TTFT is 100 ms up to ``at`` req/s and explodes past it."""

    def measure(rate: float) -> dict[str, Any]:
        if calls is not None:
            calls.append(rate)
        ttft = 100.0 if rate <= at else 10_000.0
        return {"completed": 50, "failed": 0, "p99_ttft_ms": ttft, "output_throughput": rate * 10}

    return measure


@pytest.mark.parametrize("at", [0.7, 3.3, 9.0, 41.0, 200.0])
def test_finds_the_knee_within_tolerance(at: float) -> None:
    plan = RateSearch(start=4, low=0.25, high=256, steps=14, tolerance=0.02)
    found = find_max_rate(knee(at), Slo(p99_ttft_ms=150), plan)
    assert found.rate is not None
    assert at * 0.98 <= found.rate <= at
    assert found.goodput == pytest.approx(found.rate * 10)
    assert all(step.holds == (step.rate <= at) for step in found.steps)


def test_spends_no_more_than_its_steps() -> None:
    calls: list[float] = []
    plan = RateSearch(start=1, low=0.25, high=256, steps=5, tolerance=0.001)
    found = find_max_rate(knee(100.0, calls), Slo(p99_ttft_ms=150), plan)
    assert len(calls) == 5 and calls == [1, 2, 4, 8, 16]
    assert found.rate == 16 and found.bracket == (16, None)


def test_none_when_even_the_lowest_rate_breaks_the_slo() -> None:
    plan = RateSearch(start=2, low=0.5, high=8, steps=10)
    found = find_max_rate(knee(0.1), Slo(p99_ttft_ms=150), plan)
    assert found.rate is None and [s.rate for s in found.steps] == [2, 1, 0.5]
    assert found.goodput is None


def test_high_when_it_always_holds() -> None:
    plan = RateSearch(start=4, low=0.5, high=20, steps=10)
    found = find_max_rate(knee(1e9), Slo(p99_ttft_ms=150), plan)
    assert found.rate == 20 and [s.rate for s in found.steps] == [4, 8, 16, 20]


def test_violations_name_each_broken_limit() -> None:
    slo = Slo(p99_ttft_ms=100, p99_tpot_ms=50, max_error_rate=0.01)
    rec = {"completed": 90, "failed": 10, "p99_ttft_ms": 120.0, "p99_tpot_ms": 20.0}
    assert violations(rec, slo) == ("p99_ttft_ms 120 > 100", "error_rate 0.1 > 0.01")
    assert violations({"completed": 0, "failed": 0}, Slo(max_error_rate=0.5)) == ("error_rate 1 > 0.5",)
    assert violations({"completed": 5, "failed": 0, "p99_ttft_ms": 1.0}, slo)[0].startswith("p99_tpot_ms inf")


def pure_model(profile: str, mem: float, conc: int) -> Any:
    prof = load_profile(shipped_profile(profile))
    argv = ["--model-path", "m", "--trust-remote-code", "--tp", "4", "--mem-fraction-static", str(mem),
            "--cuda-graph-max-bs", "64"]

    def measure(rate: float) -> dict[str, Any]:
        wl = Workload(input_len=256, output_len=96, concurrency=(conc,), requests_per_level=200, request_rate=rate)
        out = predict_from_argv(prof, argv, {}, wl, version="0.5.10")
        lv = out.levels[0]
        return {"completed": lv.completed, "failed": lv.num_requests - lv.completed, "p99_ttft_ms": lv.p99_ttft_ms,
                "output_throughput": lv.output_throughput}

    return measure


@pytest.mark.slow
@pytest.mark.parametrize("limit_ms", [2500.0, 4000.0])
def test_agrees_with_a_fine_sweep_of_the_pure_model(limit_ms: float) -> None:
    measure = pure_model("dsv4-flash-nvfp4-tp4-rtxpro6000", 0.8, 64)
    slo = Slo(p99_ttft_ms=limit_ms)
    # The fine sweep: rates 1% apart from 0.25 req/s; the answer is the last rate before the first that breaks.
    swept, rate = None, 0.25
    while rate <= 256:
        if violations(measure(rate), slo):
            break
        swept, rate = rate, rate * 1.01
    assert swept is not None and rate <= 256, "the SLO must bind inside the range for this test to mean anything"
    found = find_max_rate(measure, slo, RateSearch(start=4, low=0.25, high=256, steps=12, tolerance=0.02))
    assert found.rate is not None
    assert found.rate == pytest.approx(swept, rel=0.05)
    assert len(found.steps) <= 12
