"""Picking one configuration from a ``pareto`` study's front, by a rule the user states (and the export names).

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from runners.errors import ConfigError

_COND = re.compile(r"^\s*([a-z0-9_]+)\s*(<=|>=|<|>)\s*([-+0-9.eE]+)\s*$")
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}


@dataclass(frozen=True)
class Point:
    """One trial on the front: its number and its values in the study's metric order."""

    number: int
    values: tuple[float, ...]


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
    dims = len(senses)
    lows = [min(p.values[d] for p in points) for d in range(dims)]
    highs = [max(p.values[d] for p in points) for d in range(dims)]

    def shortfall(p: Point) -> float:
        total = 0.0
        for d in range(dims):
            span = highs[d] - lows[d]
            if span <= 0:
                continue
            good = (p.values[d] - lows[d]) / span if senses[d] == "maximize" else (highs[d] - p.values[d]) / span
            total += (1.0 - good) ** 2
        return math.sqrt(total)

    return min(points, key=lambda p: (shortfall(p), p.number))
