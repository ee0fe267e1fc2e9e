"""The search around the memory model: inert knobs, the probe and start-up design, the launch budget,
and confirming the winner over noise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.study import StudyDirection
from optuna.trial import TrialState, create_trial

from search.confirm import confirmation_plan, confirmed_best, search_launches, skip_summary
from search.records import TrialFacts
from search.sampling import distributions, held_inert, inert_knobs, probe_params, startup_design
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
    assert [origin for origin, _ in plan] == [1, 1, 3, 3, 0, 0]
    trials.append(trial(5, 11.5, cfg(0.7, 32), confirmation_of=1))
    plan = confirmation_plan(trials, StudyDirection.MAXIMIZE, k=3, repeats=2)
    assert [origin for origin, _ in plan] == [1, 3, 3, 0, 0]
    assert confirmation_plan(trials, StudyDirection.MAXIMIZE, k=0) == []


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
