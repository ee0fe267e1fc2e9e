"""A measured configuration is reused; a running twin is waited for, unless its controller died."""

from __future__ import annotations

import threading
from pathlib import Path

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from search._optuna_compat import enter_optimize_loop, trial_id
from search.storage import create_or_load, open_storage
from search.trial.objective import _reuse
from search.trial.records import TrialFacts

PARAMS = {"mem_fraction_static": 0.62, "cuda_graph_max_bs": 64}


def _ask(study: optuna.Study) -> optuna.Trial:
    trial = study.ask()
    trial.suggest_float("mem_fraction_static", 0.55, 0.88, step=0.01)
    trial.suggest_categorical("cuda_graph_max_bs", [32, 64])
    return trial


def test_completed_twin_is_reused(tmp_path: Path) -> None:
    study = create_or_load(open_storage(f"sqlite:///{tmp_path}/s.db", heartbeat=False), "s")
    dists = {"mem_fraction_static": optuna.distributions.FloatDistribution(0.55, 0.88, step=0.01),
             "cuda_graph_max_bs": CategoricalDistribution([32, 64])}
    study.add_trial(optuna.trial.create_trial(params={"mem_fraction_static": 0.6200000000000001,
                                                      "cuda_graph_max_bs": 64},
                                              distributions=dists, value=31.5, user_attrs={"outcome": "ok"}))
    trial = study.ask(fixed_distributions=dists)
    facts = TrialFacts()
    assert _reuse(trial, dict(PARAMS), facts) == 31.5  # float noise in the stored params does not matter
    assert facts.duplicate_of == 0 and facts.outcome == "ok"


def test_stale_running_twin_is_not_waited_for_forever(tmp_path: Path) -> None:
    # A controller died while running PARAMS (trial 0): its heartbeat stops. A new trial sampling the same
    # configuration must not wait for it forever: once stale, it is failed and this trial runs it itself.
    storage = open_storage(f"sqlite:///{tmp_path}/s.db", heartbeat_interval=1, grace_period=1)
    study = create_or_load(storage, "s")
    study.enqueue_trial(PARAMS)
    study.enqueue_trial(PARAMS)
    enter_optimize_loop(study)  # as search.driver.run's workers do: ask/tell on a heartbeat storage
    dead = _ask(study)
    storage.record_heartbeat(trial_id(dead))  # then the controller "dies": no more heartbeats
    fresh = _ask(study)
    result: list[float | None] = []
    waiter = threading.Thread(target=lambda: result.append(_reuse(fresh, dict(PARAMS), TrialFacts(), poll=0.1)), daemon=True)
    waiter.start()
    waiter.join(timeout=15)
    assert not waiter.is_alive(), "waited forever for a dead controller's trial"
    assert result == [None]  # nothing to reuse: this trial runs the configuration
    assert study.get_trials(deepcopy=False)[dead.number].state == TrialState.FAIL

