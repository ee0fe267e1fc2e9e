"""The highest request rate a configuration sustains within its SLO limits (``max_rate_under_slo``).

The search is bounded and deterministic, as SGLang's auto_benchmark and vLLM's auto_tune do it: measure at a
start rate, *bracket* (double while the limits hold, halve while they do not, within ``[low, high]``), then
*bisect* the bracket until it is within the relative tolerance or the step budget is spent. Each step is one
measurement at one rate; the caller supplies it (a real server run, or the simulated host's pure model).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from spaces.schema import RateSearch, Slo

Measure = Callable[[float], Mapping[str, Any]]
"""``measure(rate)`` -> one level's record (bench_serving names, plus ``completed`` and ``failed``)."""


@dataclass(frozen=True)
class RateStep:
    """One measurement of the search."""

    rate: float
    holds: bool
    violations: tuple[str, ...]
    record: Mapping[str, Any]


@dataclass
class RateResult:
    """What the search found: the highest rate that held (None: not even ``low``), and every step."""

    rate: float | None
    steps: list[RateStep] = field(default_factory=list)
    bracket: tuple[float | None, float | None] = (None, None)

    @property
    def record(self) -> Mapping[str, Any] | None:
        """The measurement at the rate found."""
        return next((s.record for s in self.steps if s.rate == self.rate and s.holds), None)

    @property
    def goodput(self) -> float | None:
        rec = self.record
        value = rec.get("output_throughput") if rec else None
        return float(value) if value is not None else None


def violations(record: Mapping[str, Any], slo: Slo) -> tuple[str, ...]:
    """Which SLO limits ``record`` breaks (a level with no completed request breaks all of them)."""
    done = int(record.get("completed") or 0)
    failed = int(record.get("failed") or 0)
    out = []
    for name, limit in slo.limits().items():
        if name == "error_rate":
            total = done + failed
            value = failed / total if total else 1.0
        else:
            raw = record.get(name)
            value = float(raw) if raw is not None and done else math.inf
        if value > limit:
            out.append(f"{name} {value:.4g} > {limit:g}")
    if not done and not out:
        out.append("no request completed")
    return tuple(out)


def find_max_rate(measure: Measure, slo: Slo, plan: RateSearch) -> RateResult:
    """Bracket, then bisect, the highest rate within ``[plan.low, plan.high]`` at which ``slo`` holds."""
    result = RateResult(rate=None)

    def step(rate: float) -> bool:
        record = measure(rate)
        broken = violations(record, slo)
        result.steps.append(RateStep(rate, not broken, broken, record))
        return not broken

    good: float | None = None
    bad: float | None = None
    rate = plan.start
    while len(result.steps) < plan.steps:  # bracketing
        if step(rate):
            good = rate
            if bad is not None or rate >= plan.high:
                break
            rate = min(rate * 2, plan.high)
        else:
            bad = rate
            if good is not None or rate <= plan.low:
                break
            rate = max(rate / 2, plan.low)
    while good is not None and bad is not None and len(result.steps) < plan.steps:  # bisection
        if (bad - good) / good <= plan.tolerance:
            break
        mid = float(f"{(good + bad) / 2:.6g}")  # the rate as the load generator is told it (``%g``)
        if step(mid):
            good = mid
        else:
            bad = mid
    result.rate = good
    result.bracket = (good, bad)
    return result
