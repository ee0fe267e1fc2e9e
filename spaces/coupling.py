"""Free flags and environment variables a space searches, and how knobs are coupled.

Besides the named knobs, a space may search any engine flag and any environment variable::

    knobs:
      flags:
        --schedule-policy: [lpm, fcfs]                         # a list: one of these (null: flag left out)
        --speculative-algorithm: [null, EAGLE]
        --speculative-num-steps: {low: 1, high: 5, when: {--speculative-algorithm: EAGLE}}
        --speculative-eagle-topk: {values: [1, 2, 4], when: {--speculative-algorithm: EAGLE}}
      env:
        SGLANG_ENABLE_JIT_DEEPGEMM: [unset, "0"]                # unset: the variable left out
      constraints:
        - --speculative-num-draft-tokens <= --speculative-num-steps * --speculative-eagle-topk + 1

``when`` makes a knob conditional: it is searched (Optuna's define-by-run conditional space) only while every
named knob has one of the given values, and left out of the launch otherwise. A constraint compares two sums or
products of knobs and numbers; a configuration that breaks one is not launched (its trial is PRUNED, reason
``constraint``). A constraint naming a knob that is left out (or null) holds.

Whether a flag or variable exists for the engine release is the engine's table (``runners.engines.flags``), checked
by :mod:`search.spaces`; this module checks only the space's own consistency.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Mapping
from typing import Any

from pydantic import Field, field_validator, model_validator

from spaces.strict import Strict

__all__ = ["Constraint", "EnvValues", "FlagRange", "FlagValues", "Scalar", "activate", "is_active",
           "parse_constraint", "search_order"]

Scalar = str | int | float | bool | None
"""A searched flag's value: a string, a number, true/false for a switch, null for "left out"."""

UNSET_ENV = "unset"

