"""Running a search: :func:`run_search`, behind ``servetune run`` and ``servetune worker``.

One worker thread per host takes a free host from the :class:`~search.driver.pool.HostPool`, claims it (other
controllers' live claims are waited for), reserves a trial from the :class:`~search.driver.budget.Budget` (which
applies the strategy's next step inside a lock every controller of the study shares, so ``n_trials`` search
launches are exact across controllers), runs the objective under a heartbeat and tells the study how it ended.
Before the first trial every host is preflighted (set-up faults drop it with one line) and orphaned servers of
dead controllers are stopped; after the last, no server is left. The first SIGINT/SIGTERM lets running trials
finish, a second aborts them. A lost heartbeat makes a trial FAIL and its configuration is retried.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from pathlib import Path

import optuna
from optuna.exceptions import StorageInternalError, UpdateFinishedTrialError
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.exc import SQLAlchemyError

from runners.errors import ConfigError, HostMisconfigured, RunnerError, ServetuneError, StudyError, first_line
from runners.host import Host, HostGroup, HostInfo, Lease, new_controller_id
from runners.telemetry import FailureKind
from search._optuna_compat import enter_optimize_loop, study_id, trial_id
from search.driver.budget import Budget, NoTrial, StudyLock
from search.driver.leases import LEASE_TTL, Leases
from search.driver.pool import HostPool, HostSlot, HostStatus, NoHostsLeft
from search.driver.signals import Heartbeat, Signals
from search.settings import GRACE_PERIOD, HEARTBEAT_INTERVAL, STORAGE_RETRY, study_name
from search.spaces import sim_calibration
from search.storage import artifact_store, create_or_load, open_storage, redact, study_uid
from search.strategy.choice import CHOICE_ATTR, NO_CHOICE_YET
from search.strategy.confirm import CONFIRM_FINAL, CONFIRM_K, CONFIRM_REPEATS
from search.strategy.distributions import conditional
from search.strategy.strategy import Strategy, make_sampler
from search.strategy.view import StudyView
from search.strategy.warm import (
    WARM_ATTR,
    WARM_TOKENS_ATTR,
    WARM_USED_ATTR,
    Prior,
    WarmKey,
    usable,
    workload_tokens,
)
from search.trial.objective import Ended, HostChosen, Objective, ProgressHook, TrialEnv, TrialFailed
from search.trial.preflight import preflight
from search.trial.records import (
    DEPLOY_ATTR,
    SIM_CALIBRATION_ATTR,
    TrialFacts,
    mark_interrupted,
    note_controller,
    records,
    write_facts,
)
from search.trial.server import ServerEvaluator
from spaces.schema import Space

log = logging.getLogger("servetune")

StudyCallback = Callable[[StudyView, FrozenTrial], None]
"""Called after each finished trial with one view of the study (read once for every callback) and the trial."""

#: Seconds between two looks at the study while the budget is reserved by running trials.
BUDGET_POLL = 0.5
#: Seconds a host held by another controller is left alone before it is tried again.
HELD_POLL = 2.0
#: What a study storage raises when it stops taking writes (Optuna wraps a failed commit in its own error).
STORAGE_ERRORS = (SQLAlchemyError, StorageInternalError)


def _storage_error(exc: BaseException) -> str:
    """The first line of what the database said (Optuna's wrapper names no cause)."""
    cause = exc.__cause__ if isinstance(exc, StorageInternalError) and exc.__cause__ is not None else exc
    return first_line(getattr(cause, "orig", None) or cause)


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
    lease_ttl: float = LEASE_TTL
    storage_retry: float = STORAGE_RETRY
    """Seconds a dropped connection to the study's database server is retried before the run stops."""
    confirm_k: int = CONFIRM_K
    confirm_repeats: int = CONFIRM_REPEATS
    confirm_final: int = CONFIRM_FINAL
    warm_start: tuple[str, ...] = ()
    """Earlier studies (names in the same storage) to warm-start from; ``auto``: every study there stored on the
    same host cards, model, engine version and fixed args (:mod:`search.strategy.warm`)."""
    early_stop: bool = True
    """Stop a search launch's benchmark after the target level's first requests when they show it cannot beat
    the study's best (:mod:`search.trial.early`)."""


class StopReason(StrEnum):
    """Why a run ended."""

    BUDGET = "budget"
    BUDGET_REACHED = "budget already reached"
    """The study held its budget before this run started a trial."""
    TIMEOUT = "timeout"
    NO_HOSTS = "no hosts left"
    SIGNAL = "signal"
    """The first SIGINT/SIGTERM: the running trials finished."""
    ABORTED = "aborted"
    """A second signal: the running trials were aborted."""
    ERROR = "error"
    ARTIFACTS = "trial files not written"
    """A trial's files could not be written (a full disk): its result is recorded, the run stops."""

    @property
    def interrupted(self) -> bool:
        return self in (StopReason.SIGNAL, StopReason.ABORTED)


@dataclass
class RunSummary:
    """What a run did: the study, how many trials it ran, why it stopped, its hosts at the end."""

    study: optuna.Study
    ran: int
    stopped_by: StopReason
    host_states: list[HostStatus]
    orphans_stopped: list[str] = field(default_factory=list)
    report_path: Path | None = None
    """Where :func:`search.api.run_study` wrote the morning summary (Markdown)."""
    report_html_path: Path | None = None
    """Where :func:`search.api.run_study` wrote the HTML report (with the figures)."""
    mlflow_error: str | None = None
    """Why the study's MLflow parent run could not be finished (:func:`search.api.run_study`)."""
    report_error: str | None = None
    """Why the morning summary could not be written (the study has everything)."""
    artifacts_error: str | None = None
    """Why a trial's files could not be written, when the run stopped for it (``StopReason.ARTIFACTS``)."""
    hosts_dropped: list[str] = field(default_factory=list)
    """One line per host dropped by the preflight (host, fault, fix)."""
    space: Space | None = None
    """The run's space: its view has the study's memory model (the OOM map's predicted boundary)."""
    warm_start: list[str] = field(default_factory=list)
    """The warm start in lines: the studies used, and each study asked for but not used with why."""

    @cached_property
    def view(self) -> StudyView:
        """The study as the run left it, read once for the report, MLflow and the run's last lines."""
        return StudyView.of(self.study, space=self.space)

    @property
    def no_progress(self) -> str | None:
        """Why this run made no progress, in one line (its command then exits non-zero), or None: every host
        was retired before the budget was spent, or the timeout passed before any trial ran (another controller
        held the hosts). A run stopped by a signal, or whose study's budget was spent (by it or by other
        controllers), is not one."""
        if self.stopped_by.interrupted or self.stopped_by is StopReason.BUDGET_REACHED:
            return None
        if self.stopped_by is StopReason.NO_HOSTS:
            why = "; ".join(f"{s.host}: {s.last_error or s.state}" for s in self.host_states)
            return f"every host was retired before the budget was spent ({why}); {self.ran} trial(s) ran"
        if self.ran == 0 and self.stopped_by is StopReason.TIMEOUT:
            held = "; ".join(s.held_by for s in self.host_states if s.held_by)  # each names its host
            return f"no trial ran in this run (stopped by: {self.stopped_by})" + (f"; {held}" if held else "")
        return None


# ---- the loop ------------------------------------------------------------------------------------


class _Run:
    def __init__(self, study: optuna.Study, storage: RDBStorage, pool: HostPool, objective: Objective,
                 budget: Budget, options: RunOptions, stop: threading.Event, abort: threading.Event) -> None:
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
        self.reasons: list[StopReason] = []
        self.errors: list[BaseException] = []
        self.leases: Leases | None = None
        self._lock = threading.Lock()

    def end(self, reason: StopReason) -> None:
        with self._lock:
            if not self.reasons:
                self.reasons.append(reason)
        self.stop.set()

    def worker(self) -> None:
        # What Optuna's own loop sets in each of its threads: this thread asks and tells trials of a
        # heartbeat storage (otherwise ``study.ask`` warns that heartbeats want ``Study.optimize``).
        enter_optimize_loop(self.study)
        try:
            self._loop()
        except BaseException as exc:  # an unexpected error ends the whole run; run_search re-raises it
            self.errors.append(exc)
            self.end(StopReason.ERROR)

    def _loop(self) -> None:
        while not self.stop.is_set():
            if self.deadline is not None and time.monotonic() >= self.deadline:
                self.end(StopReason.TIMEOUT)
                return
            try:
                slot = self.pool.acquire(stop=self.stop)
            except NoHostsLeft as exc:
                if not self.stop.is_set():
                    log.warning("%s", exc)
                    self.end(StopReason.NO_HOSTS)
                return
            if self.stop.is_set():
                self.pool.put_back(slot)
                return
            claimed = self._claim(slot)
            if claimed is False:
                continue
            try:
                if self.stop.is_set():
                    self._unclaim(slot, claimed)
                    self.pool.put_back(slot)
                    return
                got = self.budget.reserve(slot.name)
            except BaseException:
                self._unclaim(slot, claimed)
                self.pool.put_back(slot)
                raise
            if got is NoTrial.DONE:
                self._unclaim(slot, claimed)
                self.pool.put_back(slot)
                log.info("%s", self.budget.why)
                self.end(StopReason.BUDGET)
                return
            if got is NoTrial.WAIT:
                self._unclaim(slot, claimed)
                self.pool.put_back(slot)
                self.stop.wait(BUDGET_POLL)
                continue
            assert not isinstance(got, NoTrial)
            trial, view = got
            if isinstance(claimed, RunnerError):
                self._unreachable(trial, slot, claimed)
                continue
            try:
                self._trial(trial, slot, view)
            finally:
                self._unclaim(slot, claimed)

    def _claim(self, slot: HostSlot) -> bool | RunnerError:
        """Claim the host for a trial: True. Held by another live controller: False, and the host is handed
        back for a moment (no failure). The host cannot be reached: the error (the trial is then FAIL
        ``host_unreachable`` without a launch, and counts towards setting the host aside, as before)."""
        claimed: list[Host] = []
        for host in slot.hosts:  # a group's hosts are claimed all or none
            if self.leases is not None:
                self.leases.ensure(host)
            hold = host.hold
            if hold is None:  # a scheduler decides who gets the GPUs: nothing to claim
                claimed.append(host)
                continue
            try:
                claim = hold.claim()
            except RunnerError as exc:
                self._give_back(claimed, slot)
                return exc
            if not claim.ok:
                self._give_back(claimed, slot)
                if slot.held_by != claim.reason:
                    log.warning("%s; waiting for it", claim.reason)
                self.pool.hold_off(slot, HELD_POLL, claim.reason)
                return False
            claimed.append(host)
        return True

    def _give_back(self, hosts: Sequence[Host], slot: HostSlot) -> None:
        for host in hosts:
            hold = host.hold
            if hold is None:
                continue
            try:
                hold.release()
            except RunnerError as exc:  # the claim is broken by others once our lease has expired
                log.warning("could not give back the claim on %s (%s): %s", host.name, slot.name, exc)

    def _unreachable(self, trial: optuna.Trial, slot: HostSlot, exc: RunnerError) -> None:
        """FAIL ``trial`` for a host that could not even be claimed; nothing was launched."""
        kind = FailureKind.HOST_UNREACHABLE.value
        write_facts(trial, TrialFacts(controller=slot.host.controller_id, host=slot.name,
                                      outcome=FailureKind.HOST_UNREACHABLE, reason=str(exc)))
        if self.options.hook is not None:
            self.options.hook(trial.number, HostChosen(slot.name))
            self.options.hook(trial.number, Ended(kind))
        log.warning("trial %d failed: %s", trial.number, exc)
        self.pool.release(slot, infra_failure=True, error=f"{kind}: {exc}")
        frozen = self.study.tell(trial, None, state=TrialState.FAIL, skip_if_finished=True)
        with self._lock:
            self.ran += 1
        self._callbacks(frozen)

    def _unclaim(self, slot: HostSlot, claimed: bool | RunnerError = True) -> None:
        if claimed is not True:
            return
        self._give_back(slot.hosts, slot)

    def _callbacks(self, frozen: FrozenTrial) -> None:
        """Call the study callbacks with one fresh view of the study."""
        if not self.options.callbacks:
            return
        view = self.budget.view()
        for callback in self.options.callbacks:
            callback(view, copy.deepcopy(frozen))

    def _trial(self, trial: optuna.Trial, slot: HostSlot, view: StudyView) -> None:
        state = TrialState.FAIL
        value: float | Sequence[float] | None = None
        infra, error, permanent = False, "", False
        fatal: BaseException | None = None
        note_controller(trial, slot.host.controller_id)
        try:
            with Heartbeat(self.storage, trial_id(trial), self.options.heartbeat_interval):
                try:
                    value = self.objective.run(trial, slot, self.budget.strategy.gate(view))
                    state = TrialState.COMPLETE
                except optuna.TrialPruned:
                    state = TrialState.PRUNED
                except TrialFailed as exc:
                    infra, error = True, str(exc)
                    permanent = exc.failure.kind is FailureKind.HOST_CONFIG
                except RunnerError as exc:
                    log.warning("trial %d failed: %s", trial.number, exc)
                except UpdateFinishedTrialError:
                    # Taken for dead (no heartbeat) by another controller and failed; its configuration
                    # has been re-queued.
                    log.warning("trial %d was failed as stale by another controller", trial.number)
                except Exception as exc:
                    fatal = exc
        finally:
            if permanent:
                log.warning("%s; no more trials on it", error)
                self.pool.retire(slot, error)
            else:
                self.pool.release(slot, infra_failure=infra, error=error)
        try:
            frozen = self.study.tell(trial, value if state == TrialState.COMPLETE else None, state=state,
                                     skip_if_finished=True)
        except (*STORAGE_ERRORS, OSError) as exc:
            # A full disk under SQLite, a lost database: nothing more can be recorded, so stop in one line.
            raise StudyError(f"trial {trial.number} ({state.name}) could not be recorded in the study storage: "
                             f"{_storage_error(exc)}; the run stopped (every trial recorded before is kept)"
                             ) from None
        with self._lock:
            self.ran += 1
        self._callbacks(frozen)
        if fatal is not None:
            raise fatal
        if self.objective.env.artifacts_error:
            self.end(StopReason.ARTIFACTS)


def run_search(space: Space, hosts: Sequence[Host], options: RunOptions, *,
               groups: Sequence[HostGroup] = ()) -> RunSummary:
    """Run (or resume) the study for ``space`` on ``hosts`` until the budget, timeout or a signal.

    ``groups`` (of ``hosts``): the hosts a server spanning nodes takes together; a space with ``nodes`` above 1
    runs its trials on them (each group one slot), and needs one large enough.

    Raises ConfigError for an unsafe study name (before anything is touched) and StudyError, one line, when
    the study storage stops taking writes (a full disk under SQLite): every trial told before is kept.
    """
    study_name(options.study_name)  # it names directories on the hosts and here: refuse unsafe ones first
    check_groups(space, groups, hosts)
    try:
        return _run_search(space, hosts, options, groups)
    except STORAGE_ERRORS as exc:
        raise StudyError(f"study storage {redact(options.storage_url)}: {_storage_error(exc)}; the run stopped"
                         ) from None


def check_groups(space: Space, groups: Sequence[HostGroup], hosts: Sequence[Host] = ()) -> None:
    """ConfigError, one line, when a space spanning nodes has no host group large enough (nor a host that runs
    every rank itself: a Slurm cluster)."""
    need = space.max_nodes
    if need > 1 and not any(len(g.hosts) >= need for g in groups) and not any(h.spans_nodes for h in hosts):
        sizes = ", ".join(f"{g.name} ({len(g.hosts)})" for g in groups) or "none"
        raise ConfigError(f"the space spans up to {need} nodes: give an inventory group (groups:) of at least "
                          f"{need} hosts; groups given: {sizes}")


def _run_search(space: Space, hosts: Sequence[Host], options: RunOptions,
                groups: Sequence[HostGroup] = ()) -> RunSummary:
    storage = open_storage(options.storage_url, heartbeat_interval=options.heartbeat_interval,
                           grace_period=options.grace_period, retry=options.storage_retry)
    sampler = make_sampler(options.seed, options.n_trials, conditional=conditional(space))
    existed = options.study_name in optuna.get_all_study_names(storage)
    study = create_or_load(storage, options.study_name, sampler=sampler, directions=space.objective.directions,
                           metric_names=space.objective.metric_names)
    if CHOICE_ATTR not in study.user_attrs:  # first, so it is the first row of the dashboard's attribute table
        study.set_user_attr(CHOICE_ATTR, NO_CHOICE_YET)
    study.set_user_attr("space_name", space.name)
    study.set_user_attr("engine", space.engine.kind)
    calibration = sim_calibration(space)
    if calibration is not None:
        study.set_user_attr(SIM_CALIBRATION_ATTR, calibration)
    # What `servetune export --engine` serves with (the GPU box's python, model path, address, port).
    study.set_user_attr(DEPLOY_ATTR, space.deploy.model_dump(mode="json", exclude_defaults=True))
    if options.n_trials is not None:
        study.set_user_attr("n_trials", options.n_trials)
    abort = threading.Event()
    stop = threading.Event()
    env = TrialEnv(
        space=space,
        study_name=options.study_name,
        study_uid=study_uid(storage, study),
        artifacts_dir=options.artifacts_dir,
        artifact_store=artifact_store(options.artifacts_dir),
        hook=options.hook,
        abort=abort,
        smi_interval=options.smi_interval,
    )
    controller = new_controller_id()
    for host in hosts:
        host.controller_id = controller
    leases = Leases(hosts, Lease.of_this_process(controller, options.study_name, redact(options.storage_url),
                                                 options.lease_ttl))
    try:
        return _run_with_leases(space, hosts, options, study, storage, env, leases, abort, stop, groups)
    except HostMisconfigured:
        if not existed and not study.get_trials(deepcopy=False):
            # No host passed the preflight and nothing launched: leave no empty study behind.
            optuna.delete_study(study_name=options.study_name, storage=storage)
        raise
    finally:
        leases.close()


def _run_with_leases(space: Space, hosts: Sequence[Host], options: RunOptions, study: optuna.Study,
                     storage: RDBStorage, env: TrialEnv, leases: Leases, abort: threading.Event,
                     stop: threading.Event, groups: Sequence[HostGroup] = ()) -> RunSummary:
    hosts, dropped = _usable_hosts(space, hosts, env, leases)
    members: list[Host | HostGroup] = list(hosts)
    if space.max_nodes > 1:
        # Each group is one slot; a group that lost a host to the preflight cannot run a trial.
        members = [g for g in groups if len(g.hosts) >= space.max_nodes and all(h in hosts for h in g.hosts)]
        members += [h for h in hosts if h.spans_nodes]  # a Slurm job slot: one job of every node
        if not members:
            raise HostMisconfigured("no host group is left whole after the preflight (nor a Slurm cluster): "
                                    + "; ".join(dropped))
    pool = HostPool(members, max_consecutive_failures=space.budget.max_consecutive_failures,
                    cooldown=options.cooldown, max_set_asides=options.max_set_asides)
    lock = StudyLock(storage, study_id(study), options.storage_url)
    strategy, warm_lines = _strategy(space, hosts, options, study, storage, env)
    env.gate_reference = strategy.gate_reference() if space.gate_on else None
    budget = Budget(study, strategy, lock, storage)
    orphans = _recover(study, hosts, grace=space.budget.stop_grace)
    if budget.done():
        lock.close()
        return RunSummary(study, 0, StopReason.BUDGET_REACHED, pool.states(), orphans, hosts_dropped=dropped,
                          space=space, warm_start=warm_lines)

    run = _Run(study, storage, pool, Objective(env, ServerEvaluator(env)), budget, options, stop, abort)
    run.leases = leases
    with Signals(stop, abort) as signals:
        threads = [threading.Thread(target=run.worker, name=f"servetune-worker-{i}", daemon=True)
                   for i in range(len(pool))]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(timeout=0.2)
                    if run.deadline is not None and time.monotonic() >= run.deadline and not stop.is_set():
                        run.end(StopReason.TIMEOUT)
        finally:
            stop.set()
            for t in threads:
                t.join()
            lock.close()
            orphans += _cleanup(hosts, pool, grace=space.budget.stop_grace)
    if run.errors:
        raise run.errors[0]
    if abort.is_set():
        stopped_by = StopReason.ABORTED
    elif signals.stop_requested.is_set():
        stopped_by = StopReason.SIGNAL
    else:
        stopped_by = run.reasons[0] if run.reasons else StopReason.BUDGET
    return RunSummary(study, run.ran, stopped_by, pool.states(), orphans,
                      hosts_dropped=dropped, artifacts_error=env.artifacts_error or None, space=space,
                      warm_start=warm_lines)


def _strategy(space: Space, hosts: Sequence[Host], options: RunOptions, study: optuna.Study, storage: RDBStorage,
              env: TrialEnv) -> tuple[Strategy, list[str]]:
    """The run's strategy from what the preflight found on the hosts, with the warm start's priors (and the
    warm start in lines: the studies used, each asked for but not used with why)."""
    found = [env.preflight_cache[h.name] for h in hosts if h.name in env.preflight_cache]
    key = warm_key(space, found)
    priors, warm_lines = find_priors(storage, study, key, options.warm_start)
    if key is not None:
        study.set_user_attr(WARM_ATTR, key.stored())
        study.set_user_attr(WARM_TOKENS_ATTR, workload_tokens(space))
    if warm_lines:
        study.set_user_attr(WARM_USED_ATTR, warm_lines)
    strategy = Strategy(space, options.n_trials, confirm_k=options.confirm_k,
                        confirm_repeats=options.confirm_repeats, confirm_final=options.confirm_final,
                        gpu_mem_mib=smallest_card_mib(found),
                        engine_version=next((info.engine_version for info in found if info.engine_version), None),
                        checkpoint=next((info.checkpoint for info in found if info.checkpoint), None),
                        priors=priors, early_stop=options.early_stop)
    return strategy, warm_lines


def _usable_hosts(space: Space, hosts: Sequence[Host], env: TrialEnv,
                  leases: Leases) -> tuple[list[Host], list[str]]:
    """Keep the hosts the preflight does not drop, and lease them: (kept, one line per host dropped). The
    preflight comes first: it installs a simulated host's nvidia-smi, whose GPUs name the folder the lease
    lives in. Raises HostMisconfigured when none is left."""
    leases.hosts = []
    kept, dropped = preflight_hosts(space, hosts, env.preflight_cache)
    if not kept:
        raise HostMisconfigured(dropped[0] if len(dropped) == 1 else "no usable host: " + "; ".join(dropped))
    leases.hosts = list(kept)
    for host in kept:
        leases.renew(host)
    leases.start()
    for line in dropped:
        log.error("%s; the run goes on without it", line)
    return kept, dropped


def warm_key(space: Space, infos: Sequence[HostInfo]) -> WarmKey | None:
    """The facts an earlier study must share for a warm start (the smallest card the preflight found, the model,
    the engine and its version, the fixed args); None before any host reported its cards and version."""
    cards = [(g.total_mib, g.name) for info in infos for g in info.gpus if g.total_mib]
    version = next((info.engine_version for info in infos if info.engine_version), None)
    if not cards or version is None:
        return None
    total, name = min(cards)
    return WarmKey(name, float(total), space.model_path, space.engine.kind, version, tuple(space.fixed_args))


def find_priors(storage: RDBStorage, study: optuna.Study, key: WarmKey | None,
                names: Sequence[str]) -> tuple[list[Prior], list[str]]:
    """The earlier studies to warm-start from (``names`` in ``storage``; ``auto``: every other study there on
    the same :class:`WarmKey`), and the lines that say which were used and which not, with why."""
    if not names:
        return [], []
    wanted = set(names)
    auto = "auto" in wanted
    summaries = {s.study_name: s for s in optuna.get_all_study_summaries(storage, include_best_trial=False)}
    lines: list[str] = []
    for name in sorted(wanted - {"auto"} - set(summaries)):
        lines.append(f"not used: {name}: no such study in this storage")
    priors: list[Prior] = []
    for name, summary in sorted(summaries.items()):
        if name == study.study_name or not (auto or name in wanted):
            continue
        theirs = WarmKey.read(summary.user_attrs.get(WARM_ATTR))
        why = usable(name, key, theirs) if key is not None else f"{name}: this run's hosts reported no cards"
        if why is not None:
            if name in wanted:
                lines.append(f"not used: {why}")
            continue
        earlier = optuna.load_study(study_name=name, storage=storage)
        recs = tuple(records(earlier))
        tokens = summary.user_attrs.get(WARM_TOKENS_ATTR)
        priors.append(Prior(name, earlier.directions[0], recs, tokens if isinstance(tokens, int) else None))
        launched = sum(1 for r in recs if r.launched and r.outcome is not None)
        lines.insert(0, f"warm start from {name}: {launched} launches (its memory figures and its best "
                        f"configurations; same cards, model, engine version and fixed args)")
    if auto and not priors:
        lines.append("warm start: no earlier study in this storage on the same cards, model, engine version and "
                     "fixed args")
    return priors, lines


def smallest_card_mib(infos: Iterable[HostInfo]) -> float | None:
    """The smallest GPU's ``memory.total`` over the hosts' preflights (what SGLang sizes its default by),
    None when no host reported one."""
    totals = [g.total_mib for info in infos for g in info.gpus if g.total_mib]
    return min(totals) if totals else None


def preflight_hosts(space: Space, hosts: Sequence[Host],
                    cache: dict[str, HostInfo]) -> tuple[list[Host], list[str]]:
    """Check every host once before the first trial: (hosts kept, one line per host dropped).

    A :class:`HostMisconfigured` fault drops the host (its line names host, fault and fix);
    transient trouble keeps it (its trials fail and it is set aside, as any failing host). What a host
    passed is cached for the objective.
    """
    kept: list[Host] = []
    dropped: list[str] = []
    for host in hosts:
        try:
            cache[host.name] = preflight(host, space)
        except HostMisconfigured as exc:
            dropped.append(str(exc))
            continue
        except RunnerError as exc:
            log.warning("%s: %s (its trials are retried)", host.name, exc)
        kept.append(host)
    return kept, dropped


# ---- recovery ------------------------------------------------------------------------------------

STALE_REASON = "the controller stopped while this trial ran (no heartbeat); its configuration is retried"


def _recover(study: optuna.Study, hosts: Sequence[Host], *, grace: float) -> list[str]:
    """Stop orphaned servers on our hosts; mark our hosts' RUNNING trials (their controller died)."""
    stopped = _cleanup(hosts, None, grace=grace)
    names = {h.name for h in hosts}
    live: set[str] = set()
    for host in hosts:
        hold = host.hold
        if hold is None:
            continue
        with contextlib.suppress(RunnerError):
            live |= {lease.controller for lease in hold.live() if lease.controller != host.controller_id}
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        facts = TrialFacts.from_trial(trial)
        if facts.host not in names or facts.controller in live:
            continue
        log.warning("trial %d was left RUNNING on %s by a controller that stopped: it will be failed once "
                    "its heartbeat is stale, and retried", trial.number, facts.host)
        with contextlib.suppress(UpdateFinishedTrialError):
            mark_interrupted(study, trial, STALE_REASON)
    return stopped


def _cleanup(hosts: Sequence[Host], pool: HostPool | None, *, grace: float) -> list[str]:
    """Stop every orphaned server on ``hosts`` (skipping retired or set-aside ones); their run dirs."""
    skip = set()
    if pool is not None:
        skip = {s.host for s in pool.states() if s.state.out}
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

