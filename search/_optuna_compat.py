"""Every use of Optuna's private attributes, in one place.

servetune drives Optuna's study outside ``Study.optimize`` (one worker thread per host, a study-wide budget
lock, heartbeats, dashboard notes written from a callback), and a few things it needs have no public API in
Optuna 5. Each is reached here only, by a function that says what it relies on; ``tests/search/
test_optuna_compat.py`` pins that behaviour, so an Optuna upgrade that changes it fails there, with a message
naming the attribute, rather than in a search at 3 a.m.
"""

from __future__ import annotations

from typing import Any

import optuna

# Optuna's artifact-store protocol has no public import path (``optuna.artifacts`` exports the stores, not
# the protocol they share).
from optuna.artifacts._protocol import ArtifactStore
from optuna.distributions import BaseDistribution
from optuna.storages import BaseStorage
from optuna.study._frozen import FrozenStudy  # what storage.get_all_studies() lists; no public path
from optuna.trial import FrozenTrial

__all__ = [
    "PRIVATE_STORAGE_CALLS",
    "ArtifactStore",
    "OptunaCompatError",
    "enter_optimize_loop",
    "in_distribution",
    "note_target",
    "set_trial_system_attr",
    "set_trial_user_attr",
    "storage_of",
    "study_id",
    "trial_id",
    "was_enqueued",
]


#: RDBStorage's private methods that Optuna itself calls on a study's storage: Optuna's ``_CachedStorage`` (what a
#: Study holds) reads and creates trials through ``_get_trials``, ``_create_new_trial``, ``_set_trial_param`` and
#: ``_get_best_trial_id`` of its backend rather than the public methods, and ``fail_stale_trials`` asks
#: ``_get_stale_trial_ids``. :mod:`search.storage` retries them as it retries the public calls (a dropped
#: connection during one of them stopped a run).
PRIVATE_STORAGE_CALLS = ("_get_stale_trial_ids", "_get_trials", "_create_new_trial", "_set_trial_param",
                         "_get_best_trial_id")


class OptunaCompatError(AttributeError):
    """The installed Optuna lacks a private attribute servetune relies on (see this module)."""


def _attr(obj: object, name: str) -> Any:
    try:
        return getattr(obj, name)
    except AttributeError:
        raise OptunaCompatError(
            f"optuna {optuna.__version__}: {type(obj).__name__}.{name} is gone; servetune reaches it in "
            "search/_optuna_compat.py, which needs updating for this Optuna"
        ) from None


def trial_id(trial: optuna.Trial | FrozenTrial) -> int:
    """The storage's id of a trial (``_trial_id``; Optuna exposes only the per-study ``number``).

    Heartbeats and dashboard notes are keyed by it."""
    return int(_attr(trial, "_trial_id"))


def was_enqueued(trial: optuna.Trial) -> bool:
    """The trial was queued with fixed params (``study.enqueue_trial``, a retry of a stale trial) rather than
    sampled: Optuna marks it with the system attr ``fixed_params`` and has no public way to ask."""
    return "fixed_params" in trial.storage.get_trial_system_attrs(trial_id(trial))


def known_params(trial: FrozenTrial) -> dict[str, Any]:
    """A trial's params, or for a queued one not yet sampled (WAITING, or RUNNING before its first
    ``suggest_*``) the params it was queued with (Optuna keeps them in the system attr ``fixed_params``)."""
    if trial.params:
        return dict(trial.params)
    fixed = trial.system_attrs.get("fixed_params")
    return dict(fixed) if isinstance(fixed, dict) else {}


def in_distribution(distribution: BaseDistribution, value: Any) -> bool:
    """Whether ``value`` (as a trial's params hold it) is one a distribution can give: Optuna checks a queued
    trial's fixed params with ``BaseDistribution._contains`` and has no public check. A categorical value that is
    not among the choices is not in it (``to_internal_repr`` raises for it)."""
    try:
        internal = distribution.to_internal_repr(value)
    except ValueError:
        return False
    return bool(_attr(distribution, "_contains")(internal))


def study_id(study: optuna.Study) -> int:
    """The storage's id of a study (``_study_id``), the key of the study-wide budget lock."""
    return int(_attr(study, "_study_id"))


def study_id_of(study: FrozenStudy) -> int:
    """The storage's id of a study listed by ``storage.get_all_studies()`` (``_study_id``): the id in
    optuna-dashboard's URLs."""
    return int(_attr(study, "_study_id"))


def storage_of(study: optuna.Study) -> BaseStorage:
    """The storage a study reads and writes (``_storage``)."""
    storage = _attr(study, "_storage")
    assert isinstance(storage, BaseStorage)
    return storage


def enter_optimize_loop(study: optuna.Study) -> None:
    """Tell the study that this thread runs trials as ``Study.optimize`` would.

    ``Study.optimize`` sets ``_thread_local.in_optimize_loop`` in each of its threads; without it,
    ``study.ask`` on a storage with heartbeats warns that heartbeats want ``Study.optimize``. servetune's
    worker threads ask, run under a heartbeat and tell exactly as Optuna's loop does.
    """
    _attr(study, "_thread_local").in_optimize_loop = True


def set_trial_system_attr(trial: optuna.Trial, key: str, value: Any) -> None:
    """Set a system attr of a live trial: ``optuna.Trial`` has no setter for them since Optuna 3 (its
    ``set_system_attr`` was removed); the storage call is what it did underneath. optuna-dashboard shows a
    trial's user attrs, not its system attrs."""
    trial.storage.set_trial_system_attr(trial_id(trial), key, value)


def set_trial_user_attr(study: optuna.Study, trial: FrozenTrial, key: str, value: Any) -> None:
    """Set a user attr of a trial this process does not run (a RUNNING trial of a controller that died):
    ``optuna.Trial.set_user_attr`` needs a live trial; the storage call is what it does underneath."""
    storage_of(study).set_trial_user_attr(trial_id(trial), key, value)


class _NoteTarget:
    """What ``optuna_dashboard.save_note`` reads of a trial: ``storage``, ``study`` and ``_trial_id``.

    ``save_note`` takes a live ``optuna.Trial``, but a study callback holds a FrozenTrial, and building an
    ``optuna.Trial`` for a finished trial would call the sampler's ``before_trial``. The note is stored in
    the study's system attrs keyed by trial id, so these three attributes are all it needs.
    """

    def __init__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.study = study
        self.storage = storage_of(study)
        self._trial_id = trial_id(trial)


def note_target(study: optuna.Study, trial: FrozenTrial) -> Any:
    """An object ``optuna_dashboard.save_note`` accepts as the finished ``trial`` of ``study``."""
    return _NoteTarget(study, trial)