def _same(a: Any, b: Any) -> bool:
    """Values compare as YAML wrote them, with 1 == 1.0 but never True == 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return bool(a == b)


def _check_when(when: dict[str, Any] | None) -> dict[str, list[Any]] | None:
    if when is None:
        return None
    if not when:
        raise ValueError("when: name at least one knob and its value(s)")
    return {k: list(v) if isinstance(v, list) else [v] for k, v in when.items()}


class FlagValues(Strict):
    """A flag searched over a list of values (a bare YAML list means ``{values: [...]}``)."""

    values: list[Scalar] = Field(min_length=1)
    when: dict[str, Scalar | list[Scalar]] | None = None

    @field_validator("values")
    @classmethod
    def _distinct(cls, v: list[Scalar]) -> list[Scalar]:
        for i, a in enumerate(v):
            if any(_same(a, b) for b in v[:i]):
                raise ValueError(f"value {a!r} is given twice; values must be distinct")
        return v

    @property
    def conditions(self) -> dict[str, list[Any]] | None:
        return _check_when(self.when)


class FlagRange(Strict):
    """A numeric flag searched over a range: integers when ``low``, ``high`` (and ``step``) are integers."""

    low: int | float
    high: int | float
    step: int | float | None = Field(default=None, gt=0)
    log: bool = False
    when: dict[str, Scalar | list[Scalar]] | None = None

    @model_validator(mode="after")
    def _ordered(self) -> FlagRange:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must be <= high ({self.high})")
        if self.log and (self.low <= 0 or self.step is not None):
            raise ValueError("log: needs low > 0 and no step")
        return self

    @property
    def integer(self) -> bool:
        return all(isinstance(x, int) and not isinstance(x, bool) for x in (self.low, self.high)) and (
            self.step is None or isinstance(self.step, int))

    @property
    def conditions(self) -> dict[str, list[Any]] | None:
        return _check_when(self.when)


class EnvValues(Strict):
    """An environment variable searched over values (``unset``: left out); a bare list means ``{values: [...]}``."""

    values: list[str] = Field(min_length=1)
    when: dict[str, Scalar | list[Scalar]] | None = None

    @field_validator("values", mode="before")
    @classmethod
    def _text(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [UNSET_ENV if x is None else str(x).lower() if isinstance(x, bool) else str(x) for x in v]
        return v

    @field_validator("values")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("values must be distinct")
        return v

    @property
    def conditions(self) -> dict[str, list[Any]] | None:
        return _check_when(self.when)


_OPS: dict[type[ast.AST], Any] = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
                                  ast.LtE: operator.le, ast.Lt: operator.lt, ast.GtE: operator.ge,
                                  ast.Gt: operator.gt, ast.Eq: operator.eq, ast.NotEq: operator.ne}


class Constraint:
    """``LEFT OP RIGHT`` over knobs and numbers (``+ - *``; ``<= < >= > == !=``), e.g.
    ``--speculative-num-draft-tokens <= --speculative-num-steps * --speculative-eagle-topk + 1``."""

    def __init__(self, text: str, names: dict[str, str], tree: ast.Compare) -> None:
        self.text = text
        self._names = names  # placeholder -> knob name
        self._tree = tree

    @property
    def knobs(self) -> list[str]:
        return list(self._names.values())

    def holds(self, params: Mapping[str, Any]) -> bool:
        """Whether ``params`` keep it (a knob left out, null or not a number: it holds)."""
        values: dict[str, float] = {}
        for slot, knob in self._names.items():
            value = params.get(knob)
            if value is None or isinstance(value, bool) or not isinstance(value, int | float):
                return True
            values[slot] = float(value)
        left = self._eval(self._tree.left, values)
        right = self._eval(self._tree.comparators[0], values)
        return bool(_OPS[type(self._tree.ops[0])](left, right))

    def _eval(self, node: ast.AST, values: Mapping[str, float]) -> float:
        if isinstance(node, ast.Constant):
            assert isinstance(node.value, int | float)
            return float(node.value)
        if isinstance(node, ast.Name):
            return values[node.id]
        assert isinstance(node, ast.BinOp)
        return float(_OPS[type(node.op)](self._eval(node.left, values), self._eval(node.right, values)))


def parse_constraint(text: str) -> Constraint:
    """A :class:`Constraint` from its text; ValueError (one line) when it is not one."""
    names: dict[str, str] = {}

    def slot(m: re.Match[str]) -> str:
        name = m.group(0)
        key = next((k for k, v in names.items() if v == name), f"k{len(names)}")
        names[key] = name
        return f" {key} "

    code = re.sub(r"--[A-Za-z0-9][A-Za-z0-9-]*|env\.[A-Za-z_][A-Za-z0-9_]*|nccl\.[A-Z_]+|[a-z][a-z_]*", slot, text)
    try:
        tree = ast.parse(code.strip(), mode="eval").body
    except SyntaxError:
        raise ValueError(f"constraint {text!r} is not LEFT OP RIGHT (e.g. --a <= --b * 2 + 1)") from None
    if not (isinstance(tree, ast.Compare) and len(tree.ops) == 1 and type(tree.ops[0]) in _OPS):
        raise ValueError(f"constraint {text!r}: give one comparison (<=, <, >=, >, ==, !=)")
    for node in ast.walk(tree):
        ok = isinstance(node, ast.Compare | ast.Name | ast.Load | ast.expr_context) or type(node) in _OPS or (
            isinstance(node, ast.BinOp) and type(node.op) in _OPS) or (
            isinstance(node, ast.Constant) and isinstance(node.value, int | float)
            and not isinstance(node.value, bool))
        if not ok:
            raise ValueError(f"constraint {text!r}: only knobs, numbers, + - * and one comparison")
    if not names:
        raise ValueError(f"constraint {text!r} names no knob")
    return Constraint(text, names, tree)


def search_order(names: list[str], conditions: Mapping[str, Mapping[str, list[Any]]]) -> list[str]:
    """``names`` with every knob after the knobs its ``when`` names (ValueError on a cycle)."""
    out: list[str] = []
    doing: set[str] = set()

    def visit(name: str) -> None:
        if name in out:
            return
        if name in doing:
            raise ValueError(f"knobs' when conditions form a cycle through {name}")
        doing.add(name)
        for parent in conditions.get(name, {}):
            if parent in names:
                visit(parent)
        doing.discard(name)
        out.append(name)

    for name in names:
        visit(name)
    return out


def is_active(name: str, params: Mapping[str, Any], conditions: Mapping[str, Mapping[str, list[Any]]]) -> bool:
    """Whether knob ``name`` is searched given the values already chosen in ``params``."""
    for parent, wanted in conditions.get(name, {}).items():
        if parent not in params or not any(_same(params[parent], w) for w in wanted):
            return False
    return True


def activate(params: Mapping[str, Any], order: list[str],
             conditions: Mapping[str, Mapping[str, list[Any]]]) -> dict[str, Any]:
    """``params`` without the knobs their conditions switch off (names the order does not know are kept)."""
    out: dict[str, Any] = {}
    for name in order:
        if name in params and is_active(name, out, conditions):
            out[name] = params[name]
    return {k: v for k, v in params.items() if k in out or k not in order}
