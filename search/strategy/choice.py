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

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Literal

from optuna.study import StudyDirection
from optuna.trial import TrialState

from search.strategy.confirm import CONFIRM_K, Confirmed, confirmed_best, forced_settings, launches_of, origin
from search.strategy.front import Goal, PickRule, front, pick_record
from search.trial.records import TrialFacts

__all__ = ["CHOICE_ATTR", "NO_CHOICE_YET", "SCREENING_RULE", "Basis", "Candidate", "Choice", "Reported", "TieBreak",
           "Verdict", "best_single_launch", "choose"]

Basis = Literal["confirmed", "single launch", "front"]

#: The study user attr that names servetune's choice in one line. optuna-dashboard lists a study's user
#: attributes in the order they were first set, five rows to a page, so the run sets it first (to
#: :data:`NO_CHOICE_YET`) and each publish replaces its value in place: it stays the table's first row.
CHOICE_ATTR = "servetune.choice"
#: The choice attr's value until a publish has a choice to name.
NO_CHOICE_YET = "none yet: no configuration has finished the benchmark"

#: The rule the screening and the choice follow, in one sentence (the report and the dashboard note show it).
SCREENING_RULE = (
    f"The screening repeats the {CONFIRM_K} configurations ranked best by the pooled estimate (each one's launch "
    "averaged with what every other launch says about its knobs, so one lucky draw does not take a slot), the "
    "last slot going to the plainest configuration within one run-to-run standard deviation of the leader; the "
    "choice is the best of those on its repeated launches, and among those the measurements cannot tell apart "
    "(within one standard error) the one that forces the fewest settings; a configuration that died or broke "
    "a limit on any launch is out.")


class Verdict(StrEnum):
    """Why a configuration is, or is not, servetune's choice (:attr:`Candidate.verdict`)."""

    CHOSEN = "chosen"
    LAUNCH_OF_CHOICE = "a launch of the choice"
    """Another launch of the chosen configuration (a repeat, a final launch, a reuse)."""
    REPEATED_LOWER = "repeated lower"
    WITHIN_NOISE = "within noise"
    ONE_LAUNCH = "one launch"
    DIED = "died on a launch"
    INFEASIBLE = "infeasible"
    BELOW_HEADROOM = "below the headroom bar"
    ON_FRONT = "on the front, not picked"
    OFF_FRONT = "off the front"


class TieBreak(StrEnum):
    """What decided between the choice and a configuration the measurements cannot tell apart."""

    PLAINER = "fewer forced settings"
    POOLED = "pooled estimate"


class Reported(StrEnum):
    """What the choice's figure is."""

    FINAL_MEAN = "mean of the final launches"
    REPEATS_MEDIAN = "median of the repeats"
    FRONT_MEDIANS = "medians over its launches"
    SINGLE_LAUNCH = "one launch"


