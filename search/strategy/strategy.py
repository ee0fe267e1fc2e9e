"""The order of the search, decided in one place: :meth:`Strategy.next` and :meth:`Strategy.gate`.

A study goes: the probe (SGLang's own memory arithmetic with twice its reserve) -> the start-up design (one
knob moved at a time, the memory knob placed by the memory model) -> the sampler (Optuna's TPE, the memory
margin and SLOs as constraints) until the search budget is spent -> the screening repeats of the best
configurations -> the final launches of the one chosen (:mod:`search.strategy.confirm`; a ``pareto`` study
repeats its front instead, :mod:`search.strategy.front`).

:meth:`Strategy.next` reads a :class:`~search.strategy.view.StudyView` and returns what to do as a value
(:class:`Enqueue`, :class:`Sample`, :class:`Wait`, :class:`Done`); the caller (the run loop, or the efficiency
benchmark) applies it. :meth:`Strategy.gate` is the per-trial half: the trial's configuration, whether the
memory model lets it launch, and the memory margin its launch showed.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import TrialState

from runners.checkpoint import CheckpointFacts
from runners.telemetry import FailureKind, Phase
from search._optuna_compat import was_enqueued
from search.strategy.confirm import (
    CONFIRM_FINAL,
    CONFIRM_K,
    CONFIRM_REPEATS,
    ConfirmLaunch,
    confirmation_plan,
    noise_sd,
)
from search.strategy.design import probe_params, start_point
from search.strategy.distributions import on_step, sample
from search.strategy.front import confirmation_plan as front_confirmation_plan
from search.strategy.memory import MARGIN_CONSTRAINT, MemoryModel, VllmMemoryModel
from search.strategy.view import StudyView
from search.strategy.warm import Prior, prior_records, warm_point
from search.trial.records import TrialFacts
from spaces.correctness import changes_numerics
from spaces.schema import UNSET, Space

__all__ = ["MAX_SKIPS_IN_A_ROW", "MAX_TRIALS_PER_LAUNCH", "Action", "Done", "Enqueue", "OnStep", "Sample",
           "Strategy", "TrialGate", "Wait", "apply", "make_sampler", "stop_bar"]

#: A study stops once it holds this many trials per launch of its budget (skips and reuses included).
MAX_TRIALS_PER_LAUNCH = 20
#: After this many skips in a row the next sampled configuration is launched whatever the model says
#: (a wrong model must not starve the search).
MAX_SKIPS_IN_A_ROW = 30

#: The Optuna constraint a configuration that breaks a space's constraint between knobs sets (positive: broken).
COUPLING_CONSTRAINT = "space_constraint"

#: The phase a skip is recorded at, for the need the memory model found short.
_SKIP_PHASE = {"kv_pool": Phase.KV_POOL, "cuda_graph": Phase.CUDA_GRAPH, "serve": Phase.SERVING,
               "eager": Phase.DECODE, "max_model_len": Phase.KV_POOL}


@dataclass(frozen=True)
class Enqueue:
    """Queue these params with these tags (``probe``, ``design``, ``confirmation_of``, ``final``), then ask."""

    params: dict[str, Any]
    tags: dict[str, Any]
    why: str


@dataclass(frozen=True)
class Sample:
    """Ask the sampler (Optuna pops a queued trial first)."""

    why: str = "the sampler proposes the next configuration"


@dataclass(frozen=True)
class Wait:
    """Nothing to start now: running trials hold the budget, or the choice waits for their figures."""

    why: str


@dataclass(frozen=True)
class Done:
    """The study is finished."""

    why: str


Action = Enqueue | Sample | Wait | Done


@dataclass
class Strategy:
    """servetune's search order for a study of ``space`` with a search budget of ``n_trials`` launches.

    ``gpu_mem_mib`` and ``engine_version`` are what the hosts' preflight found (the probe's memory
    arithmetic). ``memory_gate=False`` turns the memory model off (the benchmark's plain baselines).
    """

    space: Space
    n_trials: int | None
    confirm_k: int = CONFIRM_K
    confirm_repeats: int = CONFIRM_REPEATS
    confirm_final: int = CONFIRM_FINAL
    gpu_mem_mib: float | None = None
    engine_version: str | None = None
    checkpoint: CheckpointFacts | None = None
    """The model's checkpoint as the preflight read it (weights' size, config.json): the probe's arithmetic."""
    memory_gate: bool = True
    start_design: bool = True
    """Queue the probe and the start-up design (else the sampler starts at once)."""
    early_stop: bool = True
    """Give each search launch a stop bar (:func:`stop_bar`): a clear loser stops its benchmark early."""
    priors: Sequence[Prior] = ()
    """Earlier studies on the same host cards, model, engine version and fixed args (a warm start): their
    launches fit the memory model, their best configurations replace the probe and the design."""
    _dists: dict[str, Any] = field(default_factory=dict, init=False, repr=False)
    _prior: list[TrialFacts] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self._prior = prior_records(self.priors)

    def view(self, study: optuna.Study) -> StudyView:
        """One read of ``study`` as this strategy needs it."""
        return StudyView.of(study, space=self.space, prior=self._prior)

    def search_done(self, view: StudyView) -> bool:
        """The search proper has spent its budget (confirmations may still follow)."""
        return self.n_trials is not None and view.counts.search_done >= self.n_trials

    def next(self, view: StudyView) -> Action:
        """What to do next in the study ``view`` shows."""
        counts = view.counts
        if self.n_trials is not None:
            if counts.search_done >= self.n_trials:
                return self._confirmation(view)
            if counts.search_done + counts.search_running >= self.n_trials:
                return Wait(f"the budget of {self.n_trials} launches is held by running trials")
            if counts.total >= self.n_trials * MAX_TRIALS_PER_LAUNCH:
                return Done(f"{counts.total} trials for a budget of {self.n_trials}: the sampler keeps proposing "
                            "skips and measured configurations")
        if self.start_design and self.priors:
            model = view.memory_model if self.memory_gate else None
            if any(t.state == TrialState.WAITING for t in view.records):
                return Sample()
            warm = warm_point(self.space, view.records, model if isinstance(model, MemoryModel) else None,
                              self.priors)
            if warm is not None:
                return Enqueue(warm, {"design": True}, "a warm start from an earlier study's configuration")
            if view.records:
                return Sample()
        if self.start_design:
            model = view.memory_model if self.memory_gate else None
            point = start_point(self.space, view.records, model if isinstance(model, MemoryModel) else None,
                                gpu_mem_mib=self.gpu_mem_mib, version=self.engine_version,
                                checkpoint=self.checkpoint)
            if point is not None:
                params, tag = point
                return Enqueue(params, {tag: True}, f"the start-up {tag}")
        return Sample()

    def _confirmation(self, view: StudyView) -> Action:
        """The next confirmation launch, or Done (or Wait while running trials may change the plan)."""
        if view.goal.pareto:  # the front's configurations, each repeated; no single winner to launch finally
            plan = [ConfirmLaunch(origin, params) for origin, params in
                    front_confirmation_plan(view.records, view.goal, k=self.confirm_k,
                                            repeats=self.confirm_repeats)]
        else:
            plan = confirmation_plan(view.records, view.direction, k=self.confirm_k, repeats=self.confirm_repeats,
                                     final=self.confirm_final)
        if plan:
            step = plan[0]
            what = "final launch" if step.final else "screening repeat"
            return Enqueue(step.params, step.user_attrs, f"{what} of trial {step.origin}'s configuration")
        if any(t.state == TrialState.RUNNING for t in view.records):
            return Wait("the confirmation waits for running trials")
        return Done("the budget is spent and the choice confirmed")

    def gate(self, view: StudyView) -> TrialGate:
        """The per-trial half of the strategy, bound to ``view``'s memory model (fitted once per trial)."""
        model = view.memory_model if self.memory_gate else None
        return TrialGate(self, view, model)

    def sample(self, trial: optuna.Trial) -> dict[str, Any]:
        return sample(trial, self.space)

    def gate_reference(self) -> dict[str, Any]:
        """The correctness gate's reference configuration: the space's (``correctness.reference``), else the
        probe, the study's safe first launch, with every knob that can change numerics at the engine default,
        so its answers are the engine's own and its memory settings start (the engine's memory defaults may
        not: seed 003's host dies of SGLang's default ``--mem-fraction-static``)."""
        if self.space.correctness.reference:
            return dict(self.space.correctness.reference)
        probe = probe_params(self.space, self.gpu_mem_mib, self.engine_version)
        reset = {k: (UNSET if k.startswith(("nccl.", "env.")) else None) if changes_numerics(k) else v
                 for k, v in probe.items()}
        return self.space.knobs.active(reset)


