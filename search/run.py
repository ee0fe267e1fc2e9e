"""Running a search: the study, the host pool, the trial loop, the budget, signals and recovery.

:func:`run_search` is the library entry point behind ``servetune run`` and ``servetune worker``. Each
controller runs one worker thread per host it owns; many controllers (on one machine or several) may
share one study through PostgreSQL (or, on one machine, SQLite). A worker loops:

1. take a free host from the :class:`~search.pool.HostPool` (waiting while every host is busy or set
   aside; a host failing ``max_consecutive_failures`` trials in a row is set aside for ``cooldown``);
2. fail stale trials (Optuna's heartbeat check: a RUNNING trial whose controller died), which re-queues
   their configurations (:mod:`search.study`);
3. **reserve** a trial against the budget, then run the objective on the host under a heartbeat, tell the
   study the outcome (COMPLETE, PRUNED or FAIL) and call the study callbacks (MLflow, notes, progress).

**The budget is exact across controllers.** ``n_trials`` counts COMPLETE+PRUNED trials of the whole study
(a FAIL is infrastructure trouble and its slot is run again). A trial is created (``study.ask``, which
also pops a re-queued WAITING trial first) only inside a study-wide lock, and only while
``COMPLETE + PRUNED + RUNNING < n_trials``: a RUNNING trial holds a reservation. So the study can never
hold more than ``n_trials`` COMPLETE+PRUNED trials, and no trial is ever created only to be thrown away.
While ``COMPLETE + PRUNED < n_trials <= COMPLETE + PRUNED + RUNNING`` a worker waits (polling) rather
than stopping: a reserved trial that ends FAIL — or whose controller dies and goes stale — frees its
slot again, so nothing is lost either. The lock is a PostgreSQL session advisory lock keyed by the study
id when the storage is PostgreSQL, an ``flock`` on a file next to the database for SQLite (one machine),
and a thread lock always (other backends: exact within one controller only). A trial's first heartbeat is
recorded inside the lock, so a controller that dies right after creating a trial leaves it stale, not
RUNNING forever.

**Signals**: the first SIGINT/SIGTERM lets the running trials finish, then stops; a second aborts them
(their servers are stopped and the trials become FAIL with reason "interrupted").

**Recovery**: before its first trial a controller stops every orphaned server on its hosts (run
directories whose process group is alive; a controller owns its hosts, so none of them is a live trial's)
and marks the RUNNING trials it finds on its hosts as interrupted. Their heartbeats stop, so within
``grace_period`` they become FAIL and their configurations are retried. After the last trial it checks its
hosts for orphans once more: no server is left running.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState

from runners.errors import RunnerError, ServetuneError
from runners.host import Host
from search.confirm import CONFIRM_K, CONFIRM_REPEATS, confirmation_plan, search_launches
from search.objective import Objective, ProgressHook, TrialEnv, TrialFailed
from search.pool import HostPool, HostSlot, NoHostsLeft
from search.sampling import enqueue_start
from search.settings import GRACE_PERIOD, HEARTBEAT_INTERVAL
from search.study import artifact_store, create_or_load, fail_stale, open_storage
from spaces.schema import Space

log = logging.getLogger("servetune")

StudyCallback = Callable[[optuna.Study, FrozenTrial], None]

#: Seconds between two looks at the study while the budget is reserved by running trials.
BUDGET_POLL = 0.5

#: A study stops once it holds this many trials per launch of its budget (skips and reuses included).
MAX_TRIALS_PER_LAUNCH = 20


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
    max_set_asides: int = 3
    heartbeat_interval: int = HEARTBEAT_INTERVAL
    grace_period: int = GRACE_PERIOD
    callbacks: list[StudyCallback] = field(default_factory=list)
    hook: ProgressHook | None = None
    confirm_k: int = CONFIRM_K
    confirm_repeats: int = CONFIRM_REPEATS


@dataclass
class RunSummary:
    study: optuna.Study
    ran: int
    stopped_by: str
    host_states: list[dict[str, object]]
    orphans_stopped: list[str] = field(default_factory=list)


# ---- the budget ----------------------------------------------------------------------------------


class _StudyLock:
    """A lock around trial creation, shared by every controller of the study (see the module docstring)."""

    def __init__(self, storage: RDBStorage, study_id: int, url: str) -> None:
        self._thread_lock = threading.Lock()
        self._storage = storage
        self._key = (0x53525654, study_id)  # "SRVT", study
        self._dialect = storage.engine.dialect.name
        self._conn: Any = None
        self._file: Path | None = None
        if self._dialect == "sqlite":
            db = url.split("///", 1)[1] if "///" in url else ""
            if db and db != ":memory:" and not db.startswith("file::memory"):
                self._file = Path(db).with_name(Path(db).name + ".servetune-lock")

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._thread_lock:
            if self._dialect == "postgresql":
                import sqlalchemy

                if self._conn is None:
                    self._conn = self._storage.engine.connect()
                try:
                    self._conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:a, :b)"),
                                       {"a": self._key[0], "b": self._key[1]})
                    self._conn.commit()
                except Exception:
                    self._drop_connection()
                    raise
                try:
                    yield
                finally:
                    try:
                        self._conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:a, :b)"),
                                           {"a": self._key[0], "b": self._key[1]})
                        self._conn.commit()
                    except Exception:  # the session is gone, and its lock with it
                        self._drop_connection()
            elif self._file is not None:
                with open(self._file, "a") as fh:
                    fcntl.flock(fh, fcntl.LOCK_EX)
                    try:
                        yield
                    finally:
                        fcntl.flock(fh, fcntl.LOCK_UN)
            else:
                yield

    def _drop_connection(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None

    def close(self) -> None:
        with self._thread_lock:
            self._drop_connection()


class _Budget:
    """``n_trials`` COMPLETE+PRUNED trials for the whole study, reserved by RUNNING ones (see above)."""

    DONE = "done"
    WAIT = "wait"

    def __init__(self, study: optuna.Study, n_trials: int | None, lock: _StudyLock,
                 storage: RDBStorage, space: Space, *, confirm_k: int = CONFIRM_K,
                 confirm_repeats: int = CONFIRM_REPEATS) -> None:
        self.study = study
        self.n_trials = n_trials
        self.lock = lock
        self.storage = storage
        self.space = space
        self.confirm_k = confirm_k
        self.confirm_repeats = confirm_repeats

    def counts(self) -> tuple[int, int]:
        """(finished, running) launches of the search proper: skips (``predicted_oom``), reused
        duplicates and confirmations are not counted (:func:`search.confirm.search_launches`)."""
        trials = self.study.get_trials(deepcopy=False,
                                       states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING))
        return search_launches(trials)

    def done(self) -> bool:
        return self.n_trials is not None and self.counts()[0] >= self.n_trials

    def reserve(self) -> optuna.Trial | str:
        """A new (or re-queued) trial with its first heartbeat recorded; or DONE; or WAIT."""
        with self.lock():
            fail_stale(self.study)  # serialised by the lock
            if self.n_trials is not None:
                finished, running = self.counts()
                if finished >= self.n_trials:
                    trials = self.study.get_trials(deepcopy=False)
                    plan = confirmation_plan(trials, self.study.direction, k=self.confirm_k,
                                             repeats=self.confirm_repeats)
                    if not plan:
                        return self.DONE if not any(t.state == TrialState.RUNNING for t in trials) else self.WAIT
                    origin, params = plan[0]
                    self.study.enqueue_trial(params, user_attrs={"confirmation_of": origin},
                                             skip_if_exists=False)
                elif finished + running >= self.n_trials:
                    return self.WAIT
                elif len(self.study.get_trials(deepcopy=False)) >= self.n_trials * MAX_TRIALS_PER_LAUNCH:
                    return self.DONE  # the sampler keeps proposing skips and twins: stop rather than spin
            enqueue_start(self.study, self.space)
            trial = self.study.ask()
            self.storage.record_heartbeat(trial._trial_id)
            return trial


class _Heartbeat:
    """Records a trial's heartbeat every ``interval`` seconds until stopped."""

    def __init__(self, storage: RDBStorage, trial_id: int, interval: float) -> None:
        self._storage = storage
        self._trial_id = trial_id
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{trial_id}", daemon=True)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._storage.record_heartbeat(self._trial_id)
            except Exception as exc:  # a storage hiccup: the next beat may get through
                log.warning("heartbeat of trial id %d not recorded: %s", self._trial_id, exc)


