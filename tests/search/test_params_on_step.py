"""A sampled float knob is stored as the knob's own decimal (``0.69``, not ``0.6900000000000001``): Optuna stores
what the sampler returns, and the dashboard, MLflow, the report and the exported script all read that stored
param, so servetune's sampler rounds it to the knob's step before Optuna stores it."""

from __future__ import annotations

from decimal import Decimal

import optuna
import pytest

from search.strategy.distributions import on_step
from search.strategy.strategy import OnStep, make_sampler

MFS = optuna.distributions.FloatDistribution(0.55, 0.90, step=0.01)


def _decimals(x: float) -> int:
    exponent = Decimal(repr(x)).as_tuple().exponent
    assert isinstance(exponent, int)
    return max(0, -exponent)


@pytest.mark.parametrize(("value", "dist", "stored"), [
    (0.55 + 14 * 0.01, MFS, "0.69"),
    (0.55 + 30 * 0.01, MFS, "0.85"),
    (0.7200000000000001, MFS, "0.72"),
    (0.899999999999, MFS, "0.9"),
    (0.125 + 3 * 0.025, optuna.distributions.FloatDistribution(0.125, 0.5, step=0.025), "0.2"),
    (0.1 + 0.2, optuna.distributions.FloatDistribution(0.0, 1.0), "0.3"),
    (2.0 + 1e-12, optuna.distributions.FloatDistribution(1.0, 8.0, step=0.5), "2.0"),
])
def test_a_value_is_stored_as_the_knobs_decimal(value: float, dist: optuna.distributions.FloatDistribution,
                                                stored: str) -> None:
    assert repr(on_step(value, dist)) == stored


def test_a_value_stays_in_its_range() -> None:
    dist = optuna.distributions.FloatDistribution(0.1234564, 0.2)
    assert on_step(0.1234564, dist) == 0.1234564  # rounding to 6 digits would leave the range
    assert dist._contains(dist.to_internal_repr(on_step(0.1234564, dist)))


def _search(sampler: optuna.samplers.BaseSampler, n: int) -> list[float]:
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.optimize(lambda t: -abs(t.suggest_float("mem_fraction_static", 0.55, 0.90, step=0.01) - 0.8)
                   + t.suggest_float("x", 0.0, 1.0, step=0.05) + t.suggest_int("bs", 16, 256, step=16) / 1000,
                   n_trials=n)
    return [v for t in study.get_trials() for k, v in t.params.items() if k != "bs"]


def test_the_stored_params_are_on_the_step_with_servetunes_sampler() -> None:
    assert isinstance(make_sampler(7, 30), OnStep)
    # TPE, random start-up trials and then its model (multivariate: sample_relative), 30 trials.
    stored = _search(make_sampler(7, 30), 30)
    assert len(stored) == 60
    assert max(_decimals(v) for v in stored) <= 2, [v for v in stored if _decimals(v) > 2]
    # Optuna's own TPE, on the same search, stores binary-float noise: what the sampler above rounds away.
    raw = _search(optuna.samplers.TPESampler(seed=7, n_startup_trials=7, multivariate=True), 30)
    assert max(_decimals(v) for v in raw) > 2


def test_a_conditional_space_is_rounded_too() -> None:
    """``group=True`` samples some knobs through ``sample_independent``, the rest through ``sample_relative``."""
    study = optuna.create_study(sampler=make_sampler(3, 24, conditional=True))

    def objective(t: optuna.Trial) -> float:
        mode = t.suggest_categorical("mode", ["a", "b"])
        v = t.suggest_float(f"f_{mode}", 0.3, 0.9, step=0.01)
        return v

    study.optimize(objective, n_trials=24)
    stored = [v for t in study.get_trials() for k, v in t.params.items() if k != "mode"]
    assert len(stored) == 24 and max(_decimals(v) for v in stored) <= 2