def apply(study: optuna.Study, action: Action) -> optuna.Trial | None:
    """Carry out ``action`` on ``study``: queue its params (Enqueue) and ask, or ask (Sample); None for Wait and
    Done. The run loop calls it inside the study-wide lock."""
    if isinstance(action, Wait | Done):
        return None
    if isinstance(action, Enqueue):
        study.enqueue_trial(action.params, user_attrs=action.tags, skip_if_exists=False)
    return study.ask()


class TrialGate:
    """One trial's configuration and memory verdict (the objective's :class:`~search.trial.objective.Gate`)."""

    def __init__(self, strategy: Strategy, view: StudyView, model: MemoryModel | VllmMemoryModel | None) -> None:
        self.strategy = strategy
        self.view = view
        self.model = model

    def params(self, trial: optuna.Trial) -> dict[str, Any]:
        return self.strategy.sample(trial)

    def verdict(self, trial: optuna.Trial, params: dict[str, Any], facts: TrialFacts) -> None:
        """Skip (PRUNED ``predicted_oom``) a sampled configuration the model predicts dies, likely or for
        certain. A configuration someone queued (the probe, a retry, a repeat, a person's ``enqueue_trial``) is
        launched as asked; the start-up design's points are ours and the model may skip them."""
        if self.strategy.early_stop and facts.confirmation_of is None:
            facts.stop_bar = stop_bar(self.view)
        for constraint in self.strategy.space.knobs.parsed_constraints():
            if not constraint.holds(params):
                facts.outcome, facts.phase = FailureKind.CONSTRAINT, None
                facts.reason = f"breaks the space's constraint {constraint.text}"
                trial.set_constraint(COUPLING_CONSTRAINT, 1.0)
                raise optuna.TrialPruned(facts.reason)
        model = self.model
        if model is None or facts.confirmation_of is not None or (was_enqueued(trial) and not facts.design):
            return
        pred = model.predict_params(params)
        if pred is None:
            return
        facts.predicted_margin_gib = round(pred.margin_gib, 3)
        facts.predicted_sd_gib = round(pred.sd_gib, 3)
        facts.predicted_phase = pred.tightest
        facts.prediction_rests_on = list(pred.rests_on)
        if not pred.likely_death or self._skips_in_a_row() >= MAX_SKIPS_IN_A_ROW:
            return
        facts.outcome, facts.phase = FailureKind.PREDICTED_OOM, _SKIP_PHASE.get(pred.tightest)
        facts.reason = (f"predicted to die in {pred.tightest}: margin {pred.margin_gib:+.2f} GiB "
                        f"(sd {pred.sd_gib:.2f}), from trials {list(pred.rests_on)}")
        trial.set_constraint(MARGIN_CONSTRAINT, max(-pred.margin_gib, 0.01))
        raise optuna.TrialPruned(f"predicted OOM in {pred.tightest} (margin {pred.margin_gib:+.2f} GiB)")

    def measured(self, trial: optuna.Trial, params: dict[str, Any], facts: TrialFacts) -> None:
        """The launch's margin as the memory constraint: an OOM's deficit, else its predicted headroom."""
        if self.model is None:
            return
        margin = self.model.add_record(facts.model_copy(update={"number": trial.number, "params": params}))
        if margin is None:
            return
        facts.measured_margin_gib = round(margin, 3)
        trial.set_constraint(MARGIN_CONSTRAINT, -margin)

    def _skips_in_a_row(self) -> int:
        """How many of the study's latest finished trials in a row were predicted-OOM skips."""
        n = 0
        done = [r for r in self.view.records if r.state in (TrialState.PRUNED, TrialState.COMPLETE)]
        for past in sorted(done, key=lambda r: r.number, reverse=True):
            if not past.predicted_oom:
                break
            n += 1
        return n


