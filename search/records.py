"""What servetune stores with each Optuna trial, and a typed view to read it back.

The objective writes these user attrs (all JSON values), so the dashboard, MLflow, ``trials``,
``export`` and ``report`` all read one record:

========================  ==================================================================================
``outcome``               ``ok`` or a :class:`~runners.telemetry.FailureKind` value (``oom``, ``nccl_error``...)
``phase``                 where it died (``cuda_graph``, ``decode``...), null when ok
``reason``                one line: why it died
``exit_code``             the server's exit code when known
``host``, ``gpu_name``    where it ran; ``gpu_count``
``engine``, ``engine_version``, ``simulated``
``launch_config``         the frozen :class:`~spaces.launch.LaunchConfig` as JSON (export renders from it)
``argv``, ``env``         exactly what ran
``mem.<figure>``          memory telemetry (``mem.free_after_capture_gib``, ``mem.kv_tokens``, ...)
``levels``                per concurrency level: bench_serving names, ``completed``, ``failed``...
``level_reached``         highest level that finished (0 if none)
``log_tail``              the last lines of the server log (holds the OOM text)
``objective_metric``      e.g. ``output_throughput``; ``objective_level``
``duplicate_of``          set when the configuration was already measured by that trial
``retried_from``          set when this trial re-runs a stale one
========================  ==================================================================================
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from search.sampling import normal_params

MEM_PREFIX = "mem."


@dataclass
class TrialRecord:
    """A trial as servetune reads it back."""

    number: int
    state: str
    value: float | None
    params: dict[str, Any]
    outcome: str
    phase: str | None
    reason: str
    host: str | None
    gpu_name: str | None
    engine: str | None
    engine_version: str | None
    simulated: bool
    memory: dict[str, Any]
    levels: list[dict[str, Any]]
    launch_config: dict[str, Any] | None
    feasible: bool
    datetime_start: str | None
    datetime_complete: str | None
    duration_s: float | None
    attrs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_trial(cls, trial: FrozenTrial) -> TrialRecord:
        attrs = dict(trial.user_attrs)
        memory = {k.removeprefix(MEM_PREFIX): v for k, v in attrs.items() if k.startswith(MEM_PREFIX)}
        state = trial.state.name
        outcome = attrs.get("outcome") or {
            "COMPLETE": "ok", "PRUNED": "pruned", "FAIL": "fail", "RUNNING": "running", "WAITING": "waiting",
        }.get(state, state.lower())
        duration = (trial.datetime_complete - trial.datetime_start).total_seconds() \
            if trial.datetime_complete and trial.datetime_start else None
        return cls(
            number=trial.number,
            state=state,
            value=trial.value if trial.state == TrialState.COMPLETE else None,
            params=normal_params(trial.params),
            outcome=outcome,
            phase=attrs.get("phase"),
            reason=attrs.get("reason", ""),
            host=attrs.get("host"),
            gpu_name=attrs.get("gpu_name"),
            engine=attrs.get("engine"),
            engine_version=attrs.get("engine_version"),
            simulated=bool(attrs.get("simulated", False)),
            memory=memory,
            levels=list(attrs.get("levels", [])),
            launch_config=attrs.get("launch_config"),
            feasible=all(float(v) <= 0 for v in trial.constraints.values()),
            datetime_start=trial.datetime_start.isoformat(timespec="seconds") if trial.datetime_start else None,
            datetime_complete=trial.datetime_complete.isoformat(timespec="seconds")
            if trial.datetime_complete else None,
            duration_s=duration,
            attrs=attrs,
        )

    @property
    def free_after_capture_gib(self) -> float | None:
        value = self.memory.get("free_after_capture_gib")
        return float(value) if value is not None else None

    def summary(self) -> dict[str, Any]:
        """A JSON-friendly row for ``servetune trials --json``."""
        return {
            "number": self.number,
            "state": self.state,
            "outcome": self.outcome,
            "phase": self.phase,
            "value": self.value,
            "feasible": self.feasible,
            "params": self.params,
            "host": self.host,
            "free_after_capture_gib": self.free_after_capture_gib,
            "tried_to_allocate_gib": self.memory.get("tried_to_allocate_gib"),
            "free_at_oom_gib": self.memory.get("free_at_oom_gib"),
            "max_total_num_tokens": self.memory.get("max_total_num_tokens"),
            "level_reached": self.attrs.get("level_reached"),
            "reason": self.reason,
            "simulated": self.simulated,
            "duration_s": self.duration_s,
        }


def records(study: optuna.Study) -> list[TrialRecord]:
    return [TrialRecord.from_trial(t) for t in study.get_trials(deepcopy=False)]


def best_record(recs: Iterable[TrialRecord], direction: StudyDirection, *,
                min_free_gib: float | None = None) -> TrialRecord | None:
    """The best COMPLETE, feasible trial of ``recs`` (a study's :func:`records`) for the study's
    ``direction`` (optionally with at least ``min_free_gib`` after capture)."""
    direction_max = direction == StudyDirection.MAXIMIZE
    best: TrialRecord | None = None
    for rec in recs:
        if rec.state != "COMPLETE" or rec.value is None or not rec.feasible:
            continue
        if rec.attrs.get("duplicate_of") is not None:
            continue
        if min_free_gib is not None and (rec.free_after_capture_gib is None
                                         or rec.free_after_capture_gib < min_free_gib):
            continue
        if best is None or (rec.value > best.value if direction_max else rec.value < best.value):  # type: ignore[operator]
            best = rec
    return best

