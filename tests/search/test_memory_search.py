"""The search around the memory model: inert knobs, the probe and start-up design (placed at the memory
boundary by the model), the launch budget, and confirming the winner over noise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.study import StudyDirection
from optuna.trial import TrialState, create_trial

from search.confirm import confirmation_plan, confirmed_best, search_launches, skip_summary
from search.evaluate import SimEvaluator
from search.memory import MemoryModel
from search.objective import Objective, TrialEnv
from search.records import TrialFacts, records
from search.sampling import (
    distributions,
    enqueue_start,
    held_inert,
    inert_knobs,
    place_memory,
    probe_params,
    safe_memory,
    startup_design,
)
from spaces.launch import engine_options
from spaces.schema import Space, load_space

ROOT = Path(__file__).resolve().parents[2]
DISTS = {"mem_fraction_static": FloatDistribution(0.5, 0.9, step=0.01),
         "cuda_graph_max_bs": CategoricalDistribution([16, 32, 64])}


@pytest.fixture(scope="module")
def space() -> Space:
    return load_space(ROOT / "spaces" / "demo-sim.yaml")


def test_inert_knobs_follow_the_engine_version(space: Space) -> None:
    assert "num_continuous_decode_steps" in inert_knobs("sglang", "0.5.10")
    assert "num_continuous_decode_steps" in inert_knobs("sim", "0.5.23", engine_options(space))
    assert "num_continuous_decode_steps" in inert_knobs("sglang", None)  # every release covered
    # The engine's table: liveness read for 0.5.2-0.5.23 and assumed to hold after the last release read.
    assert set(inert_knobs("sglang", "0.5.24")) == {"num_continuous_decode_steps"}
    assert inert_knobs("vllm", "0.11.0") == {}


def test_inert_knob_is_held_unless_the_space_insists(space: Space) -> None:
    assert "num_continuous_decode_steps" in held_inert(space)
    assert "num_continuous_decode_steps" not in distributions(space)
    insisting = space.model_copy(update={"search_inert": ["num_continuous_decode_steps"]})
    assert held_inert(insisting) == {}
    assert "num_continuous_decode_steps" in distributions(insisting)


def test_probe_is_the_safe_end_of_the_memory_knobs(space: Space) -> None:
    probe = probe_params(space)
    assert probe["mem_fraction_static"] == pytest.approx(0.55)
    assert probe["cuda_graph_max_bs"] == 80
    assert probe["nccl.NCCL_PROTO"] == "unset" and probe["nccl.NCCL_ALGO"] == "unset"


def test_startup_design_moves_one_knob_at_a_time(space: Space) -> None:
    probe = probe_params(space)
    design = startup_design(space)
    for point in design:
        assert sum(point[k] != probe[k] for k in probe) == 1
    moved = {next(k for k in probe if p[k] != probe[k]) for p in design}
    assert moved == set(distributions(space))
    assert len(design) == 2 + 3 + 4 + 2  # NCCL_ALGO, NCCL_PROTO, graph sizes, two memory fractions


def trial(number: int, value: float | None, params: dict[str, Any], **attrs: Any) -> TrialFacts:
    """A finished trial as the search reads it (its record), with the given facts as user attrs."""
    t = create_trial(value=value, params=params, distributions=DISTS, user_attrs=attrs,
                     state=TrialState.COMPLETE if value is not None else TrialState.PRUNED)
    t.number = number
    return TrialFacts.from_trial(t)


def cfg(mfs: float, bs: int) -> dict[str, Any]:
    return {"mem_fraction_static": mfs, "cuda_graph_max_bs": bs}


def test_skips_and_confirmations_hold_no_budget_slot() -> None:
    trials = [trial(0, 10.0, cfg(0.6, 16), outcome="ok"), trial(1, None, cfg(0.9, 64), outcome="predicted_oom"),
              trial(2, None, cfg(0.8, 64), outcome="oom"), trial(3, 11.0, cfg(0.6, 16), confirmation_of=0)]
    assert search_launches(trials) == (2, 0)
    line = skip_summary(trials)
    assert "1 configurations not launched" in line and "1 died of OOM" in line


def test_confirmation_plan_repeats_the_top_distinct_configurations() -> None:
    trials = [trial(0, 10.0, cfg(0.6, 16)), trial(1, 12.0, cfg(0.7, 32)), trial(2, 12.0, cfg(0.7, 32),
              duplicate_of=1), trial(3, 11.0, cfg(0.6, 64)), trial(4, 9.0, cfg(0.5, 64))]
    plan = confirmation_plan(trials, StudyDirection.MAXIMIZE, k=3, repeats=2)
    assert [step.origin for step in plan] == [1, 1, 3, 3, 0, 0]
    assert not any(step.final for step in plan)
    trials.append(trial(5, 11.5, cfg(0.7, 32), confirmation_of=1))
    plan = confirmation_plan(trials, StudyDirection.MAXIMIZE, k=3, repeats=2)
    assert [step.origin for step in plan] == [1, 3, 3, 0, 0]
    assert plan[0].user_attrs == {"confirmation_of": 1}
    assert confirmation_plan(trials, StudyDirection.MAXIMIZE, k=0) == []


def screened() -> list[TrialFacts]:
    """Three configurations, each launched once more: 1 is the best on its two launches."""
    return [trial(0, 10.0, cfg(0.6, 16)), trial(1, 12.0, cfg(0.7, 32)), trial(2, 11.0, cfg(0.6, 64)),
            trial(3, 12.2, cfg(0.7, 32), confirmation_of=1), trial(4, 10.1, cfg(0.6, 64), confirmation_of=2),
            trial(5, 9.9, cfg(0.6, 16), confirmation_of=0)]


def test_the_chosen_configuration_gets_its_final_launches_after_the_screening() -> None:
    trials = screened()
    plan = confirmation_plan(trials, StudyDirection.MAXIMIZE, k=3, repeats=1, final=3)
    assert [(step.origin, step.final) for step in plan] == [(1, True)] * 3
    assert plan[0].params == cfg(0.7, 32)
    assert plan[0].user_attrs == {"confirmation_of": 1, "final": True}
    trials.append(trial(6, 11.0, cfg(0.7, 32), confirmation_of=1, final=True))
    assert len(confirmation_plan(trials, StudyDirection.MAXIMIZE, k=3, repeats=1, final=3)) == 2
    assert confirmation_plan(trials, StudyDirection.MAXIMIZE, k=3, repeats=1, final=1) == []


def test_the_final_launches_wait_for_every_screening_repeat() -> None:
    trials = screened()
    running = create_trial(state=TrialState.RUNNING, params=cfg(0.6, 16), distributions=DISTS,
                           user_attrs={"confirmation_of": 0})
    running.number = 6
    trials = [t for t in trials if t.number != 5] + [TrialFacts.from_trial(running)]
    # Trial 0's repeat is still running: nothing more is queued until it ends (the caller waits).
    assert confirmation_plan(trials, StudyDirection.MAXIMIZE, k=3, repeats=1, final=3) == []


def test_reported_figure_is_the_final_launches_median_and_they_do_not_change_the_choice() -> None:
    trials = screened()
    best = confirmed_best(trials, StudyDirection.MAXIMIZE)
    assert best is not None and best.trial == 1
    assert best.reported == pytest.approx(12.2)  # without final launches: the repeat's figure
    # Final launches below the runner-up's figures: the choice made on the screening stands, and the
    # figure reported is theirs (the luck that won the choice is not in it).
    trials += [trial(6, 10.5, cfg(0.7, 32), confirmation_of=1, final=True),
               trial(7, 10.9, cfg(0.7, 32), confirmation_of=1, final=True),
               trial(8, 10.7, cfg(0.7, 32), confirmation_of=1, final=True)]
    best = confirmed_best(trials, StudyDirection.MAXIMIZE)
    assert best is not None and best.trial == 1
    assert best.reported == pytest.approx(10.7)
    assert best.median == pytest.approx(12.1)  # what it was ranked by: its first launch and the repeat
    assert best.launches == 5 and best.final == 3
    assert best.spread == pytest.approx((12.2 - 10.5) / 10.9)


def test_confirmed_best_is_chosen_on_the_median_not_one_lucky_run() -> None:
    trials = [trial(0, 13.0, cfg(0.6, 16)),  # lucky first run ...
              trial(1, 12.0, cfg(0.7, 32)),
              trial(2, 10.0, cfg(0.6, 16), confirmation_of=0), trial(3, 10.2, cfg(0.6, 16), confirmation_of=0),
              trial(4, 12.1, cfg(0.7, 32), confirmation_of=1), trial(5, 11.9, cfg(0.7, 32), confirmation_of=1)]
    best = confirmed_best(trials, StudyDirection.MAXIMIZE)
    assert best is not None and best.trial == 1 and best.launches == 3
    assert best.median == pytest.approx(12.0)
    assert best.spread == pytest.approx(0.2 / 12.0)
    assert best.reported == pytest.approx(12.0)  # the repeats' median: 12.1 and 11.9


def test_a_configuration_that_died_on_a_repeat_is_not_chosen() -> None:
    trials = [trial(0, 13.0, cfg(0.8, 16)), trial(1, 12.0, cfg(0.7, 32)),
              trial(2, None, cfg(0.8, 16), confirmation_of=0, outcome="oom"),
              trial(3, 12.5, cfg(0.8, 16), confirmation_of=0), trial(4, 12.1, cfg(0.7, 32), confirmation_of=1),
              trial(5, 11.9, cfg(0.7, 32), confirmation_of=1)]
    best = confirmed_best(trials, StudyDirection.MAXIMIZE)
    assert best is not None and best.trial == 1


def run_queued(study: optuna.Study, objective: Objective) -> TrialFacts:
    """Ask for the queued trial and run it through the product's objective."""
    t = study.ask()
    try:
        study.tell(t, objective.run(t, None))
    except optuna.TrialPruned:
        study.tell(t, state=TrialState.PRUNED)
    return records(study)[-1]


