"""A study that starts from what earlier studies learned: the warm start.

The memory a server uses is fixed by the host's cards, the model, the engine version and the fixed args; the
workload only decides what is asked of it. A study on the same :class:`WarmKey` as earlier ones takes their
launches (dead or alive) into its memory model, and starts from their best measured configurations, each with
the memory knob placed for the new workload by that model, instead of a probe and a start-up design. Studies
on another key are not used (another engine version, other cards): :func:`usable` says why, in one line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from optuna.study import StudyDirection
from optuna.trial import TrialState

from search._optuna_compat import in_distribution
from search.strategy.confirm import confirmed_best
from search.strategy.design import MEMORY_KNOB, safe_memory
from search.strategy.distributions import distributions
from search.strategy.memory import MemoryModel
from search.trial.records import TrialFacts, normal_params
from spaces.schema import Space

__all__ = ["WARM_ATTR", "WARM_POINTS", "WARM_TOKENS_ATTR", "WARM_USED_ATTR", "Prior", "WarmKey", "prior_records",
           "usable", "warm_point", "workload_tokens"]

#: The study attribute that holds its :class:`WarmKey` (written by ``servetune run`` after the preflight).
WARM_ATTR = "warm_key"
#: The study attribute that holds the warm start's lines (the studies used, those asked for and not used).
WARM_USED_ATTR = "warm_start"
#: The study attribute that holds the most tokens its workload held at once (:func:`workload_tokens`).
WARM_TOKENS_ATTR = "warm_tokens"
#: How many of the earlier studies' best configurations a warm-started study launches before its sampler.
WARM_POINTS = 2


@dataclass(frozen=True)
class WarmKey:
    """What must be the same for an earlier study's memory and configurations to carry over."""

    gpu_name: str
    gpu_memory_mib: float
    model_path: str
    engine: str
    engine_version: str
    fixed_args: tuple[str, ...]

    def stored(self) -> dict[str, Any]:
        return {"gpu_name": self.gpu_name, "gpu_memory_mib": self.gpu_memory_mib, "model_path": self.model_path,
                "engine": self.engine, "engine_version": self.engine_version, "fixed_args": list(self.fixed_args)}

    @classmethod
    def read(cls, data: Any) -> WarmKey | None:
        """The key a study stored (None: a study stored without one, or one that does not read)."""
        if not isinstance(data, Mapping):
            return None
        try:
            return cls(str(data["gpu_name"]), float(data["gpu_memory_mib"]), str(data["model_path"]),
                       str(data["engine"]), str(data["engine_version"]), tuple(str(a) for a in data["fixed_args"]))
        except (KeyError, TypeError, ValueError):
            return None

    def differs(self, other: WarmKey) -> str | None:
        """The first fact that does not carry over from ``other`` to this key, in words (None: all do)."""
        checks = (("cards", f"{other.gpu_name} {other.gpu_memory_mib:g} MiB", f"{self.gpu_name} "
                   f"{self.gpu_memory_mib:g} MiB"), ("model", other.model_path, self.model_path),
                  ("engine", other.engine, self.engine), ("engine version", other.engine_version, self.engine_version),
                  ("fixed args", " ".join(other.fixed_args) or "none", " ".join(self.fixed_args) or "none"))
        for what, theirs, ours in checks:
            if theirs != ours:
                return f"{what} {theirs}, not {ours}"
        return None


def usable(name: str, key: WarmKey, theirs: WarmKey | None) -> str | None:
    """Why study ``name`` (stored with ``theirs``) cannot warm-start a study on ``key``; None when it can."""
    if theirs is None:
        return f"{name}: stored without the facts a warm start compares (host cards, model, engine version)"
    why = key.differs(theirs)
    return None if why is None else f"{name}: {why}"


@dataclass(frozen=True)
class Prior:
    """An earlier study used by a warm start: its name, direction and finished records."""

    name: str
    direction: StudyDirection
    records: tuple[TrialFacts, ...]
    tokens: int | None = None
    """The most tokens its workload held at once at its target level (None: not known)."""


