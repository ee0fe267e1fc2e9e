"""Picking from a pareto front: the knee and stated conditions, and bad rules as one line."""

from __future__ import annotations

import pytest

from runners.errors import ConfigError
from search.front import Point, parse_rule, pick

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
