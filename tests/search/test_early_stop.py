"""Early stopping of a clear loser on the live path: real processes (the simulated SGLang host), real HTTP, the
load generator's early look, a real SQLite study.

The same three configurations are searched twice with the same seed, with and without early stopping:

* the good one first (graphs cover the target level): its value sets the stop bar;
* a loser (``--cuda-graph-max-bs 8`` below the target level of 16: eager decode, about 40% slower on this
  profile): with early stopping its benchmark ends after the target level's first quarter of requests;
* a twin of the good one (another memory fraction): above the bar, it runs its whole sweep.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from runners.loadgen import EXIT_STOPPED, Look, RequestResult
from search.driver.hosts import local_host
from search.driver.run import RunOptions, run_search
from search.storage import create_or_load, open_storage
from search.trial.early import FIRST_SHARE, first_requests, stop_early
from search.trial.records import TrialFacts
from spaces.schema import load_space
from tests.search.overnight_kit import BASE
from tests.search.overnight_kit import make_space as kit_make_space

#: A closed loop of 64 requests at the target level 16 (four waves), 32 output tokens each.
WORKLOAD = {"input_len": 64, "output_len": 32, "concurrency": [1, 16], "requests_per_level": [1, 64],
            "warmup_requests": 0}
GOOD = {**BASE, "mem_fraction_static": 0.62, "cuda_graph_max_bs": 64}
LOSER = {**BASE, "mem_fraction_static": 0.62, "cuda_graph_max_bs": 8}
TWIN = {**BASE, "mem_fraction_static": 0.61, "cuda_graph_max_bs": 64}


def search(wd: Path, *, early_stop: bool) -> optuna.Study:
    space_path = kit_make_space(wd / "space.yaml", speed=200, workload=WORKLOAD,
                                knobs={"mem_fraction_static": {"low": 0.60, "high": 0.62, "step": 0.01},
                                       "cuda_graph_max_bs": {"choices": [8, 64]}})
    space = load_space(space_path)
    url = f"sqlite:///{wd}/servetune.db"
    study = create_or_load(open_storage(url), "early")
    for params in (GOOD, LOSER, TWIN):
        study.enqueue_trial(params)
    host = local_host(space, runs_root=str(wd / "runs"), sim_dir=wd / "sim", host_dir=str(wd / "hostdir"))
    options = RunOptions(study_name="early", storage_url=url, artifacts_dir=wd / "artifacts", n_trials=3,
                         timeout=None, seed=7, smi_interval=0.2, confirm_k=0, early_stop=early_stop)
    return run_search(space, [host], options).study


@pytest.fixture(scope="module")
def studies(tmp_path_factory: pytest.TempPathFactory) -> tuple[optuna.Study, optuna.Study]:
    return (search(tmp_path_factory.mktemp("early-on"), early_stop=True),
            search(tmp_path_factory.mktemp("early-off"), early_stop=False))


def by_params(study: optuna.Study, params: dict[str, object]) -> optuna.trial.FrozenTrial:
    return next(t for t in study.get_trials() if all(t.params.get(k) == v for k, v in params.items()))


@pytest.mark.slow  # two real searches of three launches each
def test_a_clear_loser_stops_after_its_first_requests(studies: tuple[optuna.Study, optuna.Study]) -> None:
    on, _ = studies
    loser = by_params(on, LOSER)
    facts = TrialFacts.from_trial(loser)
    assert loser.state == TrialState.COMPLETE, facts.reason
    assert facts.stop_bar is not None and loser.value is not None and loser.value < facts.stop_bar
    assert facts.stopped_early is not None
    assert facts.stopped_early.startswith(f"stopped after the first {FIRST_SHARE:.0%} of concurrency 16")
    assert facts.reason == facts.stopped_early
    # Before the full sweep: the target level alone (the other level never ran), and not all its requests.
    assert [lv.max_concurrency for lv in facts.levels] == [16]
    assert facts.levels[0].completed is not None and facts.levels[0].completed < 64
    assert loser.value == pytest.approx(facts.levels[0].output_throughput)
    # The twin of the best was above the bar: its sweep ran whole.
    twin = TrialFacts.from_trial(by_params(on, TWIN))
    assert twin.stop_bar is not None and twin.stopped_early is None
    assert sorted(lv.max_concurrency for lv in twin.levels) == [1, 16]
    assert next(lv for lv in twin.levels if lv.max_concurrency == 16).completed == 64


@pytest.mark.slow  # two real searches of three launches each
def test_without_early_stop_the_loser_runs_whole_and_the_best_is_the_same(
        studies: tuple[optuna.Study, optuna.Study]) -> None:
    on, off = studies
    loser = TrialFacts.from_trial(by_params(off, LOSER))
    assert loser.stop_bar is None and loser.stopped_early is None
    assert sorted(lv.max_concurrency for lv in loser.levels) == [1, 16]
    assert next(lv for lv in loser.levels if lv.max_concurrency == 16).completed == 64
    # The early look's figure is the level's own, within the bound the bar allows for a part of a level.
    stopped = by_params(on, LOSER).value
    assert stopped is not None and by_params(off, LOSER).value is not None
    assert stopped == pytest.approx(by_params(off, LOSER).value, rel=0.15)
    # GOOD and TWIN are equal in the simulator's model (graphs cover the target level in both), so which of
    # them measures higher is the profile's noise: early stopping must only never let the loser win.
    assert on.best_trial.params in (GOOD, TWIN) and off.best_trial.params in (GOOD, TWIN)


def test_the_rule_stops_below_the_bar_only() -> None:
    facts = TrialFacts(stop_bar=100.0)
    assert not stop_early(facts, "output_throughput", 16, 100.0) and facts.stopped_early is None
    assert stop_early(facts, "output_throughput", 16, 99.0)
    assert facts.stopped_early == ("stopped after the first 25% of concurrency 16: output_throughput 99.0 is "
                                   "below 100.0, the best less the noise bound")
    assert not stop_early(TrialFacts(), "output_throughput", 16, 1.0)  # no bar: a confirmation, the first value
    assert [first_requests(n) for n in (1, 2, 4, 16, 64, 65)] == [1, 1, 1, 4, 16, 17]


def test_the_look_fires_once_at_its_count() -> None:
    seen: list[int] = []
    look = Look(2, lambda first: seen.append(len(first)))
    for _ in range(4):
        look.finished(RequestResult())
    assert seen == [2]
    assert EXIT_STOPPED == 4
