"""Stopping a clear loser's benchmark early: one rule for every evaluator.

The strategy gives each search launch a stop bar (``TrialFacts.stop_bar``: the study's best less a bound from
the noise, ``search.strategy.strategy.stop_bar``). The target level runs first (:func:`~search.trial.evaluate.
level_order`); once its first :data:`FIRST_SHARE` of requests have finished, the evaluator reads their figure and
asks :func:`stop_early`. Below the bar, the benchmark stops there: the trial is COMPLETE with that figure (the
sampler learns how bad it was, which a PRUNED trial would not tell it), and ``TrialFacts.stopped_early`` says
why. The server evaluator (``search.trial.server``, through the load generator's partial record) and the
efficiency benchmark's simulated evaluator both call this function, so the benchmark measures the product's rule.
"""

from __future__ import annotations

import math

from search.trial.records import TrialFacts

__all__ = ["FIRST_SHARE", "first_requests", "stop_early"]

#: The share of the target level's requests after which a clear loser stops.
FIRST_SHARE = 0.25


def first_requests(count: int) -> int:
    """How many of a level's ``count`` requests the early-stop look waits for (at least one, fewer than all when
    the level has more than one)."""
    return max(1, min(count - 1, math.ceil(count * FIRST_SHARE))) if count > 1 else 1


def stop_early(facts: TrialFacts, metric: str, level: int, first: float) -> bool:
    """Whether the launch stops after the target level's first requests, whose ``metric`` is ``first``: below
    the trial's stop bar it does, and ``facts.stopped_early`` then says why. A trial without a bar (a
    confirmation, the study's first value, a minimised objective) never stops."""
    bar = facts.stop_bar
    if bar is None or first >= bar:
        return False
    facts.stopped_early = (f"stopped after the first {FIRST_SHARE:.0%} of concurrency {level}: {metric} "
                           f"{first:.1f} is below {bar:.1f}, the best less the noise bound")
    return True
