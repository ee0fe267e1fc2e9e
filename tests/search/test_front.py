"""Picking from a pareto front: the knee and stated conditions, and bad rules as one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from runners.errors import ConfigError
from search.strategy.front import Goal, Point, configurations, confirmation_plan, front, parse_rule, pick, pick_record
from search.trial.records import TrialFacts

METRICS = ["output_throughput", "p99_tpot_ms"]
SENSES = ["maximize", "minimize"]
# A throughput-latency front: more throughput costs latency, steeply past 900 tok/s.
FRONT = [Point(1, (300.0, 20.0)), Point(2, (600.0, 30.0)), Point(3, (900.0, 45.0)), Point(4, (950.0, 150.0)),
         Point(5, (1000.0, 400.0))]


def test_knee_is_where_more_throughput_starts_to_cost_much_latency() -> None:
    assert pick(FRONT, METRICS, SENSES, parse_rule("knee", METRICS)) == FRONT[2]


def test_condition_then_best_first_metric() -> None:
    rule = parse_rule("p99_tpot_ms<=200", METRICS)
    assert pick(FRONT, METRICS, SENSES, rule) == FRONT[3]
    assert "p99_tpot_ms<=200" in rule.describe()
    both = parse_rule("p99_tpot_ms<=200, output_throughput>=100", METRICS)
    assert pick(FRONT, METRICS, SENSES, both) == FRONT[3]


def test_no_point_satisfies_the_rule() -> None:
    assert pick(FRONT, METRICS, SENSES, parse_rule("p99_tpot_ms<5", METRICS)) is None


def test_minimised_first_metric_picks_the_lowest() -> None:
    pts = [Point(1, (10.0, 5.0)), Point(2, (20.0, 9.0))]
    assert pick(pts, ["p99_ttft_ms", "output_throughput"], ["minimize", "maximize"],
                parse_rule("output_throughput>=1", ["p99_ttft_ms", "output_throughput"])) == pts[0]


@pytest.mark.parametrize("text, message", [
    ("fastest", "--pick: 'fastest' is not 'knee' or METRIC<=NUMBER"),
    ("p99_ttft_ms<=10", "--pick: p99_ttft_ms is not one of this study's metrics"),
    ("p99_tpot_ms<=1.2.3", "--pick: '1.2.3' is not a number"),
])
def test_bad_rules_are_one_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(".", r"\.")):
        parse_rule(text, METRICS)


# ---- the front of a study's trials ----------------------------------------------------------------

GOAL = Goal(("output_throughput", "p99_tpot_ms"), ("maximize", "minimize"))


def rec(number: int, values: tuple[float, float] | None, *, state: TrialState = TrialState.COMPLETE,
        feasible: bool = True, confirmation_of: int | None = None, duplicate_of: int | None = None,
        params: dict[str, Any] | None = None) -> TrialFacts:
    return TrialFacts(number=number, state=state, values=list(values) if values else None,
                      value=values[0] if values else None, feasible=feasible, outcome="ok",
                      confirmation_of=confirmation_of, duplicate_of=duplicate_of,
                      params=params if params is not None else {"mrr": number})


def test_the_front_is_what_no_other_configuration_beats_on_every_metric() -> None:
    trials = [rec(0, (300, 20)), rec(1, (600, 30)), rec(2, (500, 40)),  # 2: 1 is better on both
              rec(3, (600, 30), duplicate_of=1, params={"mrr": 1}),  # a reuse is not a launch
              rec(4, (2000, 1), feasible=False),  # broke a constraint (an SLO, the memory margin)
              rec(5, None, state=TrialState.PRUNED)]
    assert [p.number for p in front(trials, GOAL)] == [0, 1]


def test_a_configuration_is_placed_by_the_median_of_its_launches_and_dropped_if_one_died() -> None:
    trials = [rec(0, (1000, 50)), rec(1, (900, 60)),
              rec(2, (800, 70), confirmation_of=0, params={"mrr": 0}),
              rec(3, (850, 80), confirmation_of=0, params={"mrr": 0}),
              rec(4, None, state=TrialState.PRUNED, confirmation_of=1, params={"mrr": 1})]
    assert configurations(trials) == [Point(0, (850.0, 70.0))]
    picked = pick_record(trials, GOAL)
    assert picked is not None and picked.number == 0 and picked.values == [850.0, 70.0]


def test_confirmation_repeats_the_front_nearest_the_ideal_first() -> None:
    trials = [rec(0, (300, 20)), rec(1, (900, 45)), rec(2, (1000, 400)), rec(3, (500, 200))]
    # front: 0, 1, 2; scaled over it, 1 is nearest the ideal (1000 tok/s at 20 ms), then 0 and 2 tie
    assert [n for n, _ in confirmation_plan(trials, GOAL, k=2, repeats=1)] == [1, 0]
    assert confirmation_plan(trials, GOAL, k=1, repeats=2) == [(1, {"mrr": 1}), (1, {"mrr": 1})]
    done = [*trials, rec(4, (880, 47), confirmation_of=1, params={"mrr": 1})]
    assert confirmation_plan(done, GOAL, k=1, repeats=2) == [(1, {"mrr": 1})]
    assert confirmation_plan(done, GOAL, k=0) == []


def test_a_single_objective_study_has_no_front(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path}/s.db"
    one = optuna.create_study(storage=storage, study_name="one", direction="maximize")
    two = optuna.create_study(storage=storage, study_name="two", directions=["maximize", "minimize"])
    two.set_metric_names(["output_throughput", "p99_tpot_ms"])
    assert not Goal.of(one).pareto
    assert Goal.of(two) == GOAL and GOAL.describe() == "maximize output_throughput, minimize p99_tpot_ms"
