"""Turn a space's knobs into Optuna suggestions (the only place that maps knobs to distributions).

Knobs the engine version ignores are not searched (:func:`inert_knobs`): they are held at the engine's
default unless the space insists (``search_inert``). The first launch of a study is a safe probe
(:func:`probe_params`), so the memory model has a launch's figures early.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna

from runners.engines import get_engine
from spaces.launch import engine_options
from spaces.schema import UNSET, BoolChoices, FloatRange, IntChoices, Space

#: Sampled floats are rounded to this many decimals, so that ``0.6100000000000001`` is ``0.61``.
FLOAT_DIGITS = 6

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


def probe_params(space: Space) -> dict[str, Any]:
    """The study's first launch: the safe end of the memory knobs, the engine's defaults elsewhere.

    The lowest static-memory fraction in range (``mem_fraction_static``, ``gpu_memory_utilization``)
    leaves the most memory to graphs and activations; the largest graph batch size keeps the target
    level's decode in graphs (no eager step); NCCL variables unset; any other knob at its first choice.
    Survivors and deaths alike give the memory model its figures.
    """
    params: dict[str, Any] = {}
    for name, dist in distributions(space).items():
        if isinstance(dist, optuna.distributions.FloatDistribution):
            params[name] = round(dist.low, FLOAT_DIGITS)
            continue
        assert isinstance(dist, optuna.distributions.CategoricalDistribution)
        choices = list(dist.choices)
        if name in ("cuda_graph_max_bs", "cuda_graph_sizes") and all(isinstance(c, int) for c in choices):
            params[name] = max(choices)  # type: ignore[type-var]
        elif UNSET in choices:
            params[name] = UNSET
        else:
            params[name] = choices[0]
    return params


def normal_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Params as :func:`sample` returns them (floats rounded), so that a stored trial's
    ``0.6100000000000001`` and a sampled ``0.61`` are the same configuration."""
    return {k: round(v, FLOAT_DIGITS) if isinstance(v, float) else v for k, v in params.items()}


def startup_design(space: Space) -> list[dict[str, Any]]:
    """The launches after the probe, before the sampler models anything: one knob moved at a time from
    the probe (every other choice of a categorical knob, fewest choices first; a float range at a third
    and two thirds), so each knob's effect is seen once. The memory model still skips the ones it
    predicts die."""
    probe = probe_params(space)
    dists = distributions(space)
    moves: list[tuple[int, list[dict[str, Any]]]] = []
    for name, dist in dists.items():
        if isinstance(dist, optuna.distributions.FloatDistribution):
            span = dist.high - dist.low
            values = [dist.low + span / 3, dist.low + 2 * span / 3]
            if dist.step:
                values = [dist.low + round((v - dist.low) / dist.step) * dist.step for v in values]
            points = [{**probe, name: round(v, FLOAT_DIGITS)} for v in values]
            moves.append((1 << 20, points))
        else:
            assert isinstance(dist, optuna.distributions.CategoricalDistribution)
            points = [{**probe, name: c} for c in dist.choices if c != probe[name]]
            moves.append((len(points), points))
    out: list[dict[str, Any]] = []
    for _, points in sorted(moves, key=lambda m: m[0]):
        out += [p for p in points if p not in out]
    return out


def enqueue_start(study: optuna.Study, space: Space) -> bool:
    """Queue the study's next start-up launch, one at a time so that no backlog waits in the study: the
    probe (user attr ``probe``) for a new study, then the points of :func:`startup_design` (``design``).
    False once they have all been asked for (or the study did not start with a probe: a resumed study
    or one whose first trials someone queued)."""
    from search.records import records  # records reads params through this module

    trials = records(study)
    if not trials:
        study.enqueue_trial(probe_params(space), user_attrs={"probe": True})
        return True
    if not any(t.probe for t in trials):
        return False
    if any(t.state == optuna.trial.TrialState.WAITING for t in trials):
        return False  # something already queued goes first
    asked = sum(1 for t in trials if t.design)
    design = startup_design(space)
    if asked >= len(design):
        return False
    study.enqueue_trial(design[asked], user_attrs={"design": True})
    return True