#: The first requests' figure of a level differs from the whole level's beyond the run-to-run noise (the batch
#: fills, the first prefills): this share, one standard deviation.
FIRST_REQUESTS_SD = 0.03
#: The run-to-run noise assumed before the study has measured it (one sd, a share of the value).
DEFAULT_NOISE_SD = 0.05
#: How many standard deviations of the difference below the best a first-requests figure must be to stop.
STOP_Z = 2.5


def stop_bar(view: StudyView) -> float | None:
    """The figure at the target level under which a launch's first requests show it cannot beat the study's best
    (maximised single objectives only; None before a launch has a value): the best finished search launch less
    ``STOP_Z`` standard deviations of a first-requests figure (the run-to-run noise measured from the study's
    repeats, else :data:`DEFAULT_NOISE_SD`, with :data:`FIRST_REQUESTS_SD`)."""
    if view.goal.pareto or view.direction != optuna.study.StudyDirection.MAXIMIZE:
        return None
    values = [float(t.value) for t in view.records if t.state == TrialState.COMPLETE and t.value is not None
              and t.feasible and t.launched and not t.stopped_early]
    if not values:
        return None
    sd = noise_sd(view.records) or DEFAULT_NOISE_SD
    return max(values) * (1 - STOP_Z * math.sqrt(sd * sd + FIRST_REQUESTS_SD ** 2))


