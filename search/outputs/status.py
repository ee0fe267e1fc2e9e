"""``servetune status``: where a study stands, as a typed value (:func:`study_status`; ``model_dump()`` is its
JSON): trials by state, each host's activity, servetune's choice so far and an estimate of the time left."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Literal

from optuna.trial import TrialState
from pydantic import BaseModel

from search.strategy.view import StudyView
from search.trial.records import TrialFacts

__all__ = ["BestTrial", "HostActivity", "RunningTrial", "StudyStatus", "TrialCounts", "durations", "seconds",
           "study_status"]

#: Outcomes that say the host, not the configuration, could not take a trial: the host is shown unavailable.
_INFRA_TROUBLE = frozenset({"host_unreachable", "host_busy", "host_config", "port_in_use"})


class TrialCounts(BaseModel):
    """Trials of a study by state (``done``: COMPLETE+PRUNED+FAIL; ``oom``: trials that ran out of memory), and
    as a person reads a search (:class:`~search.strategy.view.Counts`): ``search`` (the finished trials that hold
    a slot of the search budget: launches and reuses), ``confirmations`` (repeats of a configuration, outside
    the budget), ``skipped`` (not launched: predicted to die of OOM; PRUNED like a death), ``reused``
    (answered from an earlier launch), ``died`` (launches PRUNED: OOM, NCCL, a refused flag, a crash)."""

    total: int
    done: int
    complete: int
    pruned: int
    failed: int
    running: int
    waiting: int
    oom: int
    search: int = 0
    confirmations: int = 0
    skipped: int = 0
    reused: int = 0
    died: int = 0


class RunningTrial(BaseModel):
    number: int
    host: str | None
    params: dict[str, Any]
    elapsed_s: float | None


class HostActivity(BaseModel):
    """A host as the study's trials show it (``unavailable``: its last trial found it unreachable or busy)."""

    state: Literal["idle", "running", "unavailable"]
    trial: int | None
    elapsed_s: float | None
    trials: int
    complete: int
    pruned: int
    failed: int
    last_outcome: str | None
    last_reason: str | None
    gpu_name: str | None


class BestTrial(BaseModel):
    """servetune's choice (a ``pareto`` study: the knee of its front, with ``values`` one per metric, named by
    ``metrics``); ``metric`` and ``level`` say what ``value`` measures."""

    number: int
    value: float | None
    values: list[float] | None = None
    metric: str | None = None
    metrics: list[str] | None = None
    level: int | None = None
    params: dict[str, Any]
    host: str | None
    free_after_capture_gib: float | None
    simulated: bool


class StudyStatus(BaseModel):
    """Where a study stands (``servetune status``; ``model_dump()`` is its JSON)."""

    study: str
    direction: str
    trials: TrialCounts
    running: list[RunningTrial]
    hosts: dict[str, HostActivity]
    best: BestTrial | None
    state: Literal["running", "idle"]
    """``running`` while a trial runs or waits; ``idle`` otherwise (the clock then stops at the last end)."""
    elapsed_s: float | None
    mean_trial_s: float | None
    n_trials: int | None
    remaining_trials: int | None
    workers: int
    eta_s: float | None


