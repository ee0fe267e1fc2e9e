"""The evaluator seam: how a trial's configuration is measured, behind one small protocol.

The search loop (:class:`search.trial.objective.Objective`) samples a configuration, consults the memory model,
and hands the launch to an :class:`Evaluator`. ``servetune run`` uses the server path
(:mod:`search.trial.server`: launch on a host, wait, sweep, stop); the efficiency benchmark and the tests use
``benchmarks/simeval.py``, which evaluates the simulated host's pure model in-process (kept out of the
product's import path). Both fill the same
trial record (:class:`~search.trial.records.TrialFacts`: outcome, phase, memory figures, levels) and end the
same way: a value for a server that served the target level, :class:`optuna.TrialPruned` for one that
died of its configuration. So the benchmark measures the product's search code, not a copy of it.

A death ends the trial at once (fail fast): the levels run with the one most likely to die first, the
target concurrency, then the others from the highest down (:func:`level_order`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import optuna

from runners.host import Host
from search.trial.records import TrialFacts
from spaces.launch import LaunchConfig

__all__ = ["Evaluator", "Slot", "level_order"]


class Slot(Protocol):
    """A host the caller holds for one trial (the driver's pool slot): the evaluator launches there and notes
    when its server stopped (a host whose server stopped a moment ago may still be releasing GPU memory)."""

    @property
    def host(self) -> Host: ...

    @property
    def workers(self) -> tuple[Host, ...]:
        """The other hosts of a group, in rank order (empty for one host): a server spanning nodes runs its
        rank 0 on :attr:`host` and rank R on ``workers[R - 1]``."""
        ...

    @property
    def name(self) -> str: ...

    last_server_stop: float


class Evaluator(Protocol):
    """Measure one launch of ``launch`` for ``trial``, filling ``facts`` (the trial's record, which the
    objective writes once when the trial ends): return the objective (a ``pareto`` study's values, one per
    metric), or record the death in ``facts`` and raise :class:`optuna.TrialPruned` (config-caused) /
    :class:`search.trial.objective.TrialFailed` (infrastructure)."""

    def evaluate(self, trial: optuna.Trial, launch: LaunchConfig, slot: Slot | None,
                 facts: TrialFacts) -> float | list[float]: ...


def level_order(levels: Sequence[int], target: int) -> tuple[int, ...]:
    """The sweep order that fails fast: the target level first, then the others from the highest down."""
    rest = sorted((c for c in levels if c != target), reverse=True)
    return (target, *rest) if target in levels else tuple(rest)
