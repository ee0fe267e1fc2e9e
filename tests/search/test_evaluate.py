"""The evaluator seam: the simulated host's pure model as the benchmark's evaluator, and fail-fast order."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from benchmarks.simeval import SimEvaluator
from runners.server import BenchPlan
from search.trial.evaluate import level_order
from search.trial.records import TrialFacts, write_facts
from search.trial.server import _fail_fast
from spaces.launch import LaunchConfig
from spaces.schema import Space, load_space

ROOT = Path(__file__).resolve().parents[2]
NCCL = {"nccl.NCCL_PROTO": "unset", "nccl.NCCL_ALGO": "unset"}
SURVIVES = {"mem_fraction_static": 0.62, "cuda_graph_max_bs": 64, **NCCL}
DIES_EAGER = {"mem_fraction_static": 0.70, "cuda_graph_max_bs": 32, **NCCL}  # seed 003


@pytest.fixture(scope="module")
def space() -> Space:
    return load_space(ROOT / "spaces" / "demo-sim.yaml")


@pytest.fixture(scope="module")
def noisy() -> Space:
    return load_space(ROOT / "spaces" / "demo-sim-noisy8.yaml")


def test_level_order_puts_the_target_first() -> None:
    assert level_order([1, 16, 64], 64) == (64, 16, 1)
    assert level_order([1, 16, 64, 128], 16) == (16, 128, 64, 1)


def test_server_sweep_runs_the_target_first() -> None:
    plan = BenchPlan(api="sglang", levels=(1, 16, 64), requests=(2, 16, 64), input_len=8, output_len=8,
                     warmup=0, model="m", timeout=10)
    fast = _fail_fast(plan, 64)
    assert (fast.levels, fast.requests) == ((64, 16, 1), (64, 16, 2))


def evaluate(ev: SimEvaluator, params: dict[str, object]) -> optuna.trial.FrozenTrial:
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial(params)
    trial = study.ask()
    launch = LaunchConfig.from_params(ev.space, params)
    facts = TrialFacts()
    try:
        value = ev.evaluate(trial, launch, None, facts)
        write_facts(trial, facts)
        study.tell(trial, value)
    except optuna.TrialPruned:
        write_facts(trial, facts)
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    return study.trials[-1]


def test_a_death_at_the_target_ends_the_trial_at_once(space: Space) -> None:
    ev = SimEvaluator(space)
    t = evaluate(ev, DIES_EAGER)
    assert t.state == optuna.trial.TrialState.PRUNED
    facts = TrialFacts.from_trial(t)
    assert facts.outcome == "oom" and facts.phase == "decode"
    assert [lv.max_concurrency for lv in facts.levels] == [64]  # C=16 and C=1 never ran
    assert facts.memory.tried_to_allocate_gib == pytest.approx(3.94, rel=0.1)
    assert facts.sim_seconds is not None and facts.sim_seconds > 0
    assert ev.launches[-1][2] is True and ev.launches[-1][1] > 0  # simulated time to death


def test_survivor_records_the_parsers_memory_facts(space: Space) -> None:
    ev = SimEvaluator(space)
    t = evaluate(ev, SURVIVES)
    assert t.state == optuna.trial.TrialState.COMPLETE
    for key in ("avail_before_weights_gib", "weights_gib", "avail_after_kv_gib", "graph_gib",
                "free_after_capture_gib", "kv_tokens", "max_running_requests", "mem_fraction_static",
                "cuda_graph_max_bs", "gpu_total_gib"):
        assert TrialFacts.from_trial(t).memory.figure(key) is not None, key
    assert [lv.max_concurrency for lv in TrialFacts.from_trial(t).levels] == [64, 16, 1]
    assert t.value == pytest.approx(ev.true_value(LaunchConfig.from_params(space, SURVIVES)), rel=0.1)


def test_a_repeat_is_a_new_draw_never_an_earlier_value(noisy: Space) -> None:
    ev = SimEvaluator(noisy, seed=5)
    values = [evaluate(ev, SURVIVES).value for _ in range(4)]
    assert len(set(values)) == 4
    true = ev.true_value(LaunchConfig.from_params(noisy, SURVIVES))
    assert true is not None and all(v is not None and abs(v / true - 1) < 0.3 for v in values)


def test_the_evaluator_needs_a_simulated_space() -> None:
    real = load_space(ROOT / "spaces" / "example-sglang-dsv4-tp4.yaml")
    with pytest.raises(ValueError, match=r"engine\.kind sim"):
        SimEvaluator(real)


def test_the_simulated_evaluator_stops_by_the_products_rule(space: Space) -> None:
    """The benchmark's evaluator asks ``search.trial.early.stop_early``, as the server path does: under the bar
    the target level's first quarter is the figure, the other levels never run, and the saving is counted."""
    ev = SimEvaluator(space)
    true = ev.true_value(LaunchConfig.from_params(space, SURVIVES))
    assert true is not None
    launch = LaunchConfig.from_params(space, SURVIVES)
    study = optuna.create_study(direction="maximize")
    for bar, stops in ((true * 2, True), (true * 0.5, False)):
        study.enqueue_trial(SURVIVES)
        facts = TrialFacts(stop_bar=bar)
        value = ev.evaluate(study.ask(), launch, None, facts)
        assert (facts.stopped_early is not None) is stops
        if facts.stopped_early is not None:
            assert facts.stopped_early.startswith("stopped after the first 25% of concurrency 64")
            assert facts.reason == facts.stopped_early and isinstance(value, float) and value < bar
            assert [lv.max_concurrency for lv in facts.levels] == [64] and ev.saved_seconds > 0
        else:
            assert [lv.max_concurrency for lv in facts.levels] == [64, 16, 1]
