"""The memory model, fitted from launches of the simulated host's pure model (seed 003's host)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from runners.simhost.model import SimLaunch, plan_startup
from search.evaluate import SimEvaluator
from search.memory import (
    MARGIN_CONSTRAINT,
    PREDICTED_OOM,
    Candidate,
    MemoryModel,
    VllmFacts,
    VllmMemoryModel,
)
from search.objective import Objective, TrialEnv
from search.records import TrialFacts
from spaces.schema import Space, load_space

ROOT = Path(__file__).resolve().parents[2]
NCCL = {"nccl.NCCL_PROTO": "unset", "nccl.NCCL_ALGO": "unset"}


@pytest.fixture(scope="module")
def space() -> Space:
    return load_space(ROOT / "spaces" / "demo-sim.yaml")


def point(mfs: float, bs: int) -> dict[str, Any]:
    return {"mem_fraction_static": mfs, "cuda_graph_max_bs": bs, **NCCL}


class Bench:
    """A study whose trials run through the product's objective on the simulated host's model."""

    def __init__(self, space: Space, *, gate: bool = True) -> None:
        self.space = space
        self.evaluator = SimEvaluator(space, seed=1)
        env = TrialEnv(space=space, study_name="t", artifacts_dir=Path("/nonexistent"))
        self.objective = Objective(env, self.evaluator, memory_gate=gate)
        self.study = optuna.create_study(direction="maximize")

    def launch(self, params: dict[str, Any], *, forced: bool = False, **attrs: Any) -> optuna.trial.FrozenTrial:
        """Run ``params`` as the sampler's own proposal (so the model may skip it), or ``forced`` as a
        configuration someone queued (launched whatever the model says)."""
        self.study.enqueue_trial(params, user_attrs=attrs if forced else {"design": True, **attrs})
        trial = self.study.ask()
        try:
            value = self.objective.run(trial, None)
            self.study.tell(trial, value)
        except optuna.TrialPruned:
            self.study.tell(trial, state=TrialState.PRUNED)
        return self.study.trials[-1]

    def model(self) -> MemoryModel:
        return MemoryModel.from_trials(self.study.trials, target=self.space.target_level)


def facts(t: optuna.trial.FrozenTrial) -> TrialFacts:
    return TrialFacts.from_trial(t)


def sim_free_after_capture(space: Space, mfs: float, bs: int) -> float:
    ev = SimEvaluator(space)
    launch = SimLaunch(model_path="/m", tp_size=4, mem_fraction_static=mfs, cuda_graph_max_bs=bs,
                       version=ev.version or "0.5.10")
    figs = plan_startup(ev.profile, launch).memory
    assert figs.free_after_capture_gib is not None
    return figs.free_after_capture_gib


def test_no_prediction_before_any_launch(space: Space) -> None:
    assert MemoryModel(target=64).predict(Candidate(0.7, 32, 64)) is None


def test_free_after_capture_is_predicted_and_its_uncertainty_shrinks(space: Space) -> None:
    bench = Bench(space, gate=False)
    bench.launch(point(0.55, 80))
    one = bench.model().free_after_capture(Candidate(0.70, 32, 64))
    bench.launch(point(0.60, 16))
    two = bench.model().free_after_capture(Candidate(0.70, 32, 64))
    assert one is not None and two is not None
    truth = sim_free_after_capture(space, 0.70, 32)
    assert two[1] < one[1]  # a second graph size pins the graph pool's slope
    assert abs(two[0] - truth) < 0.3  # the pool arithmetic, fitted, lands on the simulator's figure
    assert abs(two[0] - truth) <= abs(one[0] - truth) + 1e-9


def test_capture_death_makes_tighter_configurations_certain_deaths(space: Space) -> None:
    bench = Bench(space, gate=False)
    bench.launch(point(0.55, 80))
    bench.launch(point(0.60, 16))
    dead = bench.launch(point(0.86, 64), forced=True)
    assert facts(dead).outcome == "oom" and facts(dead).phase == "cuda_graph"
    model = bench.model()
    bound = model.bounds()["cuda_graph"]
    assert bound.lower is not None and dead.number in bound.lower_from
    worse = model.predict(Candidate(0.88, 80, 64))  # less free memory than the one that died
    assert worse is not None and worse.certain_death and worse.margin_gib < 0
    assert dead.number in worse.rests_on
    safe = model.predict(Candidate(0.60, 64, 64))
    assert safe is not None and not safe.certain_death and safe.margin_gib > 0


def test_eager_decode_death_predicts_eager_configurations_only(space: Space) -> None:
    bench = Bench(space, gate=False)
    bench.launch(point(0.55, 80))
    bench.launch(point(0.60, 16))  # C=64 > 16: eager decode, survives with this much free
    died = bench.launch(point(0.78, 48))  # eager again, with less free: dies in decode
    assert facts(died).phase == "decode"
    model = bench.model()
    eager = model.predict(Candidate(0.80, 32, 64))
    graphs = model.predict(Candidate(0.80, 64, 64))
    assert eager is not None and eager.certain_death and eager.tightest == "eager"
    assert graphs is not None and not graphs.certain_death


def test_a_launch_that_contradicts_a_death_drops_it(space: Space) -> None:
    bench = Bench(space, gate=False)
    bench.launch(point(0.55, 80))
    model = bench.model()
    facts = model.facts[0]
    # A death reported with more free memory than a proven survival was something else (noise, another
    # process): it must not make the survivor's region a certain death.
    from dataclasses import replace

    ghost = replace(facts, number=99, outcome="oom", phase="cuda_graph", free_cap=None,
                    mfs=0.55, max_bs=80)
    model.facts.append(ghost)
    assert model.bounds()["cuda_graph"].lower is None
    pred = model.predict(Candidate(0.56, 80, 64))
    assert pred is not None and not pred.certain_death


def test_objective_skips_a_certain_death_without_launching(space: Space) -> None:
    bench = Bench(space)
    bench.launch(point(0.55, 80))
    bench.launch(point(0.60, 16))
    bench.launch(point(0.86, 64), forced=True)
    launches = len(bench.evaluator.launches)
    skipped = bench.launch(point(0.88, 80))
    assert len(bench.evaluator.launches) == launches  # no GPU time spent
    assert skipped.state == TrialState.PRUNED
    rec = facts(skipped)
    assert rec.outcome == PREDICTED_OOM and rec.predicted_oom and not rec.launched
    assert rec.predicted_margin_gib is not None and rec.predicted_margin_gib < 0
    assert rec.predicted_phase == "cuda_graph" and rec.phase == "cuda_graph"
    assert 2 in rec.prediction_rests_on
    assert skipped.constraints[MARGIN_CONSTRAINT] > 0  # infeasible for the constrained sampler
    # A skip is a prediction, not a measurement: the same configuration later is judged again, not reused.
    again = bench.launch(point(0.88, 80))
    assert facts(again).duplicate_of is None


def test_a_likely_death_is_skipped_before_any_launch_has_died(space: Space) -> None:
    bench = Bench(space)
    bench.launch(point(0.55, 80))  # the probe: no death seen yet, so nothing is certain
    pred = bench.model().predict(Candidate(0.84, 80, space.target_level))
    assert pred is not None and not pred.certain_death and pred.likely_death
    skipped = bench.launch(point(0.84, 80))
    assert facts(skipped).predicted_oom and len(bench.evaluator.launches) == 1
    # Where the model is sure it survives (margin above zero) it launches.
    kept = bench.launch(point(0.70, 80))
    assert facts(kept).launched and len(bench.evaluator.launches) == 2


def test_launched_trials_carry_their_measured_margin(space: Space) -> None:
    bench = Bench(space)
    ok = bench.launch(point(0.55, 80))
    assert ok.state == TrialState.COMPLETE
    assert ok.constraints[MARGIN_CONSTRAINT] <= 0  # feasible
    dead = bench.launch(point(0.86, 64), forced=True)
    assert facts(dead).outcome == "oom"
    assert dead.constraints[MARGIN_CONSTRAINT] > 0
    margin = facts(dead).measured_margin_gib
    assert margin is not None and margin < 0


def test_probe_and_confirmations_are_launched_whatever_the_model_says(space: Space) -> None:
    bench = Bench(space)
    bench.launch(point(0.55, 80))
    bench.launch(point(0.60, 16))
    bench.launch(point(0.86, 64), forced=True)
    launches = len(bench.evaluator.launches)
    bench.study.enqueue_trial(point(0.88, 80), user_attrs={"confirmation_of": 0})
    trial = bench.study.ask()
    with pytest.raises(optuna.TrialPruned):
        bench.objective.run(trial, None)
    assert len(bench.evaluator.launches) == launches + 1


def test_vllm_kv_check_margin() -> None:
    facts = [VllmFacts(number=0, utilization=0.9, max_model_len=32768, total_gib=80.0, available_kv_gib=40.0,
                       requested_kv_gib=4.0, refused=False)]
    model = VllmMemoryModel(facts)
    assert model.non_kv_gib() == pytest.approx(32.0)
    assert model.predict(0.9, 32768) == pytest.approx(36.0)
    # The KV check refuses when max_model_len needs more than the budget leaves.
    assert model.predict(0.45, 32768 * 2) == pytest.approx(0.45 * 80 - 32 - 8) and model.predict(0.45, 65536) < 0
    assert VllmMemoryModel([]).predict(0.9, 1024) is None


def test_proven_rests_on_launches_not_on_priors(space: Space) -> None:
    bench = Bench(space)
    bench.launch(point(0.55, 80))
    bench.launch(point(0.70, 80))
    model = bench.model()
    assert model.proven(Candidate(0.70, 80, space.target_level))  # these memory knobs served the target
    assert model.proven(Candidate(0.62, 80, space.target_level))  # more free memory than a survivor
    assert not model.proven(Candidate(0.74, 80, space.target_level))  # less than any launch got through
    # An eager decode step (graphs smaller than the target concurrency) no launch has got through.
    assert not model.proven(Candidate(0.55, 16, space.target_level))