def study_status(view: StudyView, *, n_trials: int | None = None, workers: int | None = None,
                 now: datetime | None = None) -> StudyStatus:
    """Live figures for ``servetune status``.

    ``n_trials`` is the study's search budget (as ``servetune run --n-trials``: a
    FAIL trial is infrastructure trouble and is run again). The time left is the mean duration of a finished
    (not reused) trial x the trials left / ``workers`` (default: the trials running now, at least 1).
    ``now`` is for tests; Optuna stores local naive times.
    """
    now = now or datetime.now()
    recs = view.records
    counts = Counter(r.state.name for r in recs)
    finished = counts["COMPLETE"] + counts["PRUNED"] + counts["FAIL"]
    running = [r for r in recs if r.state == TrialState.RUNNING]
    spent = durations(recs)
    mean = sum(spent) / len(spent) if spent else None
    remaining = max(0, n_trials - view.counts.search_done) if n_trials is not None else None
    parallel = max(1, workers if workers is not None else len(running))
    eta = mean * remaining / parallel if mean is not None and remaining is not None else None
    best = view.choice.record if view.choice is not None else None
    starts = [seconds(r.datetime_start) for r in recs if r.datetime_start]
    goal = view.goal
    return StudyStatus.model_validate({
        "study": view.name,
        "direction": f"pareto: {goal.describe()}" if goal.pareto else view.direction.name.lower(),
        "trials": {
            "total": len(recs),
            "done": finished,
            "complete": counts["COMPLETE"],
            "pruned": counts["PRUNED"],
            "failed": counts["FAIL"],
            "running": counts["RUNNING"],
            "waiting": counts["WAITING"],
            "oom": sum(1 for r in recs if r.label == "oom"),
            "search": view.counts.search_done,
            "confirmations": view.counts.confirmations,
            "skipped": view.counts.skips,
            "reused": view.counts.reused,
            "died": sum(1 for r in recs if r.state == TrialState.PRUNED and r.launched and not r.predicted_oom),
        },
        "running": [
            {"number": r.number, "host": r.host, "params": r.params,
             "elapsed_s": _elapsed(r, now)}
            for r in running
        ],
        "hosts": _hosts(recs, now),
        "best": None if best is None else {
            "number": best.number,
            "value": view.choice.value if view.choice is not None else best.value,
            "values": best.values,
            "metric": best.objective_metric,
            "metrics": best.objective_metrics,
            "level": best.objective_level,
            "params": best.params,
            "host": best.host,
            "free_after_capture_gib": best.free_after_capture_gib,
            "simulated": best.simulated,
        },
        # The clock stops when the study does: with nothing running or queued, at the last trial's end.
        "state": "running" if counts["RUNNING"] or counts["WAITING"] else "idle",
        "elapsed_s": round((_clock_end(recs, now) - min(starts)).total_seconds(), 1) if starts else None,
        "mean_trial_s": round(mean, 1) if mean is not None else None,
        "n_trials": n_trials,
        "remaining_trials": remaining,
        "workers": parallel,
        "eta_s": round(eta, 1) if eta is not None else None,
    })


def _clock_end(recs: Sequence[TrialFacts], now: datetime) -> datetime:
    if any(r.state in (TrialState.RUNNING, TrialState.WAITING) for r in recs):
        return now
    ends = [r.datetime_complete for r in recs if r.datetime_complete is not None]
    return max(ends) if ends else now


def durations(recs: Iterable[TrialFacts]) -> list[float]:
    """Durations of finished trials that ran (a reused duplicate took no time)."""
    return [r.duration_s for r in recs
            if r.duration_s is not None and r.state != TrialState.RUNNING and r.launched]


def seconds(when: datetime) -> datetime:
    """``when`` to the second, as the report has always printed it."""
    return when.replace(microsecond=0)


def _elapsed(rec: TrialFacts, now: datetime) -> float | None:
    if rec.datetime_start is None:
        return None
    return round((now - seconds(rec.datetime_start)).total_seconds(), 1)


def _hosts(recs: Sequence[TrialFacts], now: datetime) -> dict[str, dict[str, Any]]:
    hosts: dict[str, dict[str, Any]] = {}
    for rec in sorted(recs, key=lambda r: r.number):
        if not rec.host or rec.predicted_oom:  # a skip never ran on the host
            continue
        entry = hosts.setdefault(rec.host, {
            "state": "idle", "trial": None, "elapsed_s": None, "trials": 0, "complete": 0, "pruned": 0,
            "failed": 0, "last_outcome": None, "last_reason": None, "gpu_name": None,
        })
        entry["trials"] += 1
        entry["gpu_name"] = rec.gpu_name or entry["gpu_name"]
        if rec.state == TrialState.RUNNING:
            entry.update(state="running", trial=rec.number, elapsed_s=_elapsed(rec, now))
            continue
        key = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned", TrialState.FAIL: "failed"}.get(
            rec.state)
        if key is None:
            continue
        entry[key] += 1
        entry["last_outcome"] = rec.label
        entry["last_reason"] = rec.reason or None
    for entry in hosts.values():
        if entry["state"] != "running" and entry["last_outcome"] in _INFRA_TROUBLE:
            entry["state"] = "unavailable"
    return hosts
