"""Turn a space's knobs into Optuna suggestions (the only place that maps knobs to distributions).

Knobs the engine version ignores are not searched (:func:`inert_knobs`): they are held at the engine's
default unless the space insists (``search_inert``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna

from runners.engines import get_engine
from search.trial.records import FLOAT_DIGITS
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
        elif isinstance(spec, IntChoices | BoolChoices):
            out[name] = optuna.distributions.CategoricalDistribution(list(spec.choices))
        else:
            out[name] = optuna.distributions.CategoricalDistribution(list(spec))
    if len(space.node_counts) > 1:
        out[NODES_PARAM] = optuna.distributions.CategoricalDistribution(space.node_counts)
    return out


def sample(trial: optuna.Trial, space: Space) -> dict[str, Any]:
    """Suggest every searched knob of the space; NCCL variables are named ``nccl.NAME``."""
    params: dict[str, Any] = {}
    for name, dist in distributions(space).items():
        if isinstance(dist, optuna.distributions.FloatDistribution):
            value = trial.suggest_float(name, dist.low, dist.high, step=dist.step)
            params[name] = round(value, FLOAT_DIGITS)
        else:
            assert isinstance(dist, optuna.distributions.CategoricalDistribution)
            params[name] = trial.suggest_categorical(name, list(dist.choices))
    return params
