"""Turn a space's knobs into Optuna suggestions (the only place that maps knobs to distributions)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna

from spaces.schema import BoolChoices, FloatRange, IntChoices, Space

#: Sampled floats are rounded to this many decimals, so that ``0.6100000000000001`` is ``0.61``.
FLOAT_DIGITS = 6


def distributions(space: Space) -> dict[str, optuna.distributions.BaseDistribution]:
    out: dict[str, optuna.distributions.BaseDistribution] = {}
    for name, spec in space.knobs.searched().items():
        if isinstance(spec, FloatRange):
            out[name] = optuna.distributions.FloatDistribution(spec.low, spec.high, step=spec.step)
        elif isinstance(spec, IntChoices | BoolChoices):
            out[name] = optuna.distributions.CategoricalDistribution(list(spec.choices))
        else:
            out[name] = optuna.distributions.CategoricalDistribution(list(spec))
    return out


def sample(trial: optuna.Trial, space: Space) -> dict[str, Any]:
    """Suggest every knob of the space; NCCL variables are named ``nccl.NAME``."""
    params: dict[str, Any] = {}
    for name, dist in distributions(space).items():
        if isinstance(dist, optuna.distributions.FloatDistribution):
            value = trial.suggest_float(name, dist.low, dist.high, step=dist.step)
            params[name] = round(value, FLOAT_DIGITS)
        else:
            assert isinstance(dist, optuna.distributions.CategoricalDistribution)
            params[name] = trial.suggest_categorical(name, list(dist.choices))
    return params


def normal_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Params as :func:`sample` returns them (floats rounded), so that a stored trial's
    ``0.6100000000000001`` and a sampled ``0.61`` are the same configuration."""
    return {k: round(v, FLOAT_DIGITS) if isinstance(v, float) else v for k, v in params.items()}
