"""Opening studies: storage URL -> RDBStorage with heartbeats, the artifact store, create or resume.

Any SQLAlchemy URL works (the default is a SQLite file in the working directory; PostgreSQL for many
controllers). A stale RUNNING trial (its controller died: no heartbeat for ``grace`` seconds) becomes
FAIL and is re-queued with the same parameters by Optuna's ``RetryHeartbeatStaleTrialCallback``.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Literal

import optuna
from optuna.artifacts import FileSystemArtifactStore
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError, SQLAlchemyError

from runners.errors import StudyError

HEARTBEAT_INTERVAL = 5
GRACE_PERIOD = 20
METRIC_NAMES = ["output_throughput"]


def open_storage(url: str, *, heartbeat: bool = True, heartbeat_interval: int = HEARTBEAT_INTERVAL,
                 grace_period: int = GRACE_PERIOD, must_exist: bool = False) -> RDBStorage:
    """Open (creating tables if needed) an RDB storage; errors become one-line StudyErrors.

    ``must_exist``: for commands that only read, a SQLite file that is not there is an error, not a new
    empty database.
    """
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        if path.parent and not path.parent.exists():
            raise StudyError(f"storage {url}: directory {path.parent} does not exist")
        if must_exist and not path.exists():
            raise StudyError(f"storage {url} does not exist (no study has been run with it)")
    kwargs: dict[str, object] = {}
    if heartbeat:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            retry = RetryHeartbeatStaleTrialCallback(max_retry=3)
        kwargs = {
            "heartbeat_interval": heartbeat_interval,
            "grace_period": grace_period,
            "heartbeat_stale_trial_callback": retry,
        }
    engine_kwargs: dict[str, object] = {}
    engine_kwargs = {"connect_args": {"timeout": 30}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    try:
        with warnings.catch_warnings():
            # Heartbeats and the retry callback are "experimental" in Optuna's terms; they are what
            # Optuna 5 offers for stale trials, and the warning would only clutter every command.
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return RDBStorage(url, engine_kwargs=engine_kwargs, **kwargs)  # type: ignore[arg-type]
    except (ArgumentError, NoSuchModuleError) as exc:
        raise StudyError(f"storage {url!r} is not a usable SQLAlchemy URL: {_first_line(exc)}") from None
    except OperationalError as exc:
        raise StudyError(f"storage {_redact(url)} is unreachable: {_first_line(exc.orig or exc)}") from None
    except SQLAlchemyError as exc:
        raise StudyError(f"storage {_redact(url)} failed: {_first_line(exc)}") from None


def create_or_load(storage: RDBStorage, name: str, *, direction: Literal["minimize", "maximize"] = "maximize",
                   sampler: optuna.samplers.BaseSampler | None = None) -> optuna.Study:
    """Create the study, or resume it if it exists (``load_if_exists``)."""
    try:
        study = optuna.create_study(
            storage=storage, study_name=name, direction=direction, load_if_exists=True,
            sampler=sampler, pruner=optuna.pruners.NopPruner(),
        )
    except SQLAlchemyError as exc:
        raise StudyError(f"cannot create study {name!r}: {_first_line(exc)}") from None
    if study.metric_names is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(METRIC_NAMES)
    return study


def load(storage: RDBStorage, name: str) -> optuna.Study:
    """Load an existing study; an unknown name is a StudyError listing the studies there are."""
    try:
        return optuna.load_study(study_name=name, storage=storage, pruner=optuna.pruners.NopPruner())
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
        known = ", ".join(names) if names else "none"
        raise StudyError(f"no study named {name!r} in this storage (studies: {known})") from None


def artifact_store(path: str | os.PathLike[str]) -> FileSystemArtifactStore:
    Path(path).mkdir(parents=True, exist_ok=True)
    return FileSystemArtifactStore(str(path))


def _first_line(exc: object) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _redact(url: str) -> str:
    """Hide a password in a storage URL."""
    if "://" in url and "@" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        user = creds.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}"
    return url
