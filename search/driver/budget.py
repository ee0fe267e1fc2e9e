"""The budget: trials are created one at a time inside a lock all controllers of the study share, as the strategy
says (see :mod:`search.driver.run`, "The budget is exact across controllers").

:meth:`Budget.reserve` asks the strategy what to do *outside* the lock, on a view of the study read there; inside
the lock it reads the trials' numbers and states once more and asks again only when they changed, then applies
the answer (queue and ask, ask, wait, done). So the lock is held for one read of the study and one ``ask``.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import threading
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from search._optuna_compat import trial_id
from search.storage import fail_stale, reconnect_of, sqlite_file
from search.strategy.strategy import Done, Strategy, apply
from search.strategy.view import StudyView, fingerprint
from search.trial.records import note_host, noted_host

__all__ = ["Budget", "NoTrial", "StudyLock"]


class StudyLock:
    """A lock around trial creation, shared by every controller of the study (see the module docstring)."""

    def __init__(self, storage: RDBStorage, study_id: int, url: str) -> None:
        self._thread_lock = threading.Lock()
        self._storage = storage
        self._key = (0x53525654, study_id)  # "SRVT", study
        self._dialect = storage.engine.dialect.name
        self._conn: Any = None
        self._file: Path | None = None
        db = sqlite_file(url) if self._dialect == "sqlite" else None
        if db is not None and not str(db).startswith("file::memory"):
            self._file = db.with_name(db.name + ".servetune-lock")

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._thread_lock:
            if self._dialect == "postgresql":
                reconnect = reconnect_of(self._storage)
                # A dropped connection (a server restart) is opened again, for as long as the storage retries.
                if reconnect is not None:
                    reconnect.call(self._lock_pg)
                else:
                    self._lock_pg()
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

    def _lock_pg(self) -> None:
        """Take the advisory lock on this lock's connection (opened first when there is none)."""
        try:
            if self._conn is None:
                self._conn = self._storage.engine.connect()
            self._conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:a, :b)"),
                               {"a": self._key[0], "b": self._key[1]})
            self._conn.commit()
        except Exception:
            self._drop_connection()
            raise

    def _drop_connection(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None

    def close(self) -> None:
        with self._thread_lock:
            self._drop_connection()


#: Seconds after which a RUNNING trial that never named its host is a phantom (see :func:`fail_phantoms`).
PHANTOM_AGE = 600.0


def fail_phantoms(study: optuna.Study) -> None:
    """Fail RUNNING trials that never named their host, ``PHANTOM_AGE`` after they were made: a trial whose
    creation was retried after a dropped connection although its commit had gone through. Every real trial
    names its host (and records its first heartbeat) the moment it is reserved; a phantom has no heartbeat,
    so Optuna never takes it for stale, and it would hold a slot of the budget for ever."""
    now = datetime.datetime.now()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if noted_host(t) is None and t.datetime_start is not None and (
                now - t.datetime_start).total_seconds() > PHANTOM_AGE:
            with contextlib.suppress(UpdateFinishedTrialError):
                study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)


class NoTrial(Enum):
    """Why :meth:`Budget.reserve` gave no trial (:attr:`Budget.why` says it in words)."""

    DONE = "done"
    """The search budget is spent: the run ends."""
    WAIT = "wait"
    """Trials running now hold what is left of it: ask again soon."""


class Budget:
    """Reserves trials for the workers as :class:`~search.strategy.strategy.Strategy` says: counts and locks,
    nothing more."""

    DONE = NoTrial.DONE
    WAIT = NoTrial.WAIT

    def __init__(self, study: optuna.Study, strategy: Strategy, lock: StudyLock, storage: RDBStorage) -> None:
        self.study = study
        self.strategy = strategy
        self.lock = lock
        self.storage = storage
        self.why = ""
        """Why the last reservation was DONE or WAIT."""

    def view(self) -> StudyView:
        return self.strategy.view(self.study)

    def done(self) -> bool:
        """The study already holds its search budget."""
        return self.strategy.search_done(self.view())

    def reserve(self, host: str) -> tuple[optuna.Trial, StudyView] | NoTrial:
        """A new (or re-queued) trial for ``host`` with its first heartbeat recorded, and the view it was
        reserved on (the trial's gate uses its memory model); or DONE; or WAIT."""
        view = self.view()
        action = self.strategy.next(view)
        with self.lock():
            fail_stale(self.study, self.storage)  # serialised by the lock
            fail_phantoms(self.study)
            if fingerprint(self.study.get_trials(deepcopy=False)) != view.fingerprint:
                view = self.view()  # another worker or controller changed the study meanwhile
                action = self.strategy.next(view)
            trial = apply(self.study, action)
            if trial is None:
                self.why = action.why
                return self.DONE if isinstance(action, Done) else self.WAIT
            # Named at once: `servetune status` and a recovering controller see which host runs it.
            note_host(trial, host)
            self.storage.record_heartbeat(trial_id(trial))
            return trial, view
