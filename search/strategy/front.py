"""A ``pareto`` study's front, and picking one configuration from it by a rule the user states (and the export
names).

The front is made of configurations, not single launches: each configuration's figures are the medians over
its launches (its first launch and its confirmation repeats), and a configuration that died on any launch, or
broke a constraint, is not on it (as :func:`search.strategy.confirm.confirmed_best` does for one objective). A point is
on the front when no other point is at least as good on every metric and better on one.

Before a pareto study finishes, the configurations on the front of first launches are repeated, at most ``k``
of them, those nearest the front's ideal point first (the knee's scalarisation below):
:func:`confirmation_plan`.

Rules:

* ``knee`` (the default): the front point closest to the ideal point (every metric at its best on the front),
  after scaling each metric to [0, 1] over the front, so no metric wins by its units;
* ``METRIC<=X`` / ``METRIC>=X`` (several joined by ``,``): the front points that satisfy every condition, and
  of those the best on the study's first metric.
"""

from __future__ import annotations

import math
import operator
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.study import StudyDirection
from optuna.trial import TrialState

from runners.errors import ConfigError
from search.strategy.confirm import CONFIRM_K, CONFIRM_REPEATS, is_launch, origin
from search.trial.records import TrialFacts

__all__ = ["Goal", "PickRule", "Point", "confirmation_plan", "front", "parse_rule", "pick", "pick_record"]

_COND = re.compile(r"^\s*([a-z0-9_]+)\s*(<=|>=|<|>)\s*([-+0-9.eE]+)\s*$")
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}


@dataclass(frozen=True)
class Point:
    """One trial on the front: its number and its values in the study's metric order."""

    number: int
    values: tuple[float, ...]


@dataclass(frozen=True)
class Goal:
    """What a study optimises: its metrics' names and directions (``maximize``/``minimize``), in order."""

    metrics: tuple[str, ...]
    senses: tuple[str, ...]

    @property
    def pareto(self) -> bool:
        """Several objectives: the study has a front, not one best."""
        return len(self.senses) > 1

    @classmethod
    def of(cls, study: optuna.Study) -> Goal:
        """The study's goal, from its directions and metric names (named ``objective<i>`` when unnamed)."""
        senses = tuple("maximize" if d == StudyDirection.MAXIMIZE else "minimize" for d in study.directions)
        names = study.metric_names
        if names is None or len(names) != len(senses):
            names = ["objective"] if len(senses) == 1 else [f"objective{i}" for i in range(len(senses))]
        return cls(tuple(names), senses)

    def describe(self) -> str:
        """``maximize output_throughput, minimize p99_tpot_ms``."""
        return ", ".join(f"{s} {m}" for m, s in zip(self.metrics, self.senses, strict=True))


def _dominates(a: tuple[float, ...], b: tuple[float, ...], senses: Sequence[str]) -> bool:
    """``a`` is at least as good as ``b`` on every metric and better on one."""
    better = False
    for x, y, sense in zip(a, b, senses, strict=True):
        gain = x - y if sense == "maximize" else y - x
        if gain < 0:
            return False
        better = better or gain > 0
    return better


def non_dominated(points: Sequence[Point], senses: Sequence[str]) -> list[Point]:
    """The points no other point dominates, by number."""
    return sorted((p for p in points if not any(_dominates(q.values, p.values, senses) for q in points)),
                  key=lambda p: p.number)


def configurations(trials: Sequence[TrialFacts]) -> list[Point]:
    """Every configuration that was launched and never died nor broke a constraint, as a point: the number
    of its first launch, and per metric the median over its launches."""
    groups: dict[int, list[TrialFacts]] = {}
    for t in trials:
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and is_launch(t):
            groups.setdefault(origin(t), []).append(t)
    points = []
    for number, launches in groups.items():
        if any(t.state != TrialState.COMPLETE or not t.values or not t.feasible for t in launches):
            continue
        dims = len(launches[0].values or ())
        points.append(Point(number, tuple(statistics.median((t.values or ())[d] for t in launches)
                                          for d in range(dims))))
    return points


def front(trials: Sequence[TrialFacts], goal: Goal) -> list[Point]:
    """The study's front: the configurations (:func:`configurations`) no other one dominates."""
    return non_dominated(configurations(trials), goal.senses)