def make_sampler(seed: int | None, n_trials: int | None, *, conditional: bool = False) -> optuna.samplers.BaseSampler:
    """servetune's sampler: Optuna's TPE, which learns the feasible region from the trials' constraints
    (the memory margin, the SLOs, the correctness gate), over fewer random start-up trials than launches. The same
    sampler serves a ``pareto`` study: TPE is multi-objective (MOTPE) when the study has several directions. A
    space with conditional knobs (``when``) gets TPE's ``group=True``: the trials that searched the same knobs
    are modelled together, so a knob is learnt only from the trials that had it."""
    with warnings.catch_warnings():
        # group=True is marked experimental by Optuna (a warning at construction); it is the documented way
        # to sample define-by-run conditional spaces with multivariate TPE.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return OnStep(optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(5, max(1, (n_trials or 10) // 4)),
                                                 multivariate=True, group=conditional))


class OnStep(optuna.samplers.BaseSampler):
    """A sampler whose float values are the knob's own decimals (:func:`~search.strategy.distributions.on_step`).

    Optuna stores what the sampler returns, and its samplers compute a stepped value as ``low + k * step`` in
    binary floating point (``0.6900000000000001``); the stored param is what optuna-dashboard, MLflow, the
    report and the exported script show, so it is rounded here, before Optuna stores it, and every output
    agrees. Everything else is the wrapped sampler's."""

    def __init__(self, sampler: optuna.samplers.BaseSampler) -> None:
        self.sampler = sampler

    def infer_relative_search_space(self, study: optuna.Study, trial: optuna.trial.FrozenTrial
                                    ) -> dict[str, optuna.distributions.BaseDistribution]:
        return self.sampler.infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: optuna.trial.FrozenTrial,
                        search_space: dict[str, optuna.distributions.BaseDistribution]) -> dict[str, Any]:
        values = self.sampler.sample_relative(study, trial, search_space)
        return {name: _on_step(value, search_space.get(name)) for name, value in values.items()}

    def sample_independent(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, param_name: str,
                           param_distribution: optuna.distributions.BaseDistribution) -> Any:
        value = self.sampler.sample_independent(study, trial, param_name, param_distribution)
        return _on_step(value, param_distribution)

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self.sampler.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self.sampler.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.sampler.reseed_rng()


def _on_step(value: Any, dist: optuna.distributions.BaseDistribution | None) -> Any:
    if isinstance(dist, optuna.distributions.FloatDistribution) and isinstance(value, float):
        return on_step(value, dist)
    return value
