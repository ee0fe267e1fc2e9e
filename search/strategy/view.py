"""One read of a study, and what servetune derives from it: :class:`StudyView`.

A view is built once per strategy step, trial callback or publish (:meth:`StudyView.of`: one read of the
trials) and handed to whatever needs the study: the strategy's next step, the report, HTML, figures, MLflow,
status, the run summary and the dashboard notes. What it derives (the choice, the front, the counts, the
memory model) is computed on first use and then shared, so every output shows the same answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import optuna
from optuna.study import StudyDirection
from optuna.trial import TrialState

from search.strategy.choice import Choice, choose
from search.strategy.confirm import launches_of, search_launches
from search.strategy.front import Goal, Point, front
from search.strategy.memory import MemoryModel, VllmMemoryModel, study_model
from search.trial.records import TrialFacts, records
from spaces.schema import Space

__all__ = ["Counts", "StudyView", "fingerprint"]


def fingerprint(trials: Sequence[Any]) -> tuple[tuple[int, TrialState], ...]:
    """What a study's trials are, for telling whether a view is still current: each one's number and state."""
    return tuple((t.number, t.state) for t in trials)


@dataclass(frozen=True)
class Counts:
    """A study's trials counted the way a person reads a search."""

    search_done: int
    """Finished trials of the search proper that hold a budget slot (launches and reuses)."""
    search_running: int
    launches: int
    """Finished launches (servers started), confirmations included."""
    confirmations: int
    """Finished confirmation launches (repeats of a configuration)."""
    skips: int
    """Configurations not launched: predicted to die of OOM."""
    reused: int
    """Configurations asked again and answered from an earlier launch."""
    ooms: int
    """Launches that died of OOM."""
    failed: int
    """Trials that ended FAIL (infrastructure trouble)."""
    running: int
    waiting: int
    total: int


@dataclass
class StudyView:
    """The study's records with its goal (and, for the strategy, its space); see the module docstring."""

    study: optuna.Study
    records: list[TrialFacts]
    goal: Goal
    space: Space | None = None
    prior: list[TrialFacts] = field(default_factory=list)
    """Earlier studies' launches a warm start fits the memory model on too (``search.strategy.warm``)."""
    _by_number: dict[int, TrialFacts] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._by_number = {r.number: r for r in self.records}

    @classmethod
    def of(cls, study: optuna.Study, *, space: Space | None = None,
           prior: Sequence[TrialFacts] = ()) -> StudyView:
        """Read ``study`` once. ``space`` (the strategy's) gives the memory model its workload; ``prior``: earlier
        studies' launches for it (a warm start)."""
        return cls(study, records(study), Goal.of(study), space, list(prior))

    @property
    def name(self) -> str:
        return self.study.study_name

    @property
    def reference_seconds(self) -> float | None:
        """What asking the correctness gate's reference configuration cost (s), when a launch was made for it."""
        stored = self.study.user_attrs.get("servetune.correctness_reference")
        value = stored.get("seconds") if isinstance(stored, dict) else None
        return float(value) if isinstance(value, int | float) else None

    @property
    def direction(self) -> StudyDirection:
        """The direction of the study's (first) objective."""
        return StudyDirection.MAXIMIZE if self.goal.senses[0] == "maximize" else StudyDirection.MINIMIZE

    @property
    def n_trials(self) -> int | None:
        """The search budget the latest run set (None when no run set one)."""
        value = self.study.user_attrs.get("n_trials")
        return int(value) if isinstance(value, int) else None

    @cached_property
    def fingerprint(self) -> tuple[tuple[int, TrialState], ...]:
        return fingerprint(self.records)

    def record(self, number: int) -> TrialFacts | None:
        return self._by_number.get(number)

    def launches_of(self, number: int) -> list[TrialFacts]:
        """Every finished launch of the configuration first launched as trial ``number``."""
        return launches_of(self.records, number)

    @cached_property
    def choice(self) -> Choice | None:
        """What servetune recommends now (:func:`~search.strategy.choice.choose`), or None."""
        return choose(self.records, self.goal)

    @cached_property
    def front(self) -> list[Point]:
        """A ``pareto`` study's front of configurations (empty for one objective)."""
        return front(self.records, self.goal) if self.goal.pareto else []

    @cached_property
    def counts(self) -> Counts:
        done, running = search_launches(self.records)
        finished = (TrialState.COMPLETE, TrialState.PRUNED)
        ended = [r for r in self.records if r.state in finished]
        return Counts(
            search_done=done, search_running=running,
            launches=sum(1 for r in ended if r.launched),
            confirmations=sum(1 for r in ended if r.confirmation_of is not None and r.launched),
            skips=sum(1 for r in ended if r.predicted_oom),
            reused=sum(1 for r in ended if r.duplicate_of is not None),
            ooms=sum(1 for r in ended if r.oom),
            failed=sum(1 for r in self.records if r.state == TrialState.FAIL),
            running=sum(1 for r in self.records if r.state == TrialState.RUNNING),
            waiting=sum(1 for r in self.records if r.state == TrialState.WAITING),
            total=len(self.records),
        )

    @cached_property
    def memory_model(self) -> MemoryModel | VllmMemoryModel | None:
        """The memory model fitted to the study's finished launches (None without the strategy's space)."""
        return study_model(self.space, [*self.prior, *self.records]) if self.space is not None else None