def test_startup_design_puts_the_memory_knob_at_the_boundary_the_model_is_sure_of(space: Space) -> None:
    evaluator = SimEvaluator(space, seed=0)
    objective = Objective(TrialEnv(space=space, study_name="t", artifacts_dir=Path("/nonexistent")), evaluator)
    study = optuna.create_study(direction="maximize")
    assert enqueue_start(study, space)
    probe = run_queued(study, objective)
    assert probe.probe and probe.params == probe_params(space) and probe.state == TrialState.COMPLETE
    model = MemoryModel.from_trials(records(study), target=space.target_level)
    high = safe_memory(space, model, probe.params)
    assert high is not None and high > probe.params["mem_fraction_static"] + 0.1
    # The base: the probe with the memory knob moved up to that boundary; it survives.
    assert enqueue_start(study, space)
    base = run_queued(study, objective)
    assert base.design and base.params == {**probe.params, "mem_fraction_static": high}
    assert base.state == TrialState.COMPLETE and not evaluator.launches[-1][2]
    # A smaller graph pool (still no eager decode at the target) leaves room for a larger static
    # fraction; the design's next points are one knob moved from the base, each at its own boundary.
    model = MemoryModel.from_trials(records(study), target=space.target_level)
    smaller = safe_memory(space, model, {**base.params, "cuda_graph_max_bs": 64})
    assert smaller is not None and smaller >= high
    design = startup_design(space, model)
    assert design[0] == place_memory(space, model, base.params)
    for p in design[1:]:
        moved = [k for k in base.params if k != "mem_fraction_static" and p[k] != base.params[k]]
        assert len(moved) == 1
        assert p["mem_fraction_static"] == safe_memory(space, model, p, proven=True)
    # A graph smaller than the target concurrency meets an eager decode step no launch has got through:
    # not proven at any fraction, so it goes to the low end of the range.
    eager = next(p for p in design if p["cuda_graph_max_bs"] == 16)
    assert eager["mem_fraction_static"] == pytest.approx(0.55)
    # The whole design, each point placed by the model refitted on the launches before it: none dies.
    while enqueue_start(study, space):
        assert run_queued(study, objective).launched
    assert sum(1 for t in records(study) if t.design) == len(design)
    assert not any(died for _, _, died in evaluator.launches)