def prior_records(priors: Sequence[Prior]) -> list[TrialFacts]:
    """The earlier studies' finished launches, numbered below zero (-1, -2, ...) so that they never stand for a
    trial of this study: what the memory model is fitted on besides this study's own launches."""
    out: list[TrialFacts] = []
    for prior in priors:
        for rec in prior.records:
            if rec.state in (TrialState.COMPLETE, TrialState.PRUNED) and rec.launched and rec.outcome is not None:
                out.append(rec.model_copy(update={"number": -(len(out) + 1)}))
    return out


def _ranked(space: Space, priors: Sequence[Prior]) -> list[dict[str, Any]]:
    """The earlier studies' measured configurations, best first (each study's confirmed choice, then each
    configuration by its best figure in its own study), restricted to the knobs and values this space searches."""
    dists = distributions(space)
    best: list[tuple[float, dict[str, Any]]] = []
    for prior in priors:
        sign = 1.0 if prior.direction == StudyDirection.MAXIMIZE else -1.0
        for rec in prior.records:
            if rec.state != TrialState.COMPLETE or rec.value is None or not rec.feasible or rec.stopped_early:
                continue
            params = normal_params(rec.params)
            if set(params) != set(dists) or any(not in_distribution(dists[k], v)
                                                 for k, v in params.items()):
                continue
            best.append((sign * float(rec.value), params))
    best.sort(key=lambda b: -b[0])
    # Each earlier study's confirmed choice first (chosen on repeated launches), then the rest by their figure.
    chosen = []
    for prior in priors:
        confirmed = confirmed_best(prior.records, prior.direction)
        first = next((r for r in prior.records if confirmed is not None and r.number == confirmed.trial), None)
        if first is not None:
            chosen.append((float("inf"), normal_params(first.params)))
    best = [b for b in chosen if set(b[1]) == set(dists)] + best
    out: list[dict[str, Any]] = []
    for _, params in best:
        key = {k: v for k, v in params.items() if k != MEMORY_KNOB}
        if all({k: v for k, v in p.items() if k != MEMORY_KNOB} != key for p in out):
            out.append(params)
    return out


def workload_tokens(space: Space) -> int | None:
    """The most tokens the workload holds at once at its target level (None: prompts of unknown length)."""
    wl = space.workload
    if wl.dataset or wl.input_len is None:
        return None
    return space.target_level * (wl.input_len + (wl.prefix.len if wl.prefix is not None else 0) + wl.output_len)


def warm_point(space: Space, trials: Sequence[TrialFacts], model: MemoryModel | None,
               priors: Sequence[Prior]) -> dict[str, Any] | None:
    """The next warm-start launch (tagged ``design``), or None once :data:`WARM_POINTS` have been asked or no
    earlier configuration fits this space: the earlier studies' best configurations in turn, the memory knob
    placed by ``model`` (fitted on their launches and this study's) at the highest value it is sure survives for
    this workload."""
    asked = [{k: v for k, v in normal_params(t.params).items() if k != MEMORY_KNOB} for t in trials if t.design]
    if len(asked) >= WARM_POINTS:
        return None
    for params in _ranked(space, priors)[:WARM_POINTS]:
        if {k: v for k, v in params.items() if k != MEMORY_KNOB} in asked:
            continue
        sure = None if model is None else safe_memory(space, model, params)
        if model is None or sure is None:
            return params
        # The higher of what the model is sure of and the highest fraction at which the same configuration served
        # in an earlier study (a new workload of no more tokens at once needs no more memory).
        key = {k: v for k, v in params.items() if k != MEMORY_KNOB}
        served = [float(r.params[MEMORY_KNOB]) for prior in priors for r in prior.records
                  if r.state == TrialState.COMPLETE and r.ok and MEMORY_KNOB in r.params
                  and {k: v for k, v in normal_params(r.params).items() if k != MEMORY_KNOB} == key]
        smaller = workload_tokens(space) is not None and all(
            (t := prior.tokens) is not None and t >= (workload_tokens(space) or 0) for prior in priors)
        proven = max(served) if served and smaller else sure
        return {**params, MEMORY_KNOB: max(sure, proven)}
    return None
