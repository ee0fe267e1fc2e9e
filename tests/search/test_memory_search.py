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

from benchmarks.simeval import SimEvaluator
from runners.engines.sglang_memory import default_memory
from search.strategy.confirm import confirmation_plan, confirmed_best, forced_settings, search_launches, skip_summary
from search.strategy.design import PROBE_RESERVE_FACTOR, place_memory, probe_params, safe_memory, startup_design
from search.strategy.distributions import distributions, held_inert, inert_knobs
from search.strategy.memory import MemoryModel
from search.strategy.strategy import Enqueue, Strategy, TrialGate
from search.trial.objective import Objective, TrialEnv
from search.trial.records import TrialFacts, records
from spaces.launch import engine_options
from spaces.schema import Space, load_space

ROOT = Path(__file__).resolve().parents[2]
DISTS = {"mem_fraction_static": FloatDistribution(0.5, 0.9, step=0.01),
         "cuda_graph_max_bs": CategoricalDistribution([16, 32, 64]),
         "nccl.NCCL_PROTO": CategoricalDistribution(["unset", "LL", "Simple"])}


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


def test_probe_follows_sglangs_default_arithmetic_with_twice_its_reserve(space: Space) -> None:
    """With the card's memory known (the host's nvidia-smi), the probe's fraction is SGLang's own default
    (sglang-facts §1.3) with twice the reserve, rounded down onto the space's grid."""
    # SGLang 0.5.10 on seed 003's 97,887 MiB cards, TP4, graphs to 80: reserve 512 + 8192 * 1.5 + 80 * 2
    # + 4/8 * 1024 + 1.5 GiB of prefill graphs = 15,008 MiB -> 0.847, the default that died in capture.
    defaults = default_memory("0.5.10", 97887, 4, cuda_graph_max_bs=80)
    assert defaults.reserved_mib == pytest.approx(15008) and defaults.mem_fraction_static == pytest.approx(0.847)
    assert default_memory("0.5.10", 97887, 4, cuda_graph_max_bs=80,
                          reserve_factor=PROBE_RESERVE_FACTOR).mem_fraction_static == pytest.approx(0.693)
    assert probe_params(space, 97887)["mem_fraction_static"] == pytest.approx(0.69)
    # 8 x H200 (143,771 MiB), TP8, graphs to 512: SGLang's default 0.886; the probe 0.772 -> 0.76 on the
    # space's 0.02 grid from 0.70.
    assert default_memory("0.5.10", 143771, 8).mem_fraction_static == pytest.approx(0.886)
    deepseek = load_space(ROOT / "spaces" / "sim-deepseek-v3-tp8-h200.yaml")
    assert probe_params(deepseek, 143771)["mem_fraction_static"] == pytest.approx(0.76)
    # 0.5.2's tiers: (12 + 4/2) GiB on a 97,887 MiB card at TP4.
    assert default_memory("0.5.2", 97887, 4).mem_fraction_static == pytest.approx(round(1 - 14 * 1024 / 97887, 3))
    # A card too small for the doubled reserve, or unknown memory: the low end of the range.
    assert probe_params(space, 24 * 1024)["mem_fraction_static"] == pytest.approx(0.55)
    assert probe_params(space, None) == probe_params(space)
    # A space that leaves the version to the host: the version the preflight found there.
    unversioned = space.model_copy(update={"engine": space.engine.model_copy(update={"version": None})})
    assert probe_params(unversioned, 97887)["mem_fraction_static"] == pytest.approx(0.55)
    assert probe_params(unversioned, 97887, "0.5.10.post1")["mem_fraction_static"] == pytest.approx(0.69)
    assert probe_params(unversioned, 97887, "not-a-version")["mem_fraction_static"] == pytest.approx(0.55)
    # Only where the engine has that arithmetic: a vLLM space keeps the low end of its own knob.
    vllm = load_space(ROOT / "spaces" / "vllm-cpu-tiny.yaml")
    assert probe_params(vllm, 97887) == probe_params(vllm)


def test_startup_design_moves_one_knob_at_a_time(space: Space) -> None:
    probe = probe_params(space)
    design = startup_design(space)
    for point in design:
        assert sum(point[k] != probe[k] for k in probe) == 1
    moved = {next(k for k in probe if p[k] != probe[k]) for p in design}
    assert moved == set(distributions(space))
    assert len(design) == 2 + 2 + 4 + 2  # NCCL_ALGO, NCCL_PROTO, graph sizes, two memory fractions