def test_startup_design_without_memory_figures_moves_from_the_probe(space: Space) -> None:
    assert startup_design(space, MemoryModel(target=space.target_level)) == startup_design(space)
    # Numeric choices farthest from the probe's first: a knob's whole effect is seen at once.
    graph = [p["cuda_graph_max_bs"] for p in startup_design(space) if p["cuda_graph_max_bs"] != 80]
    assert graph == [16, 32, 48, 64]


def test_a_design_point_asked_before_the_probe_ended_is_not_asked_again(space: Space) -> None:
    """Two hosts: the second asks for a start-up point while the probe still runs (no memory figures yet),
    so it gets a move from the probe; once the probe is in, the base comes next, and no move is queued
    twice (the earlier one is not asked again at its placed fraction)."""
    evaluator = SimEvaluator(space, seed=0)
    objective = Objective(TrialEnv(space=space, study_name="t", artifacts_dir=Path("/nonexistent")), evaluator)
    study = optuna.create_study(direction="maximize")
    assert enqueue_start(study, space)
    probe = study.ask()  # running on the first host
    assert enqueue_start(study, space)
    early = study.ask()
    for t in (probe, early):
        study.tell(t, objective.run(t, None))
    assert records(study)[1].params == startup_design(space)[0]  # a move from the probe, at its fraction
    assert enqueue_start(study, space)
    base = run_queued(study, objective)

    def knobs(params: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in params.items() if k != "mem_fraction_static"}

    assert knobs(base.params) == knobs(records(study)[0].params)
    assert base.params["mem_fraction_static"] > records(study)[0].params["mem_fraction_static"]
    while enqueue_start(study, space):
        run_queued(study, objective)
    asked = [knobs(t.params) for t in records(study) if t.design]
    assert all(asked.count(k) == 1 for k in asked)
    model = MemoryModel.from_trials(records(study), target=space.target_level)
    assert len(asked) == len(startup_design(space, model))
