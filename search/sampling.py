"""Turn a space's knobs into Optuna suggestions (the only place that maps knobs to distributions).

Knobs the engine version ignores are not searched (:func:`inert_knobs`): they are held at the engine's
default unless the space insists (``search_inert``). The first launch of a study is a safe probe
(:func:`probe_params`), so the memory model has a launch's figures early; the start-up design after it
(:func:`startup_design`) puts the memory knob at the highest value the model is confident survives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import optuna

from runners.engines import get_engine
from runners.errors import ConfigError
from spaces.launch import engine_options
from spaces.schema import UNSET, BoolChoices, FloatRange, IntChoices, Space

if TYPE_CHECKING:
    from search.memory import MemoryModel
    from search.records import TrialFacts

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


#: The probe keeps this many times SGLang's own reserve out of ``--mem-fraction-static``. SGLang's
#: reserve is its estimate of activations and graph buffers, and it can be short: on seed 003's host
#: (97,887 MiB cards, TP4) SGLang's default, 0.85 (a reserve of 14.7 GiB), dies in CUDA-graph capture;
#: the simulated host's model of it survives up to 0.80 at graph batch size 80 (a reserve of about
#: 19 GiB). Twice the reserve puts the probe at 0.69 there.
PROBE_RESERVE_FACTOR = 2.0


def probe_params(space: Space, gpu_mem_mib: float | None = None, version: str | None = None) -> dict[str, Any]:
    """The study's first launch: safe memory settings, the engine's defaults elsewhere.

    ``--mem-fraction-static`` (SGLang and the simulated host, when the card's memory ``gpu_mem_mib`` is
    known from the host's nvidia-smi; the space's engine version, else ``version`` as the preflight found it
    on the host) is SGLang's own default arithmetic with
    :data:`PROBE_RESERVE_FACTOR` times its reserve, rounded down onto the space's range; otherwise the
    lowest static-memory fraction in range (``mem_fraction_static``, ``gpu_memory_utilization``), which
    leaves the most memory to graphs and activations. The largest graph batch size keeps the target
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
    mfs = _probe_memory(space, gpu_mem_mib, space.engine.version or version, params.get(GRAPH_KNOB))
    if mfs is not None:
        params[MEMORY_KNOB] = mfs
    return params


def _probe_memory(space: Space, gpu_mem_mib: float | None, version: str | None, max_bs: Any) -> float | None:
    """The probe's ``--mem-fraction-static`` from SGLang's default arithmetic (None: the low end stays)."""
    from runners.engines.sglang_memory import default_memory
    from search.hosts import tp_size

    dist = distributions(space).get(MEMORY_KNOB)
    if (gpu_mem_mib is None or gpu_mem_mib <= 0 or version is None or space.engine.kind not in ("sglang", "sim")
            or not isinstance(dist, optuna.distributions.FloatDistribution)):
        return None
    try:
        value = default_memory(version, gpu_mem_mib, tp_size(space.fixed_args), fixed_args=space.fixed_args,
                               cuda_graph_max_bs=max_bs if isinstance(max_bs, int) else None,
                               reserve_factor=PROBE_RESERVE_FACTOR).mem_fraction_static
    except ConfigError:  # a version the host reported that reads as no release
        return None
    below = [v for v in _memory_values(dist) if v <= value + 1e-9]
    return below[0] if below else round(dist.low, FLOAT_DIGITS)


