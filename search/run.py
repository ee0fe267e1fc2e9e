"""Running a search: the study, the host pool, the callbacks (MLflow, notes, budget, signals).

:func:`run_search` is the library entry point behind ``servetune run`` and ``servetune worker``. It uses
Optuna's own loop (``study.optimize`` with one thread per host) and adds behaviour through callbacks:

* the trial budget counts COMPLETE and PRUNED trials of the whole study, so running the same command
  again (or on another machine against the same PostgreSQL study) resumes rather than restarts;
* the first SIGINT/SIGTERM lets the running trials finish, then stops; a second aborts them (their
  servers are stopped and the trials become FAIL with reason "interrupted");
* heartbeats make a trial whose controller died FAIL and re-queue its configuration
  (:mod:`search.study`); its orphaned server is stopped by the host preflight before the next trial.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from runners.errors import RunnerError
from runners.host import Host
from search.objective import Objective, ProgressHook, TrialEnv, TrialFailed
from search.pool import HostPool, NoHostsLeft
from search.study import artifact_store, create_or_load, open_storage
from spaces.schema import Space

log = logging.getLogger("servetune")

StudyCallback = Callable[[optuna.Study, FrozenTrial], None]


@dataclass
class RunOptions:
    study_name: str
    storage_url: str
    artifacts_dir: Path
    n_trials: int | None
    timeout: float | None
    seed: int | None = None
    smi_interval: float = 1.0
    cooldown: float = 300.0
    callbacks: list[StudyCallback] = field(default_factory=list)
    hook: ProgressHook | None = None
    install_signals: bool = True


@dataclass
class RunSummary:
    study: optuna.Study
    ran: int
    stopped_by: str
    host_states: list[dict[str, object]]


class _Budget:
    """Stops the study once it holds ``n_trials`` COMPLETE+PRUNED trials (across all controllers)."""

    def __init__(self, n_trials: int | None) -> None:
        self.n_trials = n_trials

    def done(self, study: optuna.Study) -> bool:
        if self.n_trials is None:
            return False
        finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
        return len(finished) >= self.n_trials

    def remaining(self, study: optuna.Study) -> int | None:
        if self.n_trials is None:
            return None
        finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
        return max(self.n_trials - len(finished), 0)


class _Signals:
    """First signal: finish the running trials, then stop. Second: abort them."""

    def __init__(self, abort: threading.Event) -> None:
        self.abort = abort
        self.stop_requested = threading.Event()
        self.count = 0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        self.stop_requested.set()
        if self.count >= 2:
            self.abort.set()


def run_search(space: Space, hosts: Sequence[Host], options: RunOptions) -> RunSummary:
    """Run (or resume) the study for ``space`` on ``hosts`` until the budget, timeout or a signal."""
    storage = open_storage(options.storage_url)
    sampler = optuna.samplers.TPESampler(seed=options.seed, n_startup_trials=min(8, options.n_trials or 8))
    study = create_or_load(storage, options.study_name, sampler=sampler)
    study.set_user_attr("space_name", space.name)
    study.set_user_attr("engine", space.engine.kind)
    pool = HostPool(list(hosts), max_consecutive_failures=space.budget.max_consecutive_failures,
                    cooldown=options.cooldown)
    abort = threading.Event()
    env = TrialEnv(
        space=space,
        study_name=options.study_name,
        pool=pool,
        artifacts_dir=options.artifacts_dir,
        artifact_store=artifact_store(options.artifacts_dir / "optuna-artifacts"),
        hook=options.hook,
        abort=abort,
        smi_interval=options.smi_interval,
    )
    budget = _Budget(options.n_trials)
    stopped_by = ["budget"]
    ran = [0]

    def budget_callback(study: optuna.Study, trial: FrozenTrial) -> None:
        ran[0] += 1
        if budget.done(study):
            study.stop()

    if budget.done(study):
        return RunSummary(study, 0, "budget already reached", pool.states())

    with _Signals(abort) as signals:
        def signal_callback(study: optuna.Study, trial: FrozenTrial) -> None:
            if signals.stop_requested.is_set():
                stopped_by[0] = "signal"
                study.stop()

        callbacks: list[StudyCallback] = [*options.callbacks, budget_callback, signal_callback]
        objective = Objective(env)

        def guarded(trial: optuna.Trial) -> float:
            try:
                return objective(trial)
            except NoHostsLeft:
                stopped_by[0] = "no hosts left"
                trial.study.stop()
                raise

        started = time.monotonic()
        try:
            study.optimize(
                guarded,
                n_trials=None,
                timeout=options.timeout,
                n_jobs=len(pool),
                catch=(TrialFailed, RunnerError, NoHostsLeft),
                callbacks=callbacks,
                gc_after_trial=False,
            )
        finally:
            if abort.is_set():
                stopped_by[0] = "aborted"
        if options.timeout is not None and time.monotonic() - started >= options.timeout:
            stopped_by[0] = "timeout"
    return RunSummary(study, ran[0], stopped_by[0], pool.states())