# ---- signals -------------------------------------------------------------------------------------


class _Signals:
    """First signal: finish the running trials, then stop. Second: abort them."""

    def __init__(self, stop: threading.Event, abort: threading.Event) -> None:
        self.stop = stop
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
        self.stop.set()
        if self.count >= 2:
            self.abort.set()
            log.warning("second %s: aborting the running trials", signal.Signals(signum).name)
        else:
            log.warning("%s: finishing the running trials, then stopping (again to abort them)",
                        signal.Signals(signum).name)


# ---- the loop ------------------------------------------------------------------------------------


class _Run:
    def __init__(self, study: optuna.Study, storage: RDBStorage, pool: HostPool, objective: Objective,
                 budget: _Budget, options: RunOptions, stop: threading.Event, abort: threading.Event) -> None:
        self.study = study
        self.storage = storage
        self.pool = pool
        self.objective = objective
        self.budget = budget
        self.options = options
        self.stop = stop
        self.abort = abort
        self.deadline = time.monotonic() + options.timeout if options.timeout is not None else None
        self.ran = 0
        self.reasons: list[str] = []
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()

    def end(self, reason: str) -> None:
        with self._lock:
            if not self.reasons:
                self.reasons.append(reason)
        self.stop.set()

    def worker(self) -> None:
        # What Optuna's own loop sets in each of its threads: this thread asks and tells trials of a
        # heartbeat storage (otherwise ``study.ask`` warns that heartbeats want ``Study.optimize``).
        self.study._thread_local.in_optimize_loop = True
        try:
            self._loop()
        except BaseException as exc:  # an unexpected error ends the whole run; run_search re-raises it
            self.errors.append(exc)
            self.end("error")

    def _loop(self) -> None:
        while not self.stop.is_set():
            if self.deadline is not None and time.monotonic() >= self.deadline:
                self.end("timeout")
                return
            try:
                slot = self.pool.acquire(stop=self.stop)
            except NoHostsLeft as exc:
                if not self.stop.is_set():
                    log.warning("%s", exc)
                    self.end("no hosts left")
                return
            try:
                if self.stop.is_set():
                    self.pool.put_back(slot)
                    return
                got = self.budget.reserve()
            except BaseException:
                self.pool.put_back(slot)
                raise
            if got == _Budget.DONE:
                self.pool.put_back(slot)
                self.end("budget")
                return
            if got == _Budget.WAIT:
                self.pool.put_back(slot)
                self.stop.wait(BUDGET_POLL)
                continue
            assert isinstance(got, optuna.Trial)
            self._trial(got, slot)

    def _trial(self, trial: optuna.Trial, slot: HostSlot) -> None:
        state = TrialState.FAIL
        value: float | None = None
        infra, error = False, ""
        fatal: BaseException | None = None
        try:
            with _Heartbeat(self.storage, trial._trial_id, self.options.heartbeat_interval):
                try:
                    value = self.objective.run(trial, slot)
                    state = TrialState.COMPLETE
                except optuna.TrialPruned:
                    state = TrialState.PRUNED
                except TrialFailed as exc:
                    infra, error = True, str(exc)
                except RunnerError as exc:
                    log.warning("trial %d failed: %s", trial.number, exc)
                except UpdateFinishedTrialError:
                    # Taken for dead (no heartbeat) by another controller and failed; its configuration
                    # has been re-queued.
                    log.warning("trial %d was failed as stale by another controller", trial.number)
                except Exception as exc:
                    fatal = exc
        finally:
            self.pool.release(slot, infra_failure=infra, error=error)
        frozen = self.study.tell(trial, value if state == TrialState.COMPLETE else None, state=state,
                                 skip_if_finished=True)
        with self._lock:
            self.ran += 1
        for callback in self.options.callbacks:
            callback(self.study, copy.deepcopy(frozen))
        if fatal is not None:
            raise fatal


