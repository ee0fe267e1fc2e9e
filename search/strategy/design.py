"""Where a study starts: the probe, then a start-up design placed by the memory model.

The first launch of a study is a safe probe (:func:`probe_params`), so the memory model has a launch's
figures early; the start-up design after it (:func:`startup_design`) moves one knob at a time, with the
memory knob at the highest value the model is confident survives (:func:`place_memory`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from runners.checkpoint import GIB, CheckpointFacts
from runners.engines.sglang_memory import default_memory
from runners.errors import ConfigError
from search.spaces import engine_of
from search.strategy.distributions import distributions
from search.strategy.memory import Candidate, MemoryModel, Z
from search.trial.records import FLOAT_DIGITS, TrialFacts, normal_params
from spaces.schema import UNSET, Space

#: The probe keeps this many times SGLang's own reserve out of ``--mem-fraction-static``. SGLang's
#: reserve is its estimate of activations and graph buffers, and it can be short: on seed 003's host
#: (97,887 MiB cards, TP4) SGLang's default, 0.85 (a reserve of 14.7 GiB), dies in CUDA-graph capture;
#: the simulated host's model of it survives up to 0.80 at graph batch size 80 (a reserve of about
#: 19 GiB). Twice the reserve puts the probe at 0.69 there.
PROBE_RESERVE_FACTOR = 2.0


def probe_params(space: Space, gpu_mem_mib: float | None = None, version: str | None = None,
                 checkpoint: CheckpointFacts | None = None) -> dict[str, Any]:
    """The study's first launch: safe memory settings, the engine's defaults elsewhere.

    ``--mem-fraction-static`` (SGLang and the simulated host, when the card's memory ``gpu_mem_mib`` is
    known from the host's nvidia-smi; the space's engine version, else ``version`` as the preflight found it
    on the host) is SGLang's own default arithmetic with
    :data:`PROBE_RESERVE_FACTOR` times its reserve, rounded down onto the space's range; otherwise the
    lowest static-memory fraction in range (``mem_fraction_static``, ``gpu_memory_utilization``), which
    leaves the most memory to graphs and activations. The largest graph batch size keeps the target
    level's decode in graphs (no eager step); NCCL variables unset; any other knob at its first choice.
    Survivors and deaths alike give the memory model its figures.

    With the ``checkpoint``'s figures (the weights' size and config.json, read by the preflight) the probe
    starts where the model fits (:func:`fit_fraction`): when the weights and the target level's KV cache
    need more than that fraction, the probe takes what they need (up to what leaves the graphs room), and the
    smallest graph batch size that still holds the target level (the graphs' pool is what such a card can
    least spare).
    """
    params: dict[str, Any] = {}
    for name, dist in distributions(space).items():
        if isinstance(dist, optuna.distributions.FloatDistribution):
            params[name] = round(dist.low, FLOAT_DIGITS)
            continue
        if isinstance(dist, optuna.distributions.IntDistribution):
            params[name] = dist.low
            continue
        assert isinstance(dist, optuna.distributions.CategoricalDistribution)
        choices = list(dist.choices)
        if name in ("cuda_graph_max_bs", "cuda_graph_sizes") and all(isinstance(c, int) for c in choices):
            params[name] = max(choices)  # type: ignore[type-var]
        elif UNSET in choices:
            params[name] = UNSET
        else:
            params[name] = choices[0]
    version = space.engine.version or version
    mfs = _probe_memory(space, gpu_mem_mib, version, params.get(GRAPH_KNOB))
    fit = fit_fraction(space, gpu_mem_mib, version, checkpoint)
    memory = distributions(space).get(MEMORY_KNOB)
    if fit is not None and mfs is not None and fit > mfs and isinstance(memory, optuna.distributions.FloatDistribution):
        above = [v for v in reversed(_memory_values(memory)) if v >= fit - 1e-9]
        mfs = above[0] if above else round(memory.high, FLOAT_DIGITS)
        graph = distributions(space).get(GRAPH_KNOB)
        if isinstance(graph, optuna.distributions.CategoricalDistribution):
            sizes = sorted(c for c in graph.choices if isinstance(c, int) and not isinstance(c, bool))
            holding = [c for c in sizes if c >= space.target_level]
            if holding:
                params[GRAPH_KNOB] = holding[0]
    if mfs is not None:
        params[MEMORY_KNOB] = mfs
    return space.knobs.active(params)


#: Memory besides the weights and the KV pool the arithmetic of :func:`fit_fraction` counts before any launch
#: (GiB per GPU): the CUDA context and NCCL's buffers, taken from the card before ``--mem-fraction-static``
#: applies (SGLang's "avail mem" before the weights load).
PRE_LOAD_OVERHEAD_GIB = 1.0
#: The KV cache the probe sizes for: the target level's requests at full length, with this headroom.
KV_HEADROOM = 1.1
#: What :func:`fit_fraction` leaves out of the static pool at least: this many GiB, and a third of SGLang's
#: own reserve (the graphs and activations of the largest graph batch).
MIN_FREE_GIB = 3.0


def fit_fraction(space: Space, gpu_mem_mib: float | None, version: str | None,
                 checkpoint: CheckpointFacts | None) -> float | None:
    """The ``--mem-fraction-static`` at which the checkpoint's weights and the KV cache of the target level's
    requests at full length fit, from what the host and the model say before any launch (the card's memory
    from nvidia-smi; the weights' size, layers and KV heads from the checkpoint)::

        pre = card - PRE_LOAD_OVERHEAD_GIB
        fit = (weights / tp + KV_HEADROOM * target * (input + output) * kv_bytes_per_token) / pre

    capped where at least ``max(MIN_FREE_GIB, reserve / 3)`` stays outside the pool. None when a figure is
    missing (no checkpoint, a dataset's prompts of unknown length, an engine without SGLang's arithmetic)."""
    engine = engine_of(space)
    wl = space.workload
    if (checkpoint is None or gpu_mem_mib is None or gpu_mem_mib <= 0 or version is None
            or engine.memory_family != "sglang" or wl.dataset or wl.input_len is None):
        return None
    tp = engine.tp_size(space.fixed_args)
    per_token = checkpoint.kv_bytes_per_token(tp)
    if per_token is None:
        return None
    card = gpu_mem_mib / 1024
    pre = card - PRE_LOAD_OVERHEAD_GIB
    prefix = wl.prefix.len if wl.prefix is not None else 0
    tokens = space.target_level * (wl.input_len + prefix + (wl.output_len or 0))
    need = checkpoint.weights_gib_per_gpu(tp) + KV_HEADROOM * tokens * per_token / GIB
    try:
        reserve = default_memory(version, gpu_mem_mib, tp, fixed_args=space.fixed_args).reserved_mib / 1024
    except ConfigError:
        return None
    cap = 1 - max(MIN_FREE_GIB, reserve / 3) / pre
    return min(need / pre, cap)


def _probe_memory(space: Space, gpu_mem_mib: float | None, version: str | None, max_bs: Any) -> float | None:
    """The probe's ``--mem-fraction-static`` from SGLang's default arithmetic (None: the low end stays)."""
    dist = distributions(space).get(MEMORY_KNOB)
    engine = engine_of(space)
    if (gpu_mem_mib is None or gpu_mem_mib <= 0 or version is None or engine.memory_family != "sglang"
            or not isinstance(dist, optuna.distributions.FloatDistribution)):
        return None
    try:
        value = default_memory(version, gpu_mem_mib, engine.tp_size(space.fixed_args), fixed_args=space.fixed_args,
                               cuda_graph_max_bs=max_bs if isinstance(max_bs, int) else None,
                               reserve_factor=PROBE_RESERVE_FACTOR).mem_fraction_static
    except ConfigError:  # a version the host reported that reads as no release
        return None
    below = [v for v in _memory_values(dist) if v <= value + 1e-9]
    return below[0] if below else round(dist.low, FLOAT_DIGITS)


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
        if isinstance(dist, optuna.distributions.IntDistribution):
            ints = sorted({dist.low + round((dist.high - dist.low) * f / 3 / dist.step) * dist.step for f in (1, 2)}
                          - {base.get(name)})
            moves.append((len(ints), [{**base, name: v} for v in ints]))
            continue
        assert isinstance(dist, optuna.distributions.CategoricalDistribution)
        here = base.get(name)
        choices = [c for c in dist.choices if c != here]
        if isinstance(here, int | float) and all(_number(c) for c in (*choices, here)):
            choices.sort(key=lambda c: -abs(float(c) - float(here)))  # type: ignore[arg-type]
        moves.append((len(choices), [{**base, name: c} for c in choices]))
    out: list[dict[str, Any]] = []
    for _, points in sorted(moves, key=lambda m: m[0]):
        # A move of a knob its condition switches off is no move: it is dropped (the same launch as base).
        active = [space.knobs.active(p) for p in points]
        out += [p for p in active if p not in out and p != space.knobs.active(dict(base))]
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
    least :data:`search.strategy.memory.Z` standard deviations above zero and no proven death, or, ``proven``, as
    launches have already shown (:meth:`MemoryModel.proven`). The low end of the range when no value
    qualifies; None when the knob is not searched or the model has no figures yet."""
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


def start_point(space: Space, trials: Sequence[TrialFacts], model: MemoryModel | None, *,
                gpu_mem_mib: float | None = None, version: str | None = None,
                checkpoint: CheckpointFacts | None = None) -> tuple[dict[str, Any], str] | None:
    """The study's next start-up launch as (params, tag), or None once they have all been asked for: the
    probe (tag ``probe``; ``gpu_mem_mib``, ``version``: the hosts' smallest card and the engine version found
    on them, see :func:`probe_params`) for a new study, then the points of :func:`startup_design` (``design``),
    placed by ``model`` (the memory model fitted to ``trials``). None as well when the study did not start
    with a probe (a resumed study, or one whose first trials someone queued) and while something queued waits
    (it goes first): one point at a time, so that no backlog waits in the study.

    A point whose launches all ended FAIL (the controller was interrupted, the host was busy or unreachable:
    nothing was learnt about the configuration) is asked for again, the probe first; a retry Optuna queued for
    a stale trial (``retried_from``) counts as the point's launch."""
    if not trials:
        return probe_params(space, gpu_mem_mib, version, checkpoint), "probe"
    probes = [t for t in trials if t.probe]
    if not probes:
        return None
    if any(t.state == optuna.trial.TrialState.WAITING for t in trials):
        return None
    if all(t.state == optuna.trial.TrialState.FAIL for t in probes):
        params = normal_params(probes[0].params) or probe_params(space, gpu_mem_mib, version, checkpoint)
        if not any(_stands_for(t) and normal_params(t.params) == params for t in trials):
            return params, "probe"
    design = startup_design(space, model)
    # A point is asked once a design trial moved the same knobs: where the model places the memory knob
    # it is not compared (another host may have asked for the point before the probe's figures came in,
    # or the refitted model may place it elsewhere now).
    placed = model is not None and safe_memory(space, model, probe_params(space)) is not None
    # A design point another controller asked a moment ago counts by its queued params (the record's) even
    # before it has sampled them (else both controllers would launch it).
    asked = [_design_key(t.params, placed) for t in trials if (t.design or t.retried_from is not None)
             and _stands_for(t)]
    for point in design:
        if _design_key(point, placed) not in asked:
            return point, "design"
    return None


def _stands_for(trial: TrialFacts) -> bool:
    """Does ``trial`` count as its point's launch: anything but FAIL (running, waiting, measured, pruned)."""
    return trial.state != optuna.trial.TrialState.FAIL


def _design_key(params: Mapping[str, Any], placed: bool) -> dict[str, Any]:
    return {k: v for k, v in normal_params(params).items() if not (placed and k == MEMORY_KNOB)}
