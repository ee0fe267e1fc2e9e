"""What servetune recommends, and why: :func:`choose` is the one function that decides it.

Every output (report, HTML, figures, status, MLflow, dashboard notes, the run's last line, export) shows the
:class:`Choice` it returns, through :attr:`search.strategy.view.StudyView.choice`:

* one objective: the configuration :func:`~search.strategy.confirm.confirmed_best` picks on its repeated
  launches (basis ``confirmed``), its figure the mean of the launches made after it was chosen; without
  repeats, the best single launch (basis ``single launch``);
* a ``pareto`` study: the front point a rule picks (``knee`` unless stated; basis ``front``), its figures the
  medians over its launches.

A ``min_free_gib`` bar keeps out configurations whose first launch left less free GPU memory after CUDA-graph
capture; :attr:`Choice.excluded` names those that would have ranked above the choice without it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from optuna.study import StudyDirection
from optuna.trial import TrialState

from search.strategy.confirm import Confirmed, confirmed_best, launches_of, origin
from search.strategy.front import Goal, PickRule, pick_record
from search.trial.records import TrialFacts

__all__ = ["CHOICE_ATTR", "NO_CHOICE_YET", "Basis", "Choice", "best_single_launch", "choose"]

Basis = Literal["confirmed", "single launch", "front"]

#: The study user attr that names servetune's choice in one line. optuna-dashboard lists a study's user
#: attributes in the order they were first set, five rows to a page, so the run sets it first (to
#: :data:`NO_CHOICE_YET`) and each publish replaces its value in place: it stays the table's first row.
CHOICE_ATTR = "servetune.choice"
#: The choice attr's value until a publish has a choice to name.
NO_CHOICE_YET = "none yet: no configuration has finished the benchmark"


@dataclass(frozen=True)
class Choice:
    """The recommended configuration: its first launch's record, with the reported figure as its ``value``
    (a ``pareto`` study: ``values``, the medians over its launches)."""

    record: TrialFacts
    basis: Basis
    launches: tuple[TrialFacts, ...]
    """Every finished launch of the configuration (its first, its repeats), by number."""
    confirmed: Confirmed | None = None
    """The repeated measurements it was chosen on (one objective, launched more than once)."""
    rule: PickRule | None = None
    """The rule that picked it from the front (``pareto``)."""
    min_free_gib: float | None = None
    excluded: tuple[int, ...] = ()
    """Configurations (first launch numbers) that would rank above it but missed the ``min_free_gib`` bar."""

    @property
    def number(self) -> int:
        return self.record.number

    @property
    def value(self) -> float | None:
        return self.record.value

    @property
    def spread(self) -> float | None:
        """(max - min) / median of its launches' figure; None with one launch."""
        if self.confirmed is not None and self.confirmed.launches > 1:
            return self.confirmed.spread
        return None

    def why(self) -> str:
        """How it was chosen, in one phrase."""
        n = len(self.launches)
        if self.basis == "confirmed" and self.confirmed is not None:
            which = (f"the mean of the {self.confirmed.final} launches made after it was chosen"
                     if self.confirmed.final else "the median of its repeats")
            if self.confirmed.interval is not None:
                which += f" (90% interval ±{self.confirmed.interval:.1%})"
            return f"confirmed on {n} launches (spread {self.confirmed.spread:.1%}); the figure is {which}"
        if self.basis == "front":
            rule = self.rule.describe() if self.rule is not None else "knee"
            return f"picked from the Pareto front by {rule}; figures are medians over {n} launch(es)"
        return "the best single launch (not repeated: its figure is that launch's)"


def choose(trials: Sequence[TrialFacts], goal: Goal, *, min_free_gib: float | None = None,
           rule: PickRule | None = None) -> Choice | None:
    """The configuration servetune recommends from a study's records (:func:`~search.trial.records.records`),
    or None when no configuration qualifies yet. ``rule`` applies to a ``pareto`` study only."""
    if goal.pareto:
        return _from_front(trials, goal, rule or PickRule("knee"), min_free_gib)
    direction = StudyDirection.MAXIMIZE if goal.senses[0] == "maximize" else StudyDirection.MINIMIZE
    chosen = _single(trials, direction, min_free_gib)
    if chosen is None or min_free_gib is None:
        return chosen
    unbarred = _single(trials, direction, None)
    excluded = () if unbarred is None or unbarred.number == chosen.number else (unbarred.number,)
    return Choice(chosen.record, chosen.basis, chosen.launches, chosen.confirmed, None, min_free_gib, excluded)


def _clears(rec: TrialFacts | None, min_free_gib: float | None) -> bool:
    if min_free_gib is None:
        return True
    free = rec.free_after_capture_gib if rec is not None else None
    return free is not None and free >= min_free_gib


def _single(trials: Sequence[TrialFacts], direction: StudyDirection,
            min_free_gib: float | None) -> Choice | None:
    confirmed = confirmed_best(trials, direction)
    if confirmed is not None and confirmed.launches > 1:
        rec = next((t for t in trials if t.number == confirmed.trial), None)
        if rec is not None and _clears(rec, min_free_gib):
            return Choice(rec.model_copy(update={"value": confirmed.reported}), "confirmed",
                          tuple(launches_of(trials, rec.number)), confirmed, min_free_gib=min_free_gib)
    best = best_single_launch(trials, direction, min_free_gib=min_free_gib)
    if best is None:
        return None
    return Choice(best, "single launch", tuple(launches_of(trials, best.number)) or (best,),
                  min_free_gib=min_free_gib)


def _from_front(trials: Sequence[TrialFacts], goal: Goal, rule: PickRule,
                min_free_gib: float | None) -> Choice | None:
    by_number = {t.number: t for t in trials}
    kept = [t for t in trials if _clears(by_number.get(origin(t), t), min_free_gib)]
    rec = pick_record(kept, goal, rule)
    if rec is None:
        return None
    excluded: tuple[int, ...] = ()
    if min_free_gib is not None:
        unbarred = pick_record(trials, goal, rule)
        if unbarred is not None and unbarred.number != rec.number:
            excluded = (unbarred.number,)
    launches = tuple(launches_of(trials, rec.number)) or (rec,)
    return Choice(rec, "front", launches, None, rule, min_free_gib, excluded)


def best_single_launch(recs: Iterable[TrialFacts], direction: StudyDirection, *,
                min_free_gib: float | None = None) -> TrialFacts | None:
    """The best COMPLETE, feasible, measured trial of ``recs`` (a study's records) for the study's
    ``direction`` (optionally with at least ``min_free_gib`` after capture)."""
    direction_max = direction == StudyDirection.MAXIMIZE
    best: TrialFacts | None = None
    for rec in recs:
        if rec.state != TrialState.COMPLETE or rec.value is None or not rec.feasible or not rec.launched:
            continue
        if min_free_gib is not None and (rec.free_after_capture_gib is None
                                         or rec.free_after_capture_gib < min_free_gib):
            continue
        if best is None or best.value is None or (rec.value > best.value if direction_max
                                                  else rec.value < best.value):
            best = rec
    return best