def trial(number: int, value: float | None, params: dict[str, Any], **attrs: Any) -> TrialFacts:
    """A finished trial as the search reads it (its record), with the given facts as user attrs."""
    t = create_trial(value=value, params=params, distributions={k: DISTS[k] for k in params}, user_attrs=attrs,
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
    # One final launch made of one asked for: the noise these launches show (12.0, 12.2, 11.0: about 5%) asks
    # for more, one at a time (test_a_noisy_host_gets_more_final_launches...).
    assert len(confirmation_plan(trials, StudyDirection.MAXIMIZE, k=3, repeats=1, final=1)) == 1


def test_the_final_launches_wait_for_every_screening_repeat() -> None:
    trials = screened()
    running = create_trial(state=TrialState.RUNNING, params=cfg(0.6, 16), distributions={k: DISTS[k] for k in cfg(0.6, 16)},
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


def nccl(mfs: float, bs: int, proto: str) -> dict[str, Any]:
    return {**cfg(mfs, bs), "nccl.NCCL_PROTO": proto}


def test_forced_settings_count_the_environment_overrides() -> None:
    assert forced_settings(nccl(0.7, 32, "unset")) == 0
    assert forced_settings({**nccl(0.7, 32, "LL"), "nccl.NCCL_ALGO": "allreduce:ring"}) == 2
    assert forced_settings(cfg(0.7, 32)) == 0


def noisy_screening(plain: tuple[float, float], forced: tuple[float, float]) -> list[TrialFacts]:
    """Two candidates launched twice each (a plain one and one forcing NCCL_PROTO=LL), a third one much
    worse, and other launches: the noise is measured from the repeats."""
    return [trial(0, forced[0], nccl(0.7, 32, "LL")), trial(1, plain[0], nccl(0.7, 32, "unset")),
            trial(2, 8.0, nccl(0.6, 16, "Simple")), trial(3, 8.1, nccl(0.6, 16, "unset")),
            trial(4, forced[1], nccl(0.7, 32, "LL"), confirmation_of=0),
            trial(5, plain[1], nccl(0.7, 32, "unset"), confirmation_of=1),
            trial(6, 8.3, nccl(0.6, 16, "Simple"), confirmation_of=2)]


def test_a_forced_setting_the_noise_cannot_tell_apart_is_not_chosen() -> None:
    """The one-standard-error rule: the forced configuration leads by 1%, the repeats differ by ~4%, so
    the measurements cannot tell them apart and the plain one (NCCL left to its own tuner) is chosen."""
    best = confirmed_best(noisy_screening(plain=(12.0, 11.5), forced=(12.5, 11.2)), StudyDirection.MAXIMIZE)
    assert best is not None and best.trial == 1


def test_a_forced_setting_that_clearly_pays_is_chosen() -> None:
    """Repeats within 0.3% of each other, and the forced configuration 8% ahead: it is chosen."""
    best = confirmed_best(noisy_screening(plain=(12.0, 12.03), forced=(13.0, 12.97)), StudyDirection.MAXIMIZE)
    assert best is not None and best.trial == 0


def test_the_screening_makes_room_for_a_plain_configuration_near_the_top() -> None:
    """The top three all force NCCL_PROTO; a plain configuration within the noise of the leader takes
    the last screening slot, so the choice can prefer it."""
    values = [(12.4, 0.7, 32, "LL"), (12.3, 0.7, 64, "LL"), (12.2, 0.7, 32, "Simple"), (12.3, 0.7, 32, "unset"),
              (9.0, 0.5, 16, "unset"), (9.4, 0.5, 16, "LL"), (11.0, 0.6, 16, "Simple"), (10.2, 0.6, 16, "LL"),
              (11.3, 0.6, 64, "unset"), (9.9, 0.5, 64, "Simple"), (10.8, 0.6, 32, "LL"), (9.2, 0.5, 32, "unset"),
              (11.9, 0.7, 16, "LL"), (10.1, 0.5, 64, "LL")]
    trials = [trial(i, v, nccl(m, b, p)) for i, (v, m, b, p) in enumerate(values)]
    plan = confirmation_plan(trials, StudyDirection.MAXIMIZE, k=3, repeats=1)
    assert 3 in [step.origin for step in plan]
    assert len(plan) == 3 and sum(forced_settings(step.params) == 0 for step in plan) == 1
    # Far below the leader (beyond the noise), a plain configuration takes no slot.
    far = [t for t in trials if t.number != 3]
    plan = confirmation_plan(far, StudyDirection.MAXIMIZE, k=3, repeats=1)
    assert sorted(step.origin for step in plan) == [0, 1, 2]


def enqueue_start(study: optuna.Study, space: Space, gpu_mem_mib: float | None = None) -> bool:
    """Queue what the strategy says comes next when it is a start-up point (the probe or a design point)."""
    strategy = Strategy(space, None, gpu_mem_mib=gpu_mem_mib)
    action = strategy.next(strategy.view(study))
    if not isinstance(action, Enqueue):
        return False
    study.enqueue_trial(action.params, user_attrs=action.tags)
    return True


def gate(study: optuna.Study, space: Space) -> TrialGate:
    strategy = Strategy(space, None)
    return strategy.gate(strategy.view(study))


def run_queued(study: optuna.Study, objective: Objective) -> TrialFacts:
    """Ask for the queued trial and run it through the product's objective."""
    t = study.ask()
    try:
        study.tell(t, objective.run(t, None, gate(study, objective.env.space)))
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
        study.tell(t, objective.run(t, None, gate(study, space)))
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


def test_a_design_point_another_host_has_not_sampled_yet_is_not_queued_twice(space: Space) -> None:
    """Host A takes the base (RUNNING, its params not yet sampled: Optuna holds them as the queued
    ones); host B, asking at that moment, gets the next design point, not the base again."""
    evaluator = SimEvaluator(space, seed=0)
    objective = Objective(TrialEnv(space=space, study_name="t", artifacts_dir=Path("/nonexistent")), evaluator)
    study = optuna.create_study(direction="maximize")
    assert enqueue_start(study, space, 97887)
    run_queued(study, objective)  # the probe
    assert enqueue_start(study, space, 97887)
    taken = study.ask()  # host A: the base, not sampled yet
    assert taken.params == {}
    assert enqueue_start(study, space, 97887)  # host B
    queued = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.WAITING]
    assert len(queued) == 1
    base = study.get_trials(deepcopy=False)[taken.number].system_attrs["fixed_params"]
    assert queued[0].system_attrs["fixed_params"] != base


def test_the_screening_set_does_not_move_as_its_repeats_come_in() -> None:
    """The top three are fixed by the search's launches: a repeat that comes in low does not let a
    fourth configuration into the screening."""
    trials = [trial(0, 12.0, cfg(0.7, 32)), trial(1, 11.9, cfg(0.7, 64)), trial(2, 11.8, cfg(0.6, 64)),
              trial(3, 11.7, cfg(0.6, 32)), trial(4, 9.0, cfg(0.5, 16)), trial(5, 9.2, cfg(0.5, 32))]
    first = confirmation_plan(trials, StudyDirection.MAXIMIZE, k=3, repeats=1)
    assert sorted(step.origin for step in first) == [0, 1, 2]
    trials += [trial(6, 9.5, cfg(0.7, 32), confirmation_of=0), trial(7, 9.4, cfg(0.7, 64), confirmation_of=1)]
    assert [step.origin for step in confirmation_plan(trials, StudyDirection.MAXIMIZE, k=3, repeats=1)] == [2]


def with_finals(values: list[float]) -> list[TrialFacts]:
    """The screened study with final launches of trial 1's configuration at ``values``."""
    return screened() + [trial(6 + i, v, cfg(0.7, 32), confirmation_of=1, final=True) for i, v in enumerate(values)]


def test_a_noisy_host_gets_more_final_launches_and_the_figure_states_its_interval() -> None:
    """Every seed honest: the final launches go on while the noise the study measured says their mean is not
    within 2% (90%), up to MAX_FINAL; a quiet host stops at the three."""
    from search.strategy.confirm import HONEST_HALF_WIDTH, MAX_FINAL, finals_needed, measured_noise
    noisy = with_finals([10.0, 12.4, 11.0])  # about 10% between runs
    sd = measured_noise(noisy)
    assert sd is not None and sd > 0.05
    assert finals_needed(noisy, 3) == MAX_FINAL
    plan = confirmation_plan(noisy, StudyDirection.MAXIMIZE, k=3, repeats=1, final=3)
    assert [(step.origin, step.final) for step in plan] == [(1, True)]  # one more at a time
    best = confirmed_best(noisy, StudyDirection.MAXIMIZE)
    assert best is not None and best.interval is not None and best.interval > HONEST_HALF_WIDTH
    quiet = [*screened()[:3], trial(3, 12.01, cfg(0.7, 32), confirmation_of=1),
             trial(4, 11.0, cfg(0.6, 64), confirmation_of=2), trial(5, 10.01, cfg(0.6, 16), confirmation_of=0)]
    quiet += [trial(6 + i, v, cfg(0.7, 32), confirmation_of=1, final=True)
              for i, v in enumerate([12.0, 12.02, 11.99])]
    assert finals_needed(quiet, 3) == 3
    assert confirmation_plan(quiet, StudyDirection.MAXIMIZE, k=3, repeats=1, final=3) == []
    chosen = confirmed_best(quiet, StudyDirection.MAXIMIZE)
    assert chosen is not None and chosen.reported == pytest.approx((12.0 + 12.02 + 11.99) / 3)
    assert chosen.interval is not None and chosen.interval < HONEST_HALF_WIDTH
