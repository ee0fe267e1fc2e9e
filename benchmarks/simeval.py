"""The simulated host's pure model as an evaluator, in-process: what the efficiency benchmark and the search
tests launch instead of a server.

It lives here, outside the product's import path: ``servetune run`` launches the simulated host as a real
process (``python -m runners.simhost``) like any engine, and never imports its 1k-line model.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from runners.engines.sglang import SGLangEngine
from runners.simhost.model import LevelResult as SimLevel
from runners.simhost.model import Outcome, Workload, noise_factor, predict_from_argv
from runners.simhost.profile import SimProfile, load_profile
from runners.telemetry import Failure, FailureKind, Phase
from search.trial.early import FIRST_SHARE, stop_early
from search.trial.evaluate import Slot, level_order
from search.trial.objective import TrialFailed
from search.trial.records import LevelResult, TrialFacts
from spaces.launch import LaunchConfig
from spaces.schema import Space

#: How far the first requests' figure strays from the whole level's (one sd, a share), beyond the run's noise.
FIRST_REQUESTS_SD = 0.03

# Simulator figure -> the telemetry name the SGLang log parser records it under.
_SIM_MEM = {
    "total_gib": "gpu_total_gib",
    "pre_load_avail_gib": "avail_before_weights_gib",
    "weights_gib": "weights_gib",
    "avail_after_weights_gib": "avail_after_weights_gib",
    "kv_tokens": "kv_tokens",
    "kv_gib": "kv_gib",
    "free_after_pool_gib": "avail_after_kv_gib",
    "graph_gib": "graph_gib",
    "free_after_capture_gib": "free_after_capture_gib",
    "max_running_requests": "max_running_requests",
    "max_total_num_tokens": "max_total_num_tokens",
    "tried_to_allocate_gib": "tried_to_allocate_gib",
    "free_at_oom_gib": "free_at_oom_gib",
}


@dataclass
class SimEvaluator:
    """The simulated host's pure model as an evaluator (a space whose engine is ``sim``).

    Each launch draws its own run-to-run noise (the profile's ``noise_pct``) from ``seed``; a repeat of a
    configuration is a new draw, never an earlier value. The noiseless outcome of a configuration is
    cached: the model's noise is one time factor per run, so a noisy figure is the noiseless one divided
    by that run's factor (``runners.simhost.model.noise_factor``), exactly what ``evaluate(seed=...)``
    gives. ``launches`` lists what each launch cost: (trial number, simulated seconds, died).
    """

    space: Space
    seed: int = 0
    version: str | None = None
    profile: SimProfile = field(init=False)
    launches: list[tuple[int, float, bool]] = field(default_factory=list)
    saved_seconds: float = 0.0
    """Simulated seconds the early stops saved (each stopped launch: the whole benchmark less its part)."""
    _rng: random.Random = field(init=False)
    _cache: dict[tuple[str, ...], Outcome] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.space.engine.sim is None:
            raise ValueError(f"space {self.space.name}: the simulated evaluator needs engine.kind sim")
        self.profile = load_profile(Path(self.space.engine.sim.profile))
        self.version = self.version or self.space.engine.version or "0.5.10"
        self._rng = random.Random(self.seed)

    def outcome(self, launch: LaunchConfig) -> Outcome:
        """The noiseless outcome of ``launch`` with the levels in fail-fast order (cached)."""
        argv = SGLangEngine().argv(launch.model_copy(update={"engine": "sglang"}), self.version or "")[3:]
        if launch.nodes > 1:  # rank 0 of a server spanning nodes (every node runs the profile: the same outcome)
            argv += ["--nnodes", str(launch.nodes), "--node-rank", "0", "--dist-init-addr", "127.0.0.1:5000"]
        env = launch.env
        key = (*argv, *sorted(f"{k}={v}" for k, v in env.items()))
        if key not in self._cache:
            w = self.space.workload
            target = self.space.target_level
            order = level_order(w.concurrency, target)
            per_level = dict(zip(w.concurrency, w.requests(), strict=True))
            out: Outcome | None = None
            levels = []
            for c in order:  # one level at a time: a death ends the trial
                wl = Workload(input_len=w.input_len, output_len=w.output_len, concurrency=(c,),
                              requests_per_level=per_level[c])
                out = predict_from_argv(self.profile, argv, env, wl, version=self.version or "0.5.10")
                levels += out.levels
                if out.outcome != "ok":
                    break
            assert out is not None
            self._cache[key] = out.model_copy(update={"levels": levels})
        return self._cache[key]

    def true_value(self, launch: LaunchConfig) -> float | None:
        """The noiseless objective of ``launch`` (None when it dies)."""
        out = self.outcome(launch)
        row = next((lv for lv in out.levels if lv.concurrency == self.space.target_level), None)
        if out.outcome != "ok" or row is None or not row.ok:
            return None
        value = getattr(row, self.space.objective.metric, None)
        return None if value is None else float(value)

    def evaluate(self, trial: optuna.Trial, launch: LaunchConfig, slot: Slot | None,
                 facts: TrialFacts) -> float | list[float]:
        out = self.outcome(launch)
        factor = noise_factor(self.profile, self._rng.randrange(1 << 30))
        facts.simulated = True
        facts.engine_version = self.version
        facts.memory = facts.memory.merged(_sim_memory(out))
        levels = [_sim_level(lv, factor) for lv in out.levels]
        facts.levels = [LevelResult.model_validate(row) for row in levels]
        seconds = (out.startup_s or 0.0) * factor + sum(row.get("duration", 0.0) for row in levels)
        if out.outcome == "ok" and facts.stop_bar is not None:
            levels, seconds = self._early_stop(levels, seconds, facts)
            facts.levels = [LevelResult.model_validate(row) for row in levels]
        done = [lv.max_concurrency for lv in facts.levels if lv.served]
        facts.level_reached = max(done) if done else 0
        facts.sim_seconds = round(seconds, 3)
        died = out.outcome != "ok"
        self.launches.append((trial.number, seconds, died))
        if died:
            kind = FailureKind.CRASH if out.outcome == "error" else FailureKind(out.outcome)
            # The simulator's "init" is the server starting up (before the weights load).
            phase = None if out.phase is None else Phase.STARTING if out.phase == "init" else Phase(out.phase)
            facts.outcome, facts.phase, facts.reason = kind, phase, out.error or ""
            if kind == FailureKind.OOM and phase is not None:
                facts.memory = facts.memory.merged({"oom_phase": phase.value})
            raise optuna.TrialPruned(f"{out.outcome} in {out.phase or '?'}")
        target = self.space.target_level
        row_t = next(r for r in levels if r["max_concurrency"] == target)
        facts.outcome, facts.phase, facts.reason = "ok", None, facts.stopped_early or ""
        objective = self.space.objective
        names = objective.metric_names if objective.kind == "pareto" else [objective.metric]
        missing = [m for m in names if row_t.get(m) is None]
        if missing and not next(lv for lv in out.levels if lv.concurrency == target).ok:
            # The server serves but the level's requests fail (the KV pool holds less than one request): as
            # the server path does, no figure at the target is a FAIL (search.trial.server._complete).
            error = next(lv.error for lv in out.levels if lv.concurrency == target)
            facts.outcome, facts.phase = FailureKind.INFRA, Phase.SERVING
            facts.reason = f"no {missing[0]} at concurrency {target}: {error or 'every request failed'}"
            raise TrialFailed(Failure(FailureKind.INFRA, Phase.SERVING, facts.reason))
        if missing:
            raise ValueError(f"the simulated host's pure model reports no {missing[0]}; it reports "
                             f"{', '.join(k for k in row_t if k.endswith(('_ms', '_throughput')))}")
        values = [float(row_t[m]) for m in names]
        return values if objective.kind == "pareto" else values[0]


    def _early_stop(self, levels: list[dict[str, Any]], seconds: float,
                    facts: TrialFacts) -> tuple[list[dict[str, Any]], float]:
        """The benchmark stopped after the target level's first requests when the product's rule
        (:func:`search.trial.early.stop_early`) says so: the levels and the simulated seconds that leaves. The
        target level runs first (:func:`level_order`); its first requests' figure is the level's, with the
        run's noise, off by a further :data:`FIRST_REQUESTS_SD` (one sd) for being a part of the level, and they
        take :data:`~search.trial.early.FIRST_SHARE` of its time."""
        target, metric = self.space.target_level, self.space.objective.metric
        row = next((r for r in levels if r["max_concurrency"] == target), None)
        if row is None or row.get(metric) is None or not row.get("duration") or facts.stop_bar is None:
            return levels, seconds
        first = float(row[metric]) * (1 + self._rng.gauss(0.0, FIRST_REQUESTS_SD))
        if not stop_early(facts, metric, target, first):
            return levels, seconds
        part = {**row, metric: first, "duration": row["duration"] * FIRST_SHARE,
                "completed": max(1, round(row["completed"] * FIRST_SHARE))}
        cut = (seconds - sum(r.get("duration", 0.0) for r in levels)) + part["duration"]
        self.saved_seconds += seconds - cut
        return [part], cut


def _sim_memory(out: Outcome) -> dict[str, Any]:
    """The outcome's memory figures under the names the SGLang log parser records them by."""
    memory = out.memory.model_dump() if out.memory is not None else {}
    figures = {name: memory[key] for key, name in _SIM_MEM.items() if memory.get(key) is not None}
    resolved = out.resolved or {}
    for key in ("mem_fraction_static", "cuda_graph_max_bs", "chunked_prefill_size"):
        if resolved.get(key) is not None:
            figures[key] = resolved[key]
    return figures


def _sim_level(lv: SimLevel, factor: float) -> dict[str, Any]:
    """One simulated level with this run's noise (times multiplied, rates divided by ``factor``)."""
    row: dict[str, Any] = {"max_concurrency": lv.concurrency, "completed": lv.completed,
                           "failed": 0 if lv.ok else max(lv.num_requests - lv.completed, 1), "simulated": True}
    if lv.ok and lv.output_throughput is not None:
        row["duration"] = (lv.duration_s or 0.0) * factor
        for metric in ("output_throughput", "request_throughput"):
            value = getattr(lv, metric)
            if value is not None:
                row[metric] = value / factor
        for metric in ("p99_ttft_ms", "mean_ttft_ms", "mean_tpot_ms", "median_tpot_ms"):
            value = getattr(lv, metric)
            if value is not None:
                row[metric] = value * factor
    return row
