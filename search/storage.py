"""Opening studies: storage URL -> RDBStorage with heartbeats, the artifact store, create or resume.

Any SQLAlchemy URL works (the default is a SQLite file in the working directory; PostgreSQL for many
controllers). A running trial records a heartbeat every ``heartbeat_interval`` seconds; a RUNNING trial
whose controller died (no heartbeat for ``grace_period`` seconds) becomes FAIL the next time any controller
of the study starts a trial, and Optuna's ``RetryHeartbeatStaleTrialCallback`` re-queues its configuration
as a WAITING trial (user attr ``retried_from``: the dead trial's number), which the next trial runs.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import math
import os
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import optuna
from optuna.artifacts import FileSystemArtifactStore
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    DisconnectionError,
    InterfaceError,
    NoSuchModuleError,
    OperationalError,
    SQLAlchemyError,
)

from runners.errors import StudyError, first_line
from search._optuna_compat import PRIVATE_STORAGE_CALLS, study_id
from search.settings import GRACE_PERIOD, HEARTBEAT_INTERVAL

log = logging.getLogger("servetune")
T = TypeVar("T")

METRIC_NAMES = ["output_throughput"]
MAX_RETRY = 3


@contextlib.contextmanager
def experimental_ok() -> Iterator[None]:
    """Silence Optuna's ExperimentalWarning: heartbeats, the stale-trial retry, ``fail_stale_trials`` and
    metric names are "experimental" in Optuna's terms; they are what Optuna 5 offers, and the warning would
    only clutter every command."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def fail_stale(study: optuna.Study, storage: RDBStorage | None = None) -> None:
    """Fail the study's stale RUNNING trials (no heartbeat for the grace period); the storage's retry
    callback re-queues their configurations. Not while ``storage``'s connection came back less than a grace
    period ago: no heartbeat could be recorded while it was down, so every running trial would look dead."""
    reconnect = reconnect_of(storage) if storage is not None else None
    if storage is not None and reconnect is not None:
        grace = storage.grace_period if isinstance(storage.grace_period, int) else GRACE_PERIOD
        interval = storage.heartbeat_interval or HEARTBEAT_INTERVAL
        if time.monotonic() - reconnect.recovered_at < grace + 2 * interval:
            return
    with experimental_ok():
        optuna.storages.fail_stale_trials(study)


#: The trial system attr that holds a trial's whole record (``search.trial.records.FACTS_ATTR``).
RECORD_ATTR = "servetune.facts"


class RetryStaleTrial(RetryHeartbeatStaleTrialCallback):
    """Optuna's retry of a stale trial, re-queued with clean user attrs.

    Optuna copies the dead trial's user and system attrs into the retry (its host, run id, start-up time, a
    record written just before the controller died...), which would describe a run that never happened; the
    retry carries only ``retried_from`` and Optuna's own system attrs instead.
    """

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        clean = copy.copy(trial)
        clean.user_attrs = {"retried_from": trial.number}
        clean.system_attrs = {k: v for k, v in trial.system_attrs.items() if k != RECORD_ATTR}
        super().__call__(study, clean)


_CLAIM_LOCK = threading.Lock()

