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
import os
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import optuna
from optuna.artifacts import FileSystemArtifactStore
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError, SQLAlchemyError

from runners.errors import StudyError, first_line
from search.settings import GRACE_PERIOD, HEARTBEAT_INTERVAL

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


def fail_stale(study: optuna.Study) -> None:
    """Fail the study's stale RUNNING trials (no heartbeat for the grace period); the storage's retry
    callback re-queues their configurations."""
    with experimental_ok():
        optuna.storages.fail_stale_trials(study)


class RetryStaleTrial(RetryHeartbeatStaleTrialCallback):
    """Optuna's retry of a stale trial, re-queued with clean user attrs.

    Optuna copies the dead trial's user attrs into the retry (its host, run id, start-up time...), which
    would describe a run that never happened; the retry carries only ``retried_from`` instead.
    """

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        clean = copy.copy(trial)
        clean.user_attrs = {"retried_from": trial.number}
        super().__call__(study, clean)


_CLAIM_LOCK = threading.Lock()


class _Storage(RDBStorage):
    """RDBStorage whose claim of a WAITING trial (WAITING -> RUNNING) is atomic among this process's threads.

    Optuna claims an enqueued (or re-queued) trial by reading its state and then writing RUNNING; SQLite
    takes no row lock for the read (no SELECT ... FOR UPDATE), so two host threads could both claim one
    trial, run it twice, and the second ``tell`` would raise "Cannot tell a COMPLETE trial".
    """

    def set_trial_state_values(self, trial_id: int, state: TrialState, values: Any = None) -> bool:
        if state != TrialState.RUNNING:
            return super().set_trial_state_values(trial_id, state, values)
        with _CLAIM_LOCK:
            return super().set_trial_state_values(trial_id, state, values)


def open_storage(url: str, *, heartbeat: bool = True, heartbeat_interval: int = HEARTBEAT_INTERVAL,
                 grace_period: int = GRACE_PERIOD, must_exist: bool = False) -> RDBStorage:
    """Open (creating tables if needed) an RDB storage; errors become one-line StudyErrors.

    ``must_exist``: for commands that only read, a SQLite file that is not there is an error, not a new
    empty database.
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


def _create_storage(url: str, engine_kwargs: dict[str, object], kwargs: dict[str, Any]) -> RDBStorage:
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
