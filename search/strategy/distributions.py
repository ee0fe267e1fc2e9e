"""Turn a space's knobs into Optuna suggestions (the only place that maps knobs to distributions).

Knobs the engine version ignores are not searched (:func:`inert_knobs`): they are held at the engine's
default unless the space insists (``search_inert``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import optuna

from runners.engines import get_engine
from search.trial.records import FLOAT_DIGITS
from spaces.coupling import EnvValues, FlagRange, FlagValues, is_active
from spaces.launch import NODES_PARAM, engine_options
from spaces.schema import BoolChoices, FloatRange, IntChoices, Space


def inert_knobs(engine_kind: str, version: str | None, options: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Knob -> why, for the knobs ``engine_kind`` at ``version`` ignores (the engine's own table,
    ``Engine.inert_knobs``). An unknown version (detected on the host later) counts as every release the
    table covers."""
    return get_engine(engine_kind, options).inert_knobs(version)


def held_inert(space: Space) -> dict[str, str]:
    """Knobs of ``space`` that are not searched because its engine version ignores them (knob -> why)."""
    inert = inert_knobs(space.engine.kind, space.engine.version, engine_options(space))
    insist = set(getattr(space, "search_inert", []) or [])
    return {k: why for k, why in inert.items() if k in space.knobs.searched() and k not in insist}


def distributions(space: Space) -> dict[str, optuna.distributions.BaseDistribution]:
    held = held_inert(space)
    out: dict[str, optuna.distributions.BaseDistribution] = {}
    for name, spec in space.knobs.searched().items():
        if name in held:
            continue
        if isinstance(spec, FloatRange):
            out[name] = optuna.distributions.FloatDistribution(spec.low, spec.high, step=spec.step)
        elif isinstance(spec, FlagRange):
            if spec.integer:
                out[name] = optuna.distributions.IntDistribution(int(spec.low), int(spec.high), log=spec.log,
                                                                 step=int(spec.step or 1))
            else:
                out[name] = optuna.distributions.FloatDistribution(spec.low, spec.high, log=spec.log,
                                                                   step=spec.step)
        elif isinstance(spec, FlagValues | EnvValues):
            out[name] = optuna.distributions.CategoricalDistribution(list(spec.values))
        elif isinstance(spec, IntChoices | BoolChoices):
            out[name] = optuna.distributions.CategoricalDistribution(list(spec.choices))
        else:
            out[name] = optuna.distributions.CategoricalDistribution(list(spec))
    if len(space.node_counts) > 1:
        out[NODES_PARAM] = optuna.distributions.CategoricalDistribution(space.node_counts)
    return out


def on_step(value: float, dist: optuna.distributions.FloatDistribution) -> float:
    """``value`` as the knob's own decimal: on the distribution's grid (``low + k * step``) with as many decimals
    as ``low`` and ``step`` have, so ``0.55 + 14 * 0.01`` is stored as ``0.69``, not ``0.6900000000000001``.
    Without a step, rounded to :data:`~search.trial.records.FLOAT_DIGITS`. Always within ``[low, high]``."""
    if dist.step is None:
        rounded = round(value, FLOAT_DIGITS)
    else:
        k = round((value - dist.low) / dist.step)
        digits = max(_decimals(dist.low), _decimals(dist.step))
        rounded = round(dist.low + k * dist.step, min(digits, FLOAT_DIGITS))
    return min(max(rounded, dist.low), dist.high)


def _decimals(x: float) -> int:
    """How many decimals the shortest spelling of ``x`` has (``0.01`` -> 2, ``0.5`` -> 1, ``64`` -> 0)."""
    if not math.isfinite(x):
        return FLOAT_DIGITS
    exponent = Decimal(repr(x)).normalize().as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else FLOAT_DIGITS


def conditional(space: Space) -> bool:
    """Whether some knob of ``space`` is searched only under a condition (the sampler then models the knobs in
    groups that are searched together: Optuna's TPE ``group=True``)."""
    return bool(space.knobs.conditions())


def sample(trial: optuna.Trial, space: Space) -> dict[str, Any]:
    """Suggest every searched knob of the space, define-by-run: a conditional knob only when its condition holds
    on the values already suggested. NCCL variables are named ``nccl.NAME``, free variables ``env.NAME``, free
    flags by their own spelling."""
    params: dict[str, Any] = {}
    dists = distributions(space)
    conditions = space.knobs.conditions()
    for name in space.knobs.order():
        dist = dists.get(name)
        if dist is None or not is_active(name, params, conditions):
            continue
        if isinstance(dist, optuna.distributions.FloatDistribution):
            # The sampler (make_sampler's OnStep) already stores it on the step; a queued value is as given.
            value = trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)
            params[name] = on_step(value, dist)
        elif isinstance(dist, optuna.distributions.IntDistribution):
            params[name] = trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
        else:
            assert isinstance(dist, optuna.distributions.CategoricalDistribution)
            params[name] = trial.suggest_categorical(name, list(dist.choices))
    return params