#: The storage calls retried when the connection drops: every public read and write of RDBStorage.
_RETRIED = (
    "create_new_study", "delete_study", "set_study_user_attr", "set_study_system_attr", "get_study_id_from_name",
    "get_study_name_from_id", "get_study_directions", "get_study_user_attrs", "get_study_system_attrs",
    "get_trial_user_attrs", "get_trial_system_attrs", "get_all_studies", "create_new_trial", "set_trial_param",
    "get_trial_param", "set_trial_state_values", "set_trial_intermediate_value", "set_trial_user_attr",
    "set_trial_system_attr", "get_trial_id_from_study_id_trial_number", "get_trial", "get_all_trials",
    "get_best_trial", "record_heartbeat",
    # Optuna's cache (what a Study holds) reads and creates trials through private methods of its backend, not
    # the public ones: without them a drop during a read of the trials stopped the run.
    *PRIVATE_STORAGE_CALLS,
)


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` (or what Optuna wrapped) is a database connection that dropped or cannot be made (a
    server restart, a network blip, ``pg_terminate_backend``), as opposed to a statement the database refused."""
    cause: BaseException | None = exc
    for _ in range(4):
        if cause is None:
            return False
        if isinstance(cause, DBAPIError) and cause.connection_invalidated:
            return True
        if isinstance(cause, OperationalError | InterfaceError | DisconnectionError):
            return True
        cause = cause.__cause__
    return False


class Reconnect:
    """The retry of a dropped connection: backoff from 0.5 s to 10 s for ``seconds`` in all, one line when the
    connection drops and one when it is back. ``recovered_at`` (``time.monotonic()``) is when it last came
    back: until the heartbeats have been renewed, no trial is taken for dead (:func:`fail_stale`)."""

    def __init__(self, seconds: float, what: str) -> None:
        self.seconds = seconds
        self.what = what
        self.recovered_at = -math.inf
        self._lock = threading.Lock()
        self._down_since: float | None = None

    def call(self, fn: Callable[[], T]) -> T:
        deadline: float | None = None
        delay = 0.5
        while True:
            try:
                out = fn()
            except Exception as exc:
                if self.seconds <= 0 or not connection_lost(exc):
                    raise
                now = time.monotonic()
                deadline = deadline if deadline is not None else now + self.seconds
                self._down(exc, now)
                if now >= deadline:
                    raise
                time.sleep(min(delay, max(deadline - now, 0.01)))
                delay = min(delay * 2, 10.0)
                continue
            if deadline is not None or self._down_since is not None:
                self._up()
            return out

    def _down(self, exc: BaseException, now: float) -> None:
        with self._lock:
            if self._down_since is None:
                self._down_since = now
                cause = getattr(exc.__cause__, "orig", None) or exc.__cause__ or getattr(exc, "orig", None) or exc
                log.warning("study storage %s: connection lost (%s); retrying for up to %.0f s while the running "
                            "trials go on", self.what, first_line(cause), self.seconds)

    def _up(self) -> None:
        with self._lock:
            if self._down_since is not None:
                log.warning("study storage %s: connection back after %.0f s", self.what,
                            time.monotonic() - self._down_since)
                self._down_since = None
                self.recovered_at = time.monotonic()


def _retrying(name: str) -> Callable[..., Any]:
    method = getattr(RDBStorage, name)

    @functools.wraps(method)
    def call(self: _Storage, *args: Any, **kwargs: Any) -> Any:
        return self.reconnect.call(lambda: method(self, *args, **kwargs))

    return call


class _Storage(RDBStorage):
    """RDBStorage that rides out a dropped connection (:class:`Reconnect`, see :data:`_RETRIED`), and whose
    claim of a WAITING trial (WAITING -> RUNNING) is atomic among this process's threads.

    Optuna claims an enqueued (or re-queued) trial by reading its state and then writing RUNNING; SQLite
    takes no row lock for the read (no SELECT ... FOR UPDATE), so two host threads could both claim one
    trial, run it twice, and the second ``tell`` would raise "Cannot tell a COMPLETE trial".
    """

    reconnect = Reconnect(0.0, "")

    def set_trial_state_values(self, trial_id: int, state: TrialState, values: Any = None) -> bool:
        if state != TrialState.RUNNING:
            return self.reconnect.call(lambda: RDBStorage.set_trial_state_values(self, trial_id, state, values))
        with _CLAIM_LOCK:
            return self.reconnect.call(lambda: RDBStorage.set_trial_state_values(self, trial_id, state, values))


for _name in _RETRIED:
    if _name != "set_trial_state_values" and hasattr(RDBStorage, _name):
        setattr(_Storage, _name, _retrying(_name))


def reconnect_of(storage: RDBStorage) -> Reconnect | None:
    """The retry of ``storage``'s dropped connections (None for a storage not opened here)."""
    return storage.reconnect if isinstance(storage, _Storage) else None


def open_storage(url: str, *, heartbeat: bool = True, heartbeat_interval: int = HEARTBEAT_INTERVAL,
                 grace_period: int = GRACE_PERIOD, must_exist: bool = False,
                 retry: float = 0.0) -> RDBStorage:
    """Open (creating tables if needed) an RDB storage; errors become one-line StudyErrors.

    ``must_exist``: for commands that only read, a SQLite file that is not there is an error, not a new
    empty database. ``retry``: seconds a dropped connection to a database server is retried, with backoff,
    before its error is raised (a SQLite file is never retried: its errors are not a connection's).
    """
    path = sqlite_file(url)
    if path is not None:
        if not path.parent.exists():
            raise StudyError(f"storage {url}: directory {path.parent} does not exist")
        if must_exist and not path.exists():
            raise StudyError(f"storage {url} does not exist (no study has been run with it)")
    engine_kwargs: dict[str, object] = (
        {"connect_args": {"timeout": 30}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    )
    kwargs: dict[str, Any] = {}
    try:
        with experimental_ok():  # heartbeats and the retry callback
            if heartbeat:
                kwargs = {
                    "heartbeat_interval": heartbeat_interval,
                    "grace_period": grace_period,
                    "heartbeat_stale_trial_callback": RetryStaleTrial(max_retry=MAX_RETRY),
                }
            storage = _create_storage(url, engine_kwargs, kwargs)
        if url.startswith("sqlite"):
            _use_wal(storage)
        else:
            storage.reconnect = Reconnect(retry, redact(url))
        return storage
    except (ArgumentError, NoSuchModuleError) as exc:
        raise StudyError(f"storage {url!r} is not a usable SQLAlchemy URL: {first_line(exc)}") from None
    except ImportError as exc:  # Optuna's "Failed to import DB access module": the URL's driver is missing
        scheme = make_url(url).drivername if "://" in url else url
        raise StudyError(f"storage {redact(url)}: the database driver for {scheme} is not installed "
                         f"({first_line(exc.__cause__ or exc)}); fix: install it in servetune's environment, or "
                         "use sqlite:///FILE or postgresql+psycopg://...") from None
    except OperationalError as exc:
        raise StudyError(f"storage {redact(url)} is unreachable: {first_line(exc.orig or exc)}") from None
    except SQLAlchemyError as exc:
        raise StudyError(f"storage {redact(url)} failed: {first_line(exc)}") from None


def storage_error_line(exc: BaseException) -> str:
    """One line for a storage that failed after it was opened (a corrupt SQLite file, a lost database): what
    the database said; Optuna's ``StorageInternalError`` names no cause, so its cause's is used."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    return first_line(getattr(cause, "orig", None) or cause)


def _create_storage(url: str, engine_kwargs: dict[str, object], kwargs: dict[str, Any]) -> _Storage:
    """``_Storage(url, ...)``, tolerating the race of controllers that start at once on a fresh database:
    both create Optuna's tables, and the slower one fails on what the other just created."""
    for attempt in range(5):
        try:
            return _Storage(url, engine_kwargs=engine_kwargs, **kwargs)
        except SQLAlchemyError as exc:
            text = str(exc).lower()
            racing = any(m in text for m in ("already exists", "duplicate key", "unique constraint failed"))
            if not racing or attempt == 4:
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def _use_wal(storage: RDBStorage) -> None:
    """SQLite in WAL mode with ``synchronous=NORMAL``: a trial writes dozens of user attrs, each a commit;
    this makes them ~4x cheaper and lets readers (dashboard, ``status``) work while a search writes.
    Durable against a controller crash (which is what matters here), not against power loss."""

    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    event.listen(storage.engine, "connect", on_connect)
    storage.engine.dispose()  # connections opened before the listener reconnect with it


def create_or_load(storage: RDBStorage, name: str, *, direction: Literal["minimize", "maximize"] = "maximize",
                   sampler: optuna.samplers.BaseSampler | None = None,
                   directions: Sequence[str] | None = None,
                   metric_names: Sequence[str] | None = None) -> optuna.Study:
    """Create the study, or resume it if it exists (``load_if_exists``).

    ``directions`` (with ``metric_names``, one per direction) makes a multi-objective study when there are
    several (a ``pareto`` objective); resuming a study whose directions differ is a StudyError (one line):
    its trials were scored by another objective.
    """
    wanted = [StudyDirection.MINIMIZE if d.lower() == "minimize" else StudyDirection.MAXIMIZE
              for d in (directions if directions is not None else [direction])]
    try:
        study = optuna.create_study(
            storage=storage, study_name=name, directions=wanted, load_if_exists=True,
            sampler=sampler, pruner=optuna.pruners.NopPruner(),
        )
    except SQLAlchemyError as exc:
        raise StudyError(f"cannot create study {name!r}: {first_line(exc)}") from None
    have = [d.name.lower() for d in study.directions]
    if directions is not None and study.directions != wanted:
        held = ", ".join(study.metric_names or []) or "its objective"
        want = ", ".join(d.name.lower() for d in wanted)
        raise StudyError(f"study {name!r} exists with {len(have)} objective(s) ({', '.join(have)}: {held}); "
                         f"this space's objective has {len(wanted)} ({want}): run it under another --study name")
    if study.metric_names is None:
        names = list(metric_names) if metric_names is not None and len(metric_names) == len(have) else None
        with experimental_ok():
            study.set_metric_names(names or (METRIC_NAMES if len(have) == 1 else
                                             [f"objective{i}" for i in range(len(have))]))
    return study


STUDY_UID_ATTR = "servetune_study_uid"


def study_uid(storage: RDBStorage, study: optuna.Study) -> str:
    """The study's id unique per storage and across storages (a random one, kept as a study system attr the
    first time it is asked): run directories on a host carry it, so two studies of one name (two clones'
    ``make demo``, two databases) never share ``<runs_root>/<study>.<uid>/<trial>``."""
    sid = study_id(study)
    uid = storage.get_study_system_attrs(sid).get(STUDY_UID_ATTR)
    if isinstance(uid, str) and uid.isalnum():
        return uid
    storage.set_study_system_attr(sid, STUDY_UID_ATTR, uuid.uuid4().hex[:12])
    # Two controllers starting one new study at once: both read back the one that was written last.
    return str(storage.get_study_system_attrs(sid)[STUDY_UID_ATTR])


def load(storage: RDBStorage, name: str) -> optuna.Study:
    """Load an existing study; an unknown name is a StudyError listing the studies there are."""
    try:
        return optuna.load_study(study_name=name, storage=storage, pruner=optuna.pruners.NopPruner())
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
        known = ", ".join(names) if names else "none"
        raise StudyError(f"no study named {name!r} in this storage (studies: {known})") from None


def open_study(url: str, name: str) -> optuna.Study:
    """An existing study, for commands that only read it (no heartbeats; a missing SQLite file is an
    error, not a new empty database). Raises StudyError."""
    return load(open_storage(url, heartbeat=False, must_exist=True), name)


def artifact_store(artifacts_dir: str | os.PathLike[str]) -> FileSystemArtifactStore:
    """Optuna's artifact store of a trial-artifacts directory: its ``optuna-artifacts`` folder (created)."""
    path = Path(artifacts_dir) / "optuna-artifacts"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StudyError(f"artifacts directory {artifacts_dir}: cannot create {path}: {exc.strerror or exc}"
                         ) from None
    return FileSystemArtifactStore(str(path))


def redact(url: str) -> str:
    """A database (or tracking) URL with its password hidden (``***``); anything that is not a SQLAlchemy
    URL (an ``http://`` tracking server, say) as it is."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def sqlite_file(url: str) -> Path | None:
    """The database file of a ``sqlite:`` URL; None for another database or an in-memory one."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)