def normal_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Params as :func:`sample` returns them (floats rounded), so that a stored trial's
    ``0.6100000000000001`` and a sampled ``0.61`` are the same configuration."""
    return {k: round(v, FLOAT_DIGITS) if isinstance(v, float) else v for k, v in params.items()}


#: The static-memory knob the memory model places at the boundary (SGLang's ``--mem-fraction-static``).
MEMORY_KNOB = "mem_fraction_static"
#: The graph-size knob the model's graph pool is a function of.
GRAPH_KNOB = "cuda_graph_max_bs"


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _moves(space: Space, base: Mapping[str, Any], *, memory_placed: bool) -> list[dict[str, Any]]:
    """One knob moved at a time from ``base``: every other choice of a categorical knob (fewest choices
    first; numeric choices farthest from the base's first, so a knob's whole effect is seen at once), a
    float range at a third and two thirds (the memory knob not, when the model placed it: the probe and
    the base already show it at both ends)."""
    moves: list[tuple[int, list[dict[str, Any]]]] = []
    for name, dist in distributions(space).items():
        if isinstance(dist, optuna.distributions.FloatDistribution):
            if memory_placed and name == MEMORY_KNOB:
                continue
            span = dist.high - dist.low
            values = [dist.low + span / 3, dist.low + 2 * span / 3]
            if dist.step:
                values = [dist.low + round((v - dist.low) / dist.step) * dist.step for v in values]
            moves.append((1 << 20, [{**base, name: round(v, FLOAT_DIGITS)} for v in values]))
            continue
        assert isinstance(dist, optuna.distributions.CategoricalDistribution)
        choices = [c for c in dist.choices if c != base[name]]
        here = base[name]
        if isinstance(here, int | float) and all(_number(c) for c in (*choices, here)):
            choices.sort(key=lambda c: -abs(float(c) - float(here)))  # type: ignore[arg-type]
        moves.append((len(choices), [{**base, name: c} for c in choices]))
    out: list[dict[str, Any]] = []
    for _, points in sorted(moves, key=lambda m: m[0]):
        out += [p for p in points if p not in out]
    return out


def startup_design(space: Space, model: MemoryModel | None = None) -> list[dict[str, Any]]:
    """The launches after the probe, before the sampler models anything.

    Without a memory model (or before it has the probe's figures): one knob moved at a time from the
    probe. With one (SGLang's ``--mem-fraction-static`` searched): first the *base*, the probe with the
    memory knob at the highest value the model is 95% sure survives (the fastest configurations are
    usually at the largest KV pool that still leaves room for the graphs and the serving peak), then one
    knob moved at a time from the base, each point at the highest fraction at which launches have
    already *proven* it survives (:meth:`MemoryModel.proven`: at least the free memory some launch got
    through every phase with; a point that meets a phase no launch has got through, such as an eager
    decode step, goes to the low end of the range). The model is refitted before every point is queued,
    so the fractions follow what the launches so far have shown."""
    probe = probe_params(space)
    if model is None or safe_memory(space, model, probe) is None:
        return _moves(space, probe, memory_placed=False)
    base = place_memory(space, model, probe)
    return [base] + [place_memory(space, model, p, proven=True)
                     for p in _moves(space, base, memory_placed=True) if p != base]


def _memory_values(dist: optuna.distributions.FloatDistribution) -> list[float]:
    """The memory knob's values from high to low (its grid, or 20 steps without one)."""
    if dist.step:
        n = round((dist.high - dist.low) / dist.step)
        return [round(dist.low + i * dist.step, FLOAT_DIGITS) for i in range(n, -1, -1)]
    return [round(dist.high - i * (dist.high - dist.low) / 20, FLOAT_DIGITS) for i in range(21)]


def safe_memory(space: Space, model: MemoryModel, params: Mapping[str, Any], *,
                proven: bool = False) -> float | None:
    """The highest value of the memory knob at which ``params`` survive under ``model``: with a margin at
    least :data:`search.memory.Z` standard deviations above zero and no proven death, or, ``proven``, as
    launches have already shown (:meth:`MemoryModel.proven`). The low end of the range when no value
    qualifies; None when the knob is not searched or the model has no figures yet."""
    from search.memory import Candidate, Z

    dist = distributions(space).get(MEMORY_KNOB)
    if not isinstance(dist, optuna.distributions.FloatDistribution):
        return None
    bs = params.get(GRAPH_KNOB)
    for mfs in _memory_values(dist):
        cand = Candidate(mfs=mfs, max_bs=bs if isinstance(bs, int) else None, concurrency=space.target_level)
        pred = model.predict(cand)
        if pred is None:
            return None
        if pred.certain_death:
            continue
        if model.proven(cand) if proven else pred.margin_gib - Z * pred.sd_gib >= 0:
            return mfs
    return round(dist.low, FLOAT_DIGITS)


def place_memory(space: Space, model: MemoryModel, params: Mapping[str, Any], *,
                 proven: bool = False) -> dict[str, Any]:
    """``params`` with the memory knob at :func:`safe_memory` (unchanged when the model cannot say)."""
    mfs = safe_memory(space, model, params, proven=proven)
    return dict(params) if mfs is None else {**params, MEMORY_KNOB: mfs}


def enqueue_start(study: optuna.Study, space: Space, gpu_mem_mib: float | None = None,
                  version: str | None = None) -> bool:
    """Queue the study's next start-up launch, one at a time so that no backlog waits in the study: the
    probe (user attr ``probe``; ``gpu_mem_mib``, ``version``: the hosts' smallest card and the engine
    version found on them, see :func:`probe_params`) for a
    new study, then the points of :func:`startup_design` (``design``),
    placed by the memory model as refitted from every trial so far. False once they have all been asked
    for (or the study did not start with a probe: a resumed study or one whose first trials someone
    queued)."""
    from search.records import records  # records reads params through this module

    trials = records(study)
    if not trials:
        study.enqueue_trial(probe_params(space, gpu_mem_mib, version), user_attrs={"probe": True})
        return True
    if not any(t.probe for t in trials):
        return False
    if any(t.state == optuna.trial.TrialState.WAITING for t in trials):
        return False  # something already queued goes first
    model = _memory_model(space, trials)
    design = startup_design(space, model)
    # A point is asked once a design trial moved the same knobs: where the model places the memory knob
    # it is not compared (another host may have asked for the point before the probe's figures came in,
    # or the refitted model may place it elsewhere now).
    placed = model is not None and safe_memory(space, model, probe_params(space)) is not None
    # A design point another controller asked a moment ago counts by its queued params (the record's) even
    # before it has sampled them (else both controllers would launch it).
    asked = [_design_key(t.params, placed) for t in trials if t.design]
    for point in design:
        if _design_key(point, placed) not in asked:
            study.enqueue_trial(point, user_attrs={"design": True})
            return True
    return False


def _design_key(params: Mapping[str, Any], placed: bool) -> dict[str, Any]:
    return {k: v for k, v in normal_params(params).items() if not (placed and k == MEMORY_KNOB)}


def _memory_model(space: Space, trials: Sequence[TrialFacts]) -> MemoryModel | None:
    """The study's memory model for placing the start-up design (SGLang-style engines only)."""
    from search.memory import MemoryModel

    if space.engine.kind not in ("sglang", "sim"):
        return None
    from search.objective import workload_batch_tokens

    return MemoryModel.from_trials(trials, target=space.target_level, batch_tokens=workload_batch_tokens(space))