def make_sampler(seed: int | None, n_trials: int | None) -> optuna.samplers.BaseSampler:
    """servetune's sampler: Optuna's TPE, which learns the feasible region from the trials' constraints
    (the memory margin, the SLOs), over fewer random start-up trials than launches."""
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(5, max(1, (n_trials or 10) // 4)),
                                      multivariate=True)


def run_search(space: Space, hosts: Sequence[Host], options: RunOptions) -> RunSummary:
    """Run (or resume) the study for ``space`` on ``hosts`` until the budget, timeout or a signal."""
    storage = open_storage(options.storage_url, heartbeat_interval=options.heartbeat_interval,
                           grace_period=options.grace_period)
    sampler = make_sampler(options.seed, options.n_trials)
    study = create_or_load(storage, options.study_name, sampler=sampler)
    study.set_user_attr("space_name", space.name)
    study.set_user_attr("engine", space.engine.kind)
    if options.n_trials is not None:
        study.set_user_attr("n_trials", options.n_trials)
    pool = HostPool(list(hosts), max_consecutive_failures=space.budget.max_consecutive_failures,
                    cooldown=options.cooldown, max_set_asides=options.max_set_asides)
    abort = threading.Event()
    stop = threading.Event()
    env = TrialEnv(
        space=space,
        study_name=options.study_name,
        artifacts_dir=options.artifacts_dir,
        artifact_store=artifact_store(options.artifacts_dir),
        hook=options.hook,
        abort=abort,
        smi_interval=options.smi_interval,
    )
    lock = _StudyLock(storage, study._study_id, options.storage_url)
    budget = _Budget(study, options.n_trials, lock, storage, space, confirm_k=options.confirm_k,
                     confirm_repeats=options.confirm_repeats)
    orphans = _recover(study, hosts, grace=space.budget.stop_grace)
    if budget.done():
        lock.close()
        return RunSummary(study, 0, "budget already reached", pool.states(), orphans)

    run = _Run(study, storage, pool, Objective(env), budget, options, stop, abort)
    with _Signals(stop, abort) as signals:
        threads = [threading.Thread(target=run.worker, name=f"servetune-worker-{i}", daemon=True)
                   for i in range(len(pool))]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(timeout=0.2)
                    if run.deadline is not None and time.monotonic() >= run.deadline and not stop.is_set():
                        run.end("timeout")
        finally:
            stop.set()
            for t in threads:
                t.join()
            lock.close()
            orphans += _cleanup(hosts, pool, grace=space.budget.stop_grace)
    if run.errors:
        raise run.errors[0]
    if abort.is_set():
        stopped_by = "aborted"
    elif signals.stop_requested.is_set():
        stopped_by = "signal"
    else:
        stopped_by = run.reasons[0] if run.reasons else "budget"
    return RunSummary(study, run.ran, stopped_by, pool.states(), orphans)


# ---- recovery ------------------------------------------------------------------------------------

STALE_REASON = "the controller stopped while this trial ran (no heartbeat); its configuration is retried"


def _recover(study: optuna.Study, hosts: Sequence[Host], *, grace: float) -> list[str]:
    """Stop orphaned servers on our hosts; mark our hosts' RUNNING trials (their controller died)."""
    stopped = _cleanup(hosts, None, grace=grace)
    names = {h.name for h in hosts}
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if trial.user_attrs.get("host") not in names:
            continue
        log.warning("trial %d was left RUNNING on %s by a controller that stopped: it will be failed once "
                    "its heartbeat is stale, and retried", trial.number, trial.user_attrs.get("host"))
        with contextlib.suppress(UpdateFinishedTrialError):
            for key, value in (("outcome", "interrupted"), ("reason", STALE_REASON)):
                study._storage.set_trial_user_attr(trial._trial_id, key, value)
    return stopped


def _cleanup(hosts: Sequence[Host], pool: HostPool | None, *, grace: float) -> list[str]:
    """Stop every orphaned server on ``hosts`` (skipping retired or set-aside ones); their run dirs."""
    skip = set()
    if pool is not None:
        skip = {str(s["host"]) for s in pool.states() if s["state"] in ("retired", "set aside")}
    stopped: list[str] = []
    for host in hosts:
        if host.name in skip:
            continue
        try:
            refs = host.cleanup_orphans(grace=grace)
        except ServetuneError as exc:
            log.warning("could not check %s for orphaned servers: %s", host.name, exc)
            continue
        for ref in refs:
            log.warning("stopped an orphaned server on %s (process group %d, %s)", host.name, ref.pgid,
                        ref.run_dir)
            stopped.append(f"{host.name}:{ref.run_dir}")
    return stopped

