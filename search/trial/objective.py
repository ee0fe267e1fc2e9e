"""One trial, start to end: ask the strategy for the configuration, reuse a measured twin, let the strategy's
gate skip a predicted death, hand the launch to an evaluator, and write the trial's record once.

How a trial ends, as Optuna's own states: a value (COMPLETE); :class:`optuna.TrialPruned` for a death the
configuration caused (an OOM, an illegal NCCL combination, a flag the engine rejects, a crash) or a skip the
memory model predicts (PRUNED); :class:`TrialFailed` for infrastructure trouble (FAIL), so the sampler learns
no false lesson. A configuration already measured (COMPLETE or PRUNED) is not run again: its result is reused.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import optuna
from optuna.trial import TrialState

from runners.errors import ServetuneError
from runners.events import ServerEvent
from runners.host import HostInfo
from runners.telemetry import Failure, FailureKind
from search._optuna_compat import ArtifactStore, known_params
from search.storage import fail_stale
from search.trial.evaluate import Evaluator, Slot
from search.trial.records import TrialFacts, normal_params, note_waiting, write_facts
from spaces.launch import LaunchConfig
from spaces.schema import Space

__all__ = ["Benchmarking", "Ended", "Gate", "HostChosen", "Objective", "ProgressHook", "TrialEnv", "TrialEvent",
           "TrialFailed", "emit"]

@dataclass(frozen=True)
class HostChosen:
    """The trial runs on ``host`` (its preflight comes next)."""

    host: str


@dataclass(frozen=True)
class Benchmarking:
    """The server is ready: the load generator runs."""


@dataclass(frozen=True)
class Ended:
    """How the trial ended: ``ok`` or a :class:`~runners.telemetry.FailureKind` value."""

    outcome: str


TrialEvent = HostChosen | Benchmarking | Ended | ServerEvent
"""What a trial tells a watcher while it runs (the server session's own events included)."""

ProgressHook = Callable[[int, TrialEvent], None]
"""``hook(trial_number, event)``."""


class TrialFailed(ServetuneError):
    """Raised out of the objective for infrastructure trouble: Optuna records the trial as FAIL."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(f"{failure.kind.value}: {failure.reason}")
        self.failure = failure


@dataclass
class TrialEnv:
    """Everything a trial needs besides the trial itself."""

    space: Space
    study_name: str
    artifacts_dir: Path
    study_uid: str = ""
    """The study's id unique per storage (:func:`search.storage.study_uid`): its run directories carry it."""
    artifact_store: ArtifactStore | None = None
    hook: ProgressHook | None = None
    abort: threading.Event = field(default_factory=threading.Event)
    smi_interval: float = 1.0
    preflight_cache: dict[str, HostInfo] = field(default_factory=dict)
    gate_reference: dict[str, Any] | None = None
    """The correctness gate's reference configuration (params), as the strategy chose it (None: the space's
    ``correctness.reference``, or every knob at the engine default)."""
    artifacts_error: str = ""
    """Set when a trial's files could not be written (a full disk): the run stops before the next trial."""


def run_folder(env: TrialEnv) -> str:
    """The name of the study's folder under a host's runs root: ``<study>.<uid>``."""
    return f"{env.study_name}.{env.study_uid}" if env.study_uid else env.study_name


def emit(env: TrialEnv, trial: optuna.Trial, event: TrialEvent) -> None:
    """Tell the run's progress hook (if any) what ``trial`` is doing."""
    if env.hook is not None:
        env.hook(trial.number, event)


class Gate(Protocol):
    """What the search's strategy decides about one trial (``search.strategy.Strategy.gate``): the
    configuration to try, whether to launch it at all, and what its launch taught the memory model."""

    def params(self, trial: optuna.Trial) -> dict[str, Any]:
        """The trial's configuration (sampled, or the queued one)."""
        ...

    def verdict(self, trial: optuna.Trial, params: dict[str, Any], facts: TrialFacts) -> None:
        """Raise :class:`optuna.TrialPruned`, with the skip recorded in ``facts``, for a configuration not worth
        launching."""
        ...

    def measured(self, trial: optuna.Trial, params: dict[str, Any], facts: TrialFacts) -> None:
        """Record what the launch (``facts``) showed, e.g. its memory margin as a constraint."""
        ...


class Objective:
    """The objective bound to a :class:`TrialEnv` and an :class:`~search.trial.evaluate.Evaluator`
    (``servetune run``: :class:`~search.trial.server.ServerEvaluator`; the benchmark: the simulated host's model).

    :meth:`run` goes: the gate's params -> reuse a measured twin -> the gate's verdict -> the evaluator -> the
    gate learns from the launch. Confirmations (``confirmation_of``) are never reused.
    """

    def __init__(self, env: TrialEnv, evaluator: Evaluator) -> None:
        self.env = env
        self.evaluator = evaluator

    def run(self, trial: optuna.Trial, slot: Slot | None, gate: Gate) -> float | list[float]:
        """Run the trial on a host the caller holds (and gives back): its value, or a ``pareto`` trial's
        values (one per metric)."""
        params = gate.params(trial)
        facts = TrialFacts.for_trial(trial)
        try:
            return self._evaluate(trial, params, slot, facts, gate)
        finally:
            # The one write of the trial's record, however it ended.
            write_facts(trial, facts)

    def _evaluate(self, trial: optuna.Trial, params: dict[str, Any], slot: Slot | None, facts: TrialFacts,
                  gate: Gate) -> float | list[float]:
        env = self.env
        if facts.confirmation_of is None:
            reused = _reuse(trial, params, facts, abort=env.abort)
            if reused is not None:
                return reused
        launch = LaunchConfig.from_params(env.space, params)
        facts.engine = launch.engine
        facts.objective_metric = env.space.objective.scored_by
        if env.space.objective.kind == "pareto":
            facts.objective_metrics = env.space.objective.metric_names
        facts.objective_level = env.space.target_level
        try:
            gate.verdict(trial, params, facts)
        except optuna.TrialPruned:
            kind = facts.outcome if isinstance(facts.outcome, FailureKind) else FailureKind.PREDICTED_OOM
            emit(env, trial, Ended(kind.value))
            raise
        try:
            value = self.evaluator.evaluate(trial, launch, slot, facts)
        except optuna.TrialPruned:
            gate.measured(trial, params, facts)
            raise
        gate.measured(trial, params, facts)
        return value


def _reuse(trial: optuna.Trial, params: dict[str, Any], facts: TrialFacts, *,
           abort: threading.Event | None = None, poll: float = 0.5) -> float | list[float] | None:
    """If these params were already measured (COMPLETE or PRUNED), reuse that result instead of rerunning:
    ``facts`` become the measured trial's (with ``duplicate_of``).

    A trial with the same params that is still RUNNING under a lower number (another host or controller
    got there first) is waited for, so that a configuration is never run twice at once; if it ends FAIL
    (infrastructure trouble), this trial runs the configuration itself.
    """
    study = trial.study
    params = normal_params(params)
    while True:
        for past in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
            if past.number == trial.number or normal_params(past.params) != params:
                continue
            measured = TrialFacts.from_trial(past)
            if measured.predicted_oom:
                continue  # a prediction, not a measurement: the model may have learnt better since
            origin = measured.duplicate_of if measured.duplicate_of is not None else past.number
            for name in TrialFacts.model_fields:
                if name not in _NOT_REUSED:
                    setattr(facts, name, getattr(measured, name))
            facts.duplicate_of = origin
            if past.state == TrialState.COMPLETE:
                for key, value in past.constraints.items():
                    trial.set_constraint(key, value)
                assert past.values
                return float(past.values[0]) if len(past.values) == 1 else [float(v) for v in past.values]
            raise optuna.TrialPruned(f"same configuration as trial {origin}: {measured.label}")
        # A twin whose controller died must not be waited for forever: fail it once it is stale
        # (its configuration is then re-queued), as the budget reservation does.
        fail_stale(study)
        # A twin that was queued and has not sampled yet counts by its queued params.
        twins = [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                 if t.number < trial.number and normal_params(known_params(t)) == params]
        if not twins:
            return None
        if abort is not None and abort.is_set():
            facts.outcome, facts.phase, facts.reason = FailureKind.INTERRUPTED, None, "interrupted"
            raise TrialFailed(Failure(FailureKind.INTERRUPTED, None, "interrupted"))
        note_waiting(trial, twins[0])
        time.sleep(poll)


#: What a reused trial does not take over from the trial it repeats: Optuna's own facts (its number,
#: state, params, times...), where it came from, and the measured trial's artifact ids.
_NOT_REUSED = frozenset(
    {name for name, f in TrialFacts.model_fields.items() if f.exclude}
    | {"duplicate_of", "artifact_ids", "probe", "design", "confirmation_of", "final"}
)
