"""What servetune relies on of Optuna's private attributes (``search/_optuna_compat.py``).

If one of these fails after an Optuna upgrade, update ``search/_optuna_compat.py`` (and only it).
"""

from __future__ import annotations

import inspect
import warnings
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from search._optuna_compat import (
    PRIVATE_STORAGE_CALLS,
    OptunaCompatError,
    enter_optimize_loop,
    in_distribution,
    known_params,
    note_target,
    set_trial_user_attr,
    storage_of,
    study_id,
    trial_id,
)
from search.storage import create_or_load, open_storage


@pytest.fixture
def study(tmp_path: Path) -> optuna.Study:
    return create_or_load(open_storage(f"sqlite:///{tmp_path}/s.db", heartbeat_interval=1, grace_period=2), "s")


def test_ids_are_the_storages_ids(study: optuna.Study) -> None:
    storage = storage_of(study)
    assert isinstance(storage, optuna.storages.BaseStorage)
    assert study_id(study) == storage.get_study_id_from_name("s")
    enter_optimize_loop(study)
    trial = study.ask()
    assert trial_id(trial) == storage.get_trial_id_from_study_id_trial_number(study_id(study), trial.number)
    frozen = study.tell(trial, 1.0)
    assert trial_id(frozen) == trial_id(trial)


def test_asking_outside_optimize_warns_unless_the_thread_is_marked(study: optuna.Study) -> None:
    # Why enter_optimize_loop exists: Optuna warns when a heartbeat storage is asked outside optimize().
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        study.tell(study.ask(), 1.0)
    assert any("heartbeat" in str(w.message).lower() for w in caught), [str(w.message) for w in caught]
    enter_optimize_loop(study)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        study.tell(study.ask(), 1.0)


def test_a_trial_run_elsewhere_gets_user_attrs_through_the_storage(study: optuna.Study) -> None:
    enter_optimize_loop(study)
    running = study.ask()
    frozen = study.get_trials(states=(TrialState.RUNNING,))[0]
    set_trial_user_attr(study, frozen, "outcome", "interrupted")
    assert study.get_trials()[running.number].user_attrs == {"outcome": "interrupted"}


def test_a_note_is_saved_for_a_finished_trial(study: optuna.Study) -> None:
    from optuna_dashboard import save_note
    from optuna_dashboard._note import get_note_from_system_attrs

    enter_optimize_loop(study)
    frozen = study.tell(study.ask(), 2.0)
    save_note(note_target(study, frozen), "hello")
    attrs = storage_of(study).get_study_system_attrs(study_id(study))
    assert get_note_from_system_attrs(attrs, trial_id(frozen))["body"] == "hello"


def test_a_missing_attribute_says_where_to_look() -> None:
    with pytest.raises(OptunaCompatError, match=r"object\._study_id is gone.*search/_optuna_compat.py"):
        study_id(object())  # type: ignore[arg-type]


def test_a_queued_trial_shows_its_params_before_it_samples(tmp_path: Path) -> None:
    """Optuna keeps a queued trial's params in the system attr ``fixed_params`` until it samples them:
    another controller sees them (a twin it must wait for, a design point already asked)."""
    study = create_or_load(open_storage(f"sqlite:///{tmp_path}/q.db", heartbeat=False), "q")
    study.enqueue_trial({"x": 1.5})
    assert known_params(study.get_trials(deepcopy=False)[0]) == {"x": 1.5}  # WAITING
    trial = study.ask()
    assert known_params(study.get_trials(deepcopy=False)[0]) == {"x": 1.5}  # RUNNING, not sampled yet
    trial.suggest_float("x", 0.0, 2.0)
    assert known_params(study.get_trials(deepcopy=False)[0]) == {"x": 1.5}
    study.tell(trial, 1.0)
    fresh = study.ask()
    assert known_params(study.get_trials(deepcopy=False)[1]) == {}  # sampled, not queued: nothing yet
    study.tell(fresh, state=TrialState.FAIL)


def test_the_private_storage_calls_retried_are_optunas() -> None:
    """:data:`PRIVATE_STORAGE_CALLS` are methods of this Optuna's RDBStorage that Optuna itself calls (its cache
    and its stale-trial check): a name renamed away would leave a backend call without its retry."""
    from optuna.storages import RDBStorage, _cached_storage, _heartbeat

    source = inspect.getsource(_cached_storage) + inspect.getsource(_heartbeat)
    for name in PRIVATE_STORAGE_CALLS:
        assert callable(getattr(RDBStorage, name, None)), f"RDBStorage.{name} is gone"
        assert f".{name}(" in source, f"Optuna no longer calls {name}"


def test_a_value_is_checked_against_a_distribution() -> None:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    assert in_distribution(FloatDistribution(0.5, 0.9, step=0.05), 0.6)
    assert not in_distribution(FloatDistribution(0.5, 0.9), 0.95)
    assert in_distribution(IntDistribution(8, 64, step=8), 16) and not in_distribution(IntDistribution(8, 64), 128)
    assert in_distribution(CategoricalDistribution(["a", "unset"]), "unset")
    assert not in_distribution(CategoricalDistribution(["a", "unset"]), "b")