@dataclass(frozen=True)
class Candidate:
    """One configuration the choice was made among, with its typed :attr:`verdict`."""

    first: TrialFacts
    """Its first launch (for :data:`Verdict.LAUNCH_OF_CHOICE`: the launch asked about)."""
    launches: tuple[TrialFacts, ...]
    verdict: Verdict
    screened: bool = False
    """The screening repeated it (a ``confirmation_of`` launch that is not a final one)."""
    tie_break: TieBreak | None = None
    """For :data:`Verdict.WITHIN_NOISE`: what put the choice ahead."""
    forced: tuple[int, int] | None = None
    """For :data:`TieBreak.PLAINER`: (its environment overrides, the choice's)."""

    @property
    def number(self) -> int:
        return self.first.number

    @property
    def chosen(self) -> bool:
        return self.verdict == Verdict.CHOSEN

    @property
    def values(self) -> list[float]:
        """Its COMPLETE launches' figures, by trial number."""
        return [float(t.value) for t in self.launches if t.state == TrialState.COMPLETE and t.value is not None]

    @property
    def died(self) -> list[TrialFacts]:
        """Its launches that did not finish the benchmark."""
        return [t for t in self.launches if t.state != TrialState.COMPLETE]

    @property
    def infeasible(self) -> list[TrialFacts]:
        """Its finished launches that broke a constraint (an SLO limit, the correctness gate)."""
        return [t for t in self.launches if t.state == TrialState.COMPLETE and not t.feasible]

    @property
    def median(self) -> float | None:
        values = self.values
        return statistics.median(values) if values else None

    @property
    def spread(self) -> float | None:
        """(max - min) / median of its launches' figures; None with fewer than two."""
        values, med = self.values, self.median
        if len(values) < 2 or not med:
            return None
        return (max(values) - min(values)) / med


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
    candidates: tuple[Candidate, ...] = ()
    """Every configuration the study launched, the chosen one first, each with its :class:`Verdict`."""

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

    @property
    def reported(self) -> Reported:
        """What :attr:`value` is."""
        if self.basis == "front":
            return Reported.FRONT_MEDIANS
        if self.basis == "confirmed" and self.confirmed is not None:
            return Reported.FINAL_MEAN if self.confirmed.final else Reported.REPEATS_MEDIAN
        return Reported.SINGLE_LAUNCH

    @property
    def chosen_on(self) -> float | None:
        """The figure it was ranked by: the median over the launches it was chosen on (the final ones left
        out); its value with one launch."""
        if self.confirmed is not None:
            return float(self.confirmed.median)
        return float(self.value) if self.value is not None else None

    def reported_text(self) -> str:
        """What its figure is, in a phrase (``mean of the 3 launches made after it was chosen``)."""
        confirmed = self.confirmed
        match self.reported:
            case Reported.FINAL_MEAN if confirmed is not None:
                return f"mean of the {confirmed.final} launches made after it was chosen"
            case Reported.REPEATS_MEDIAN if confirmed is not None:
                repeats = confirmed.launches - 1
                return f"median of its {repeats} repeats" if repeats > 1 else "its one repeat's figure"
            case Reported.FRONT_MEDIANS:
                return f"medians over its {len(self.launches)} launch(es)"
        return "one launch"

    def candidate(self, rec: TrialFacts) -> Candidate | None:
        """Why the trial ``rec`` (any launch) is or is not the choice: its configuration's :class:`Candidate`
        (:data:`Verdict.LAUNCH_OF_CHOICE` for another launch of the chosen one); None for a trial never
        launched."""
        if rec.number != self.number and origin(rec) == self.number:
            return Candidate(rec, self.launches, Verdict.LAUNCH_OF_CHOICE)
        return next((c for c in self.candidates if c.number == origin(rec)), None)

    def why(self) -> str:
        """How it was chosen, in one phrase."""
        n = len(self.launches)
        if self.basis == "confirmed" and self.confirmed is not None:
            which = self.reported_text()
            which = f"the {which}" if which.startswith(("mean", "median")) else which
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
    with every launched configuration's :class:`Verdict` (:attr:`Choice.candidates`), or None when no
    configuration qualifies yet. ``rule`` applies to a ``pareto`` study only."""
    if goal.pareto:
        chosen = _from_front(trials, goal, rule or PickRule("knee"), min_free_gib)
    else:
        direction = StudyDirection.MAXIMIZE if goal.senses[0] == "maximize" else StudyDirection.MINIMIZE
        chosen = _single(trials, direction, min_free_gib)
        if chosen is not None and min_free_gib is not None:
            unbarred = _single(trials, direction, None)
            excluded = () if unbarred is None or unbarred.number == chosen.number else (unbarred.number,)
            chosen = replace(chosen, excluded=excluded)
    if chosen is None:
        return None
    return replace(chosen, candidates=_candidates(trials, goal, chosen))


def _candidates(trials: Sequence[TrialFacts], goal: Goal, choice: Choice) -> tuple[Candidate, ...]:
    """Every configuration launched (by its first launch), the chosen one first, each with its verdict."""
    by_number = {t.number: t for t in trials}
    screened = {t.confirmation_of for t in trials if t.confirmation_of is not None and not t.final}
    on_front = {p.number for p in front(trials, goal)} if goal.pareto else set()
    sign = 1.0 if goal.senses[0] == "maximize" else -1.0
    their = choice.chosen_on
    plain_chosen = forced_settings(choice.record.params)
    out = [Candidate(choice.record, choice.launches, Verdict.CHOSEN, choice.number in screened)]
    numbers = sorted({origin(t) for t in trials if t.launched
                      and t.state in (TrialState.COMPLETE, TrialState.PRUNED)} - {choice.number})
    for number in numbers:
        first = by_number.get(number)
        if first is None:
            continue
        c = Candidate(first, tuple(launches_of(trials, number)) or (first,), Verdict.ONE_LAUNCH,
                      number in screened)
        if c.infeasible:
            verdict = Verdict.INFEASIBLE
        elif c.died:
            verdict = Verdict.DIED
        elif not _clears(first, choice.min_free_gib):
            verdict = Verdict.BELOW_HEADROOM
        elif goal.pareto:
            verdict = Verdict.ON_FRONT if number in on_front else Verdict.OFF_FRONT
        elif len(c.values) <= 1:
            verdict = Verdict.ONE_LAUNCH
        elif their is not None and c.median is not None and sign * (c.median - their) < 0:
            verdict = Verdict.REPEATED_LOWER
        else:
            plain_mine = forced_settings(first.params)
            if plain_chosen < plain_mine:
                c = replace(c, tie_break=TieBreak.PLAINER, forced=(plain_mine, plain_chosen))
            else:
                c = replace(c, tie_break=TieBreak.POOLED)
            verdict = Verdict.WITHIN_NOISE
        out.append(replace(c, verdict=verdict))
    return tuple(out)


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