def pick_record(trials: Sequence[TrialFacts], goal: Goal, rule: PickRule | None = None) -> TrialFacts | None:
    """The first launch of the configuration ``rule`` (default: the knee) picks from the front, with its
    ``values`` replaced by the front's medians; None when the front is empty or no point satisfies it."""
    chosen = pick(front(trials, goal), goal.metrics, goal.senses, rule or PickRule("knee"))
    if chosen is None:
        return None
    rec = next(t for t in trials if t.number == chosen.number)
    return rec.model_copy(update={"values": list(chosen.values), "value": chosen.values[0]})


def confirmation_plan(trials: Sequence[TrialFacts], goal: Goal, *, k: int = CONFIRM_K,
                      repeats: int = CONFIRM_REPEATS) -> list[tuple[int, dict[str, Any]]]:
    """(origin trial, params) of the confirmation launches a pareto study still has to make: the front of
    first launches, at most ``k`` configurations of it, nearest the front's ideal point first (the knee's
    distance), each launched ``repeats`` more times."""
    if k <= 0 or repeats <= 0:
        return []
    firsts = [t for t in trials if t.state == TrialState.COMPLETE and t.values and t.feasible
              and t.confirmation_of is None and t.duplicate_of is None]
    points = non_dominated([Point(t.number, tuple(t.values or ())) for t in firsts], goal.senses)
    by_number = {t.number: t for t in firsts}
    top: list[TrialFacts] = []
    for p in sorted(points, key=lambda p: (_shortfall(p, points, goal.senses), p.number)):
        if all(by_number[p.number].params != t.params for t in top):
            top.append(by_number[p.number])
        if len(top) == k:
            break
    made: dict[int, int] = {}
    for t in trials:
        if t.confirmation_of is not None and t.state != TrialState.FAIL:
            made[t.confirmation_of] = made.get(t.confirmation_of, 0) + 1
    plan = []
    for t in top:
        plan += [(t.number, dict(t.params))] * max(0, repeats - made.get(t.number, 0))
    return plan


@dataclass(frozen=True)
class PickRule:
    text: str
    conditions: tuple[tuple[str, str, float], ...] = ()

    @property
    def is_knee(self) -> bool:
        return not self.conditions

    def describe(self) -> str:
        if self.is_knee:
            return "knee (closest to the front's ideal point, each metric scaled to [0, 1] over the front)"
        return f"{self.text} (then the best on the first metric)"


def parse_rule(text: str, metrics: Sequence[str]) -> PickRule:
    """``knee`` or ``METRIC<=X[,METRIC>=Y...]`` over the study's ``metrics``; ConfigError (one line) if not."""
    if text.strip() == "knee":
        return PickRule("knee")
    conditions = []
    for part in text.split(","):
        m = _COND.match(part)
        if m is None:
            raise ConfigError(f"--pick: {part.strip()!r} is not 'knee' or METRIC<=NUMBER (or >=, <, >)")
        name, op, number = m.groups()
        if name not in metrics:
            raise ConfigError(f"--pick: {name} is not one of this study's metrics ({', '.join(metrics)})")
        try:
            conditions.append((name, op, float(number)))
        except ValueError:
            raise ConfigError(f"--pick: {number!r} is not a number") from None
    return PickRule(text.strip(), tuple(conditions))


def pick(points: Sequence[Point], metrics: Sequence[str], senses: Sequence[str], rule: PickRule) -> Point | None:
    """The point ``rule`` picks from ``points`` (the front), or None when no point satisfies it."""
    if not points:
        return None
    if rule.is_knee:
        return _knee(points, senses)
    index = {name: i for i, name in enumerate(metrics)}
    ok = [p for p in points if all(_OPS[op](p.values[index[name]], x) for name, op, x in rule.conditions)]
    if not ok:
        return None
    first = (lambda p: p.values[0]) if senses[0] == "maximize" else (lambda p: -p.values[0])
    return max(ok, key=lambda p: (first(p), -p.number))


def _knee(points: Sequence[Point], senses: Sequence[str]) -> Point:
    return min(points, key=lambda p: (_shortfall(p, points, senses), p.number))


def _shortfall(p: Point, points: Sequence[Point], senses: Sequence[str]) -> float:
    """How far ``p`` is from the ideal point of ``points``, each metric scaled to [0, 1] over ``points``."""
    total = 0.0
    for d, sense in enumerate(senses):
        low = min(q.values[d] for q in points)
        span = max(q.values[d] for q in points) - low
        if span <= 0:
            continue
        good = (p.values[d] - low) / span if sense == "maximize" else 1.0 - (p.values[d] - low) / span
        total += (1.0 - good) ** 2
    return math.sqrt(total)
