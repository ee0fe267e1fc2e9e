"""A trial's facts: one typed record, written once by the objective and read back by everything else.

:class:`TrialFacts` is the only way servetune stores and reads what a trial did. The objective builds one
while a trial runs and writes it with :func:`write_facts` when the trial ends; MLflow tracking, the dashboard
notes, the report, ``status``, ``export``, the live progress, ``trials --json`` and the reuse of a measured
configuration read it with :meth:`TrialFacts.from_trial`. No other module reads a trial's raw user attrs.

How it is stored (JSON values):

========================  ==================================================================================
``servetune.facts``       a trial *system* attr (optuna-dashboard does not show those): the whole record
                          (:meth:`TrialFacts.stored`): outcome, phase, reason, host/GPU/engine, the frozen
                          launch config, argv/env, memory telemetry, levels, the objective... Studies written
                          before 0.3 hold it as a user attr of that name; :meth:`TrialFacts.from_trial` reads
                          both (a user attr would be a 9,000-px row of the dashboard's attribute table)
``host``                  user attr: where the trial runs: written when the trial is created for a host (so a
                          RUNNING trial names it), and again with the record
``outcome``, ``phase``,   short user attrs shown by optuna-dashboard's attribute table (the record holds them
``reason``, ``role``,     too; ``reason`` cut to :data:`SHORT_REASON` characters there)
``duplicate_of``
``retried_from``          written by Optuna's stale-trial retry onto the re-queued trial
``waiting_for``           while a trial waits for a twin that another host is running
``probe``, ``design``,    tags set when the trial is queued (``enqueue_trial(user_attrs=...)``): the study's
``confirmation_of``,      first launch, a start-up design point, a repeat of that trial's configuration (a
``final``                 ``final`` one once that configuration was chosen)
========================  ==================================================================================

Studies stored by servetune 0.1.0 hold the same facts as ~38 separate user attrs (``mem.<figure>``,
``levels``, ``launch_config``...); :meth:`TrialFacts.from_trial` reads those as well.

Adding a fact: add an optional field with a default to :class:`TrialFacts` (or :class:`LevelResult`);
older trials read back with the default.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, ClassVar, Final, Literal

import optuna
from optuna.trial import FrozenTrial, TrialState
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from runners.errors import validation_line
from runners.telemetry import FailureKind, MemoryFigures, Phase, Telemetry
from search._optuna_compat import known_params, set_trial_system_attr, set_trial_user_attr
from search.storage import RECORD_ATTR
from spaces.launch import LaunchConfig

__all__ = [
    "CORRECTNESS_CONSTRAINT",
    "DEPLOY_ATTR",
    "FACTS_ATTR",
    "FLOAT_DIGITS",
    "OK",
    "QUEUED_TAGS",
    "ROLES",
    "CorrectnessFacts",
    "LevelResult",
    "MemoryFacts",
    "Outcome",
    "RankFacts",
    "RateStepFacts",
    "Role",
    "TrialFacts",
    "WrongAnswer",
    "facts_attrs",
    "mark_interrupted",
    "normal_params",
    "note_host",
    "note_waiting",
    "noted_host",
    "records",
    "value_text",
    "write_facts",
]

#: The trial system attr that holds the whole record (a user attr of that name in older studies).
FACTS_ATTR = RECORD_ATTR
#: The study's user attr with the space's ``deploy`` section (what ``export --engine`` serves with).
DEPLOY_ATTR = "servetune.deploy"
#: The study's user attr that says, in one line, what a simulated host's profile is calibrated to.
SIM_CALIBRATION_ATTR = "servetune.sim_calibration"
#: The user attrs optuna-dashboard shows in its table besides the record (written from it).
DASHBOARD_ATTRS = ("host", "outcome", "phase", "reason", "duplicate_of")
#: How much of the reason the dashboard's attribute table shows (the record keeps all of it).
SHORT_REASON = 200
#: Prefix of the memory figures in studies of servetune 0.1.0 (``mem.free_after_capture_gib``...); also the
#: prefix of their MLflow metric names.
MEM_PREFIX = "mem."

#: Sampled floats are rounded to this many decimals, so that ``0.6100000000000001`` is ``0.61``.
FLOAT_DIGITS = 6

Outcome = FailureKind | Literal["ok"]
"""How a trial ended: :data:`OK` or a :class:`~runners.telemetry.FailureKind`."""
#: The outcome of a trial whose server served (every other outcome is a :class:`~runners.telemetry.FailureKind`).
OK: Final = "ok"

Role = Literal["probe", "design", "search", "screening", "final", "skipped"]
"""Why a trial was run (:attr:`TrialFacts.role`)."""
#: Each role in the words of a table's legend.
ROLES: dict[str, str] = {
    "probe": "the study's first launch, at the safe end of the memory knobs",
    "design": "a start-up design point: one knob moved from the probe",
    "search": "proposed by the sampler",
    "screening": "a repeat of one of the best configurations, to choose among them on more than one launch",
    "final": "a launch of the chosen configuration made after it was chosen: its figure is what is reported",
    "skipped": "not launched: the memory model predicted an OOM",
}


class LevelResult(BaseModel):
    """One concurrency level of the load generator's sweep, with sglang.bench_serving's metric names.

    Its fields are exactly the keys ``runners/loadgen.py`` emits (``loadgen.RECORD_KEYS``; a test ties the
    two). The fields marked ``exclude`` describe the request (backend, prompt count and lengths) and are not
    stored with the trial; a level stores the keys it was given (:meth:`stored`), so a figure that was
    never measured stays absent rather than becoming null.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    backend: str | None = Field(default=None, exclude=True)
    max_concurrency: int
    num_prompts: int | None = Field(default=None, exclude=True)
    random_input_len: int | None = Field(default=None, exclude=True)
    random_output_len: int | None = Field(default=None, exclude=True)
    duration: float | None = None
    completed: int | None = None
    failed: int | None = None
    total_input_tokens: int | None = None
    total_output_tokens: int | None = None
    request_throughput: float | None = None
    input_throughput: float | None = None
    output_throughput: float | None = None
    total_throughput: float | None = None
    mean_e2e_latency_ms: float | None = None
    median_e2e_latency_ms: float | None = None
    p99_e2e_latency_ms: float | None = None
    mean_ttft_ms: float | None = None
    median_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    mean_tpot_ms: float | None = None
    median_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    mean_itl_ms: float | None = None
    median_itl_ms: float | None = None
    p99_itl_ms: float | None = None
    concurrency: float | None = Field(default=None, exclude=True)
    errors: list[str] | None = None
    simulated: bool | None = None
    time_scale: float | None = None
    clock: str | None = None
    """Whose clock timed the level: ``simulated`` (a simulated host's own clock, independent of the machine's
    load) or ``wall`` (this machine's, times ``time_scale``)."""
    dataset_name: str | None = None
    """The workload's shape: ``random``, ``sharegpt`` or ``generated-shared-prefix``."""
    random_range_ratio: float | None = None
    request_rate: float | None = None
    """Requests per second of an open loop (Poisson arrivals); None for a closed loop."""
    burstiness: float | None = None
    seed: int | None = None
    """The load generator's seed: the same seed gives the same requests and arrival schedule."""

    #: The columns of a level table (report, dashboard notes): field, label.
    TABLE: ClassVar[tuple[tuple[str, str], ...]] = (
        ("max_concurrency", "concurrency"),
        ("output_throughput", "output tok/s"),
        ("request_throughput", "req/s"),
        ("mean_ttft_ms", "mean TTFT ms"),
        ("p99_ttft_ms", "p99 TTFT ms"),
        ("mean_tpot_ms", "mean TPOT ms"),
        ("p99_tpot_ms", "p99 TPOT ms"),
        ("completed", "completed"),
        ("failed", "failed"),
    )
    #: The figures of a level's line in an exported script's header: field, format.
    HEADLINE: ClassVar[tuple[tuple[str, str], ...]] = (
        ("output_throughput", "output {:.1f} tok/s"),
        ("request_throughput", "{:.2f} req/s"),
        ("mean_ttft_ms", "TTFT mean {:.1f} ms"),
        ("p99_ttft_ms", "p99 {:.1f} ms"),
        ("mean_tpot_ms", "TPOT mean {:.2f} ms"),
        ("p99_tpot_ms", "p99 {:.2f} ms"),
    )

    def stored(self) -> dict[str, Any]:
        """The level as stored with a trial: the fields it was given, request-description fields left out."""
        return self.model_dump(mode="json", exclude_unset=True)

    def figure(self, name: str) -> Any:
        """The value of field ``name`` if it was given (None otherwise)."""
        return getattr(self, name) if name in self.model_fields_set else None

    @property
    def served(self) -> bool:
        """Every request of the level completed (at least one did, none failed)."""
        return (self.completed or 0) > 0 and not self.failed


class RateStepFacts(BaseModel):
    """One step of a ``max_rate_under_slo`` trial's rate search: the rate measured, whether every SLO limit
    held there, and which did not (e.g. ``p99_ttft_ms 2310 > 2000``). Its figures are the level of
    :attr:`TrialFacts.levels` with this ``request_rate``."""

    model_config = ConfigDict(extra="ignore")

    rate: float
    holds: bool
    violations: list[str] = Field(default_factory=list)


class MemoryFacts(MemoryFigures):
    """A trial's memory telemetry: the figures its server's log and nvidia-smi showed
    (:class:`~runners.telemetry.MemoryFigures`, the one schema), None where not seen. An engine's own figures
    beyond these (``swa_tokens``, ``kv_mode``...) are kept as extras (:meth:`figure` reads either)."""

    model_config = ConfigDict(extra="allow")

    def figures(self) -> dict[str, Any]:
        """Every figure that was seen, named ones first, then the engine's extras."""
        return {k: v for k, v in {**self.model_dump(), **(self.model_extra or {})}.items() if v is not None}

    def figure(self, name: str) -> Any:
        """The figure ``name`` (a named field or an engine's extra), None when not seen."""
        if name in type(self).model_fields:
            return getattr(self, name)
        return (self.model_extra or {}).get(name)

    def number(self, name: str) -> float | None:
        """:meth:`figure` as a float when it is a number."""
        value = self.figure(name)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    def merged(self, figures: Mapping[str, Any]) -> MemoryFacts:
        """These figures with ``figures`` added (a None leaves a figure as it is)."""
        return MemoryFacts.model_validate({**self.figures(), **{k: v for k, v in figures.items() if v is not None}})

    def __bool__(self) -> bool:
        return bool(self.figures())


class RankFacts(BaseModel):
    """One rank (node) of a server spanning nodes: where it ran, how it ended, its memory ladder."""

    model_config = ConfigDict(extra="ignore")

    rank: int
    host: str
    outcome: Outcome | None = None
    """How this rank ended (None: it lived until servetune stopped it)."""
    phase: Phase | None = None
    reason: str = ""
    exit_code: int | None = None
    memory: MemoryFacts = Field(default_factory=MemoryFacts)


#: The Optuna constraint the correctness gate sets (positive: below the space's threshold, infeasible).
CORRECTNESS_CONSTRAINT = "correctness"


class WrongAnswer(BaseModel):
    """A prompt the configuration answered differently from the reference (or wrongly, against ``expected``)."""

    model_config = ConfigDict(extra="ignore")

    index: int
    prompt: str
    reference: str
    got: str
    diverged_at: int | None = None
    """The first token that differs (None: the answers agree, but the expected answer is missed)."""
    expected: str | None = None


class CorrectnessFacts(BaseModel):
    """What the gate found for one configuration (stored with its trial)."""

    model_config = ConfigDict(extra="ignore")

    passed: bool
    agreement: float | None = None
    logprob_gap: float | None = None
    accuracy: float | None = None
    prompts: int = 0
    wrong: list[WrongAnswer] = Field(default_factory=list)
    seconds: float | None = None
    """What asking the prompts cost this configuration (wall clock)."""
    reference: str = "engine defaults"
    reason: str = ""
    """Why it failed, in one line ("" when it passed)."""
    same_as_reference: bool = False
    """The configuration renders the reference's launch: its answers are the reference."""
    from_trial: int | None = None
    """The answers were checked on this trial's launch of the same configuration (a repeat is not asked again)."""

    @property
    def constraint(self) -> float:
        """The Optuna constraint value: <= 0 passed, > 0 infeasible."""
        return 0.0 if self.passed else 1.0


class TrialFacts(BaseModel):
    """What servetune knows about one trial.

    The fields under "Optuna's" come from the trial itself (number, state, value, params, times,
    constraints) and are never stored by servetune; the rest is the record the objective writes.
    """

    model_config = ConfigDict(extra="ignore", validate_assignment=True)

    # ---- Optuna's -----------------------------------------------------------------------------------
    number: int = Field(default=-1, exclude=True)
    state: TrialState = Field(default=TrialState.RUNNING, exclude=True)
    value: float | None = Field(default=None, exclude=True)
    """A COMPLETE trial's objective value; in a multi-objective (``pareto``) study its first metric's value."""
    values: list[float] | None = Field(default=None, exclude=True)
    """A COMPLETE trial's values in a multi-objective (``pareto``) study, one per metric; None otherwise."""
    params: dict[str, Any] = Field(default_factory=dict, exclude=True)
    feasible: bool = Field(default=True, exclude=True)
    datetime_start: datetime | None = Field(default=None, exclude=True)
    datetime_complete: datetime | None = Field(default=None, exclude=True)
    retried_from: int | None = Field(default=None, exclude=True)
    """Set when this trial re-runs a stale one (written by Optuna's retry, :mod:`search.storage`)."""
    waiting_for: int | None = Field(default=None, exclude=True)

    # ---- the record ---------------------------------------------------------------------------------
    outcome: Outcome | None = None
    """None while the trial runs (or when it ended before the objective said how)."""
    phase: Phase | None = None
    reason: str = ""
    exit_code: int | None = None
    host: str | None = None
    controller: str | None = None
    """The controller that ran the trial (its lease on the host guards the trial's server)."""
    gpu_name: str | None = None
    gpu_count: int | None = None
    engine: str | None = None
    engine_version: str | None = None
    simulated: bool = False
    launch_config: LaunchConfig | None = None
    """The frozen launch config the trial ran (``export`` renders from it)."""
    launch_config_error: str | None = Field(default=None, exclude=True)
    """Why a stored launch config did not validate (it then reads as None; ``export`` says this)."""
    argv: list[str] | None = None
    env: dict[str, str] | None = None
    run_id: str | None = None
    memory: MemoryFacts = Field(default_factory=MemoryFacts)
    """Memory telemetry (:class:`~runners.telemetry.Telemetry` figures that were seen, and engine extras)."""
    levels: list[LevelResult] = Field(default_factory=list)
    level_reached: int | None = None
    """Highest concurrency level served in full (0 if none; None when the server never ran)."""
    log_tail: str | None = None
    objective_metric: str | None = None
    objective_metrics: list[str] | None = None
    """``pareto``: the metrics the trial's :attr:`values` are, in order (``objective_metric`` is the first)."""
    objective_level: int | None = None
    slo_rate: float | None = None
    """``max_rate_under_slo``: the highest request rate (req/s) at which the SLO held; None when none did."""
    slo_rate_steps: int | None = None
    """How many rates the search measured (each is one of :attr:`levels`, with its ``request_rate``)."""
    slo_rate_search: list[RateStepFacts] = Field(default_factory=list)
    """The rate search's steps in the order they were measured."""
    slo_limits: dict[str, float] | None = None
    """The SLO limits the rate search held the server to (``p99_ttft_ms``, ``p99_tpot_ms``, ``error_rate``)."""

    def rate_step_levels(self) -> list[tuple[RateStepFacts, LevelResult | None]]:
        """Each rate-search step with its measurement (the level at that request rate; None when the server
        had died before it)."""
        by_rate = {lv.request_rate: lv for lv in self.levels if lv.request_rate is not None}
        return [(step, by_rate.get(step.rate)) for step in self.slo_rate_search]
    duplicate_of: int | None = None
    """Set when the configuration was already measured by that trial and its result reused."""
    nodes: int = 1
    """The nodes the server spanned (one rank per node)."""
    ranks: list[RankFacts] = Field(default_factory=list)
    """A server spanning nodes: each rank's host, end and memory ladder (rank 0 first); empty on one node."""
    died_first: int | None = None
    """A server spanning nodes that died: the rank that died first (the verdict is its death)."""
    queue_s: float | None = None
    """Seconds the trial's job waited in a cluster's queue before it ran (Slurm); not part of ``startup_s``."""
    startup_s: float | None = None
    bench_s: float | None = None
    stop_method: str | None = None
    stop_s: float | None = None
    stop_error: str | None = None
    artifacts_dir: str | None = None
    artifact_ids: dict[str, str] | None = None
    artifacts_error: str | None = None
    """Why the trial's files could not be written (its result is recorded all the same)."""

    # ---- the memory-aware search (search.strategy.memory, search.strategy.confirm) --------------------------
    probe: bool = False
    """The study's first launch, at the safe end of the memory knobs (tag set when it was queued)."""
    design: bool = False
    """A start-up design point (one knob moved from the probe; tag set when it was queued)."""
    confirmation_of: int | None = None
    """This launch repeats the configuration first launched as that trial (tag set when it was queued)."""
    final: bool = False
    """A confirmation launch of the configuration already chosen (with ``confirmation_of``): made after the
    choice, so its figure is what is reported, free of the luck that won the choice."""
    predicted_margin_gib: float | None = None
    """The memory model's margin for the configuration before it was launched (negative: a deficit)."""
    predicted_sd_gib: float | None = None
    predicted_phase: str | None = None
    """The phase the predicted margin is taken at (kv_pool, cuda_graph, serve, eager)."""
    prediction_rests_on: list[int] = Field(default_factory=list)
    """The trials whose memory figures the prediction uses."""
    measured_margin_gib: float | None = None
    """The margin the launch showed (an OOM's deficit, else the headroom the model gives it)."""

    # ---- the correctness gate, cost and energy ----------------------------------------------------------
    correctness: CorrectnessFacts | None = None
    """The gate's verdict on the configuration's answers (None: the gate is off, or the server never served)."""
    power_w: float | None = None
    """Mean ``power.draw`` (W, all the server's GPUs) over the target level's load window."""
    energy_per_token_j: float | None = None
    """Joules per output token at the target level: :attr:`power_w` / output throughput."""
    cost_per_mtok: float | None = None
    """Price per million output tokens at the target level, from the host's price per GPU-hour."""
    price_per_gpu_hour: float | None = None
    """The host's price per GPU-hour (the inventory's), as the trial used it."""
    sim_seconds: float | None = None
    """Simulated GPU seconds of a launch evaluated in-process (the efficiency benchmark)."""
    stop_bar: float | None = None
    """The figure at the target level below which the launch's first requests show it cannot beat the study's
    best (the best less a bound from the noise; ``search.strategy.strategy.EarlyStop``): an evaluator that reads
    the first requests' figure stops the benchmark there."""
    stopped_early: str | None = None
    """Why the benchmark stopped after the target level's first requests (its value is their figure)."""

    # ---- reading ------------------------------------------------------------------------------------

    @classmethod
    def from_trial(cls, trial: FrozenTrial) -> TrialFacts:
        """The trial's record (stored by this release or by servetune 0.1.0) with Optuna's own facts."""
        attrs = trial.user_attrs
        stored = trial.system_attrs.get(FACTS_ATTR)
        if not isinstance(stored, Mapping):  # a study written before the record moved to a system attr
            stored = attrs.get(FACTS_ATTR)
        data = dict(stored) if isinstance(stored, Mapping) else _legacy(attrs)
        for key in ("host", "controller"):  # a RUNNING trial: only who runs it is written yet
            if data.get(key) is None and attrs.get(key) is not None:
                data[key] = attrs[key]
        for key in ("outcome", "reason"):  # a RUNNING trial marked interrupted by a recovering controller
            if data.get(key) in (None, "") and attrs.get(key) not in (None, ""):
                data[key] = attrs[key]
        data.update(_queued_tags(attrs, data))
        data.update(
            number=trial.number,
            state=trial.state,
            **_values(trial),
            params=normal_params(known_params(trial)),  # a queued trial not yet sampled: its queued params
            feasible=all(float(v) <= 0 for v in trial.constraints.values()),
            datetime_start=trial.datetime_start,
            datetime_complete=trial.datetime_complete,
            retried_from=attrs.get("retried_from"),
            waiting_for=attrs.get("waiting_for"),
        )
        return cls.model_validate(data)

    @classmethod
    def for_trial(cls, trial: optuna.Trial) -> TrialFacts:
        """A new record for a live trial, with the tags it was queued with (``probe``, ``design``,
        ``confirmation_of``): what the objective starts from."""
        return cls.model_validate(_queued_tags(trial.user_attrs, {}))

    def stored(self) -> dict[str, Any]:
        """The record as written to the trial (JSON-friendly; Optuna's own fields left out; memory figures and
        level figures only where seen)."""
        data = self.model_dump(mode="json", exclude={"levels", "memory"})
        data["memory"] = self.memory.figures()
        data["levels"] = [lv.stored() for lv in self.levels]
        return data

    @model_validator(mode="before")
    @classmethod
    def _tolerate_a_stale_launch_config(cls, data: Any) -> Any:
        """A stored launch config that no longer validates reads as None with the reason kept (the rest of the
        record still reads; ``export`` says why it cannot render it)."""
        if isinstance(data, Mapping) and isinstance(data.get("launch_config"), Mapping):
            try:
                LaunchConfig.model_validate(data["launch_config"])
            except ValidationError as exc:
                where, msg = validation_line(exc)
                data = {**data, "launch_config": None, "launch_config_error": f"{where or 'launch_config'}: {msg}"}
        return data

    # ---- derived ------------------------------------------------------------------------------------

    @property
    def label(self) -> str:
        """The outcome as people read it: ``ok``, a failure kind, or the state's name for a trial the
        objective said nothing about (``running``, ``pruned``, ``fail``...)."""
        if self.outcome is not None:
            return str(self.outcome)
        return {TrialState.COMPLETE: "ok"}.get(self.state, self.state.name.lower())

    @property
    def oom(self) -> bool:
        return self.outcome == FailureKind.OOM

    @property
    def role(self) -> Role:
        """Why the trial was run (:data:`ROLES`): from the tags it was queued with, else ``search``."""
        if self.predicted_oom:
            return "skipped"
        if self.confirmation_of is not None:
            return "final" if self.final else "screening"
        if self.probe:
            return "probe"
        return "design" if self.design else "search"

    @property
    def predicted_oom(self) -> bool:
        """Not launched: skipped because the memory model predicts an OOM."""
        return self.outcome == FailureKind.PREDICTED_OOM

    @property
    def launched(self) -> bool:
        """A server was (or is being) launched for it: not a predicted-OOM skip, not a configuration that broke
        the space's constraints, not a reused duplicate. Only such a trial measured anything."""
        return not self.predicted_oom and self.outcome != FailureKind.CONSTRAINT and self.duplicate_of is None

    @property
    def ok(self) -> bool:
        return self.outcome == OK or (self.outcome is None and self.state == TrialState.COMPLETE)

    @property
    def oom_phase(self) -> str | None:
        """Where it ran out of memory (the stored figure, else the phase of an OOM outcome)."""
        stored = self.memory.oom_phase
        return stored if stored else (self.phase.value if self.oom and self.phase else None)

    @property
    def free_after_capture_gib(self) -> float | None:
        return self.memory.free_after_capture_gib

    @property
    def telemetry(self) -> Telemetry:
        """The memory figures as :class:`~runners.telemetry.Telemetry` (unknown names in ``extra``)."""
        tele = Telemetry()
        tele.merge(self.memory.figures())
        tele.simulated = self.simulated
        return tele

    @property
    def duration_s(self) -> float | None:
        if self.datetime_complete is None or self.datetime_start is None:
            return None
        return (self.datetime_complete - self.datetime_start).total_seconds()

    def knob_value(self, name: str) -> Any:
        """The value knob ``name`` had in this trial: as the engine resolved it (its logged figure, e.g. SGLang's
        own default for a knob left ``unset``), else as launched, else as sampled (``unset`` included); None when
        the trial never had it. The OOM map, the report's boundary and the memory model all read it here."""
        launch = self.launch_config
        launched: Any = None
        if launch is not None:
            launched = launch.env.get(name.removeprefix("nccl.")) if name.startswith("nccl.") \
                else launch.knobs.get(name)
        for value in (self.memory.figure(name), launched, self.params.get(name)):
            if value is not None:
                return value
        return None

    def knob(self, names: Iterable[str]) -> tuple[str, Any] | None:
        """The first of ``names`` that had a value in this trial (:meth:`knob_value`), with that value."""
        for name in names:
            value = self.knob_value(name)
            if value is not None:
                return name, value
        return None

    def summary(self) -> dict[str, Any]:
        """A JSON-friendly row for ``servetune trials --json`` (with ``values`` after ``value`` for a trial of a
        multi-objective study only, so the rows of other studies read as they always have)."""
        row = {
            "number": self.number,
            "state": self.state.name,
            "outcome": self.label,
            "phase": self.phase.value if self.phase else None,
            "value": self.value,
            "feasible": self.feasible,
            "params": self.params,
            "host": self.host,
            "free_after_capture_gib": self.free_after_capture_gib,
            "tried_to_allocate_gib": self.memory.tried_to_allocate_gib,
            "free_at_oom_gib": self.memory.free_at_oom_gib,
            "max_total_num_tokens": self.memory.max_total_num_tokens,
            "level_reached": self.level_reached,
            "reason": self.reason,
            "simulated": self.simulated,
            "duration_s": self.duration_s,
        }
        if self.values is None:
            return row
        out: dict[str, Any] = {}
        for key, value in row.items():
            out[key] = value
            if key == "value":
                out["values"] = self.values
        return out


# ---- writing -------------------------------------------------------------------------------------


def facts_attrs(facts: TrialFacts, tags: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(user attrs, system attrs)`` that store ``facts``: the whole record as a system attr, which
    optuna-dashboard does not show, and a few short fields for its attribute table. ``tags``: the trial's
    user attrs so far (the tags it was queued with say its role)."""
    stored = facts.stored()
    user = {key: stored[key] for key in DASHBOARD_ATTRS if stored.get(key) is not None}
    if isinstance(user.get("reason"), str) and len(user["reason"]) > SHORT_REASON:
        user["reason"] = user["reason"][:SHORT_REASON - 1] + "…"
    if facts.outcome is not None:
        user["role"] = facts.model_copy(update=_queued_tags(tags or {}, {})).role
    return user, {FACTS_ATTR: stored}


def write_facts(trial: optuna.Trial, facts: TrialFacts) -> None:
    """Store the record with the trial (once, when the trial ends), and the attrs the dashboard shows."""
    user, system = facts_attrs(facts, trial.user_attrs)
    for key, value in system.items():
        set_trial_system_attr(trial, key, value)
    for key, value in user.items():
        trial.set_user_attr(key, value)


def note_host(trial: optuna.Trial, host: str) -> None:
    """Say, while the trial runs, which host runs it (a recovering controller looks for its own)."""
    trial.set_user_attr("host", host)


def noted_host(trial: FrozenTrial) -> str | None:
    """The host :func:`note_host` named for the trial (None: the trial never named one)."""
    host = trial.user_attrs.get("host")
    return host if isinstance(host, str) else None


def note_controller(trial: optuna.Trial, controller: str) -> None:
    """Say, while the trial runs, which controller runs it (another controller leaves its server alone while
    that controller's lease lives)."""
    trial.set_user_attr("controller", controller)


def note_waiting(trial: optuna.Trial, twin: int) -> None:
    """Say, while the trial waits, which running twin it waits for."""
    trial.set_user_attr("waiting_for", twin)


def mark_interrupted(study: optuna.Study, trial: FrozenTrial, reason: str) -> None:
    """Mark a RUNNING trial of a controller that died: outcome ``interrupted`` with ``reason``.

    Raises :class:`optuna.exceptions.UpdateFinishedTrialError` when it has finished meanwhile.
    """
    set_trial_user_attr(study, trial, "outcome", FailureKind.INTERRUPTED.value)
    set_trial_user_attr(study, trial, "reason", reason)


def normal_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Params with floats rounded to :data:`FLOAT_DIGITS`, so that a stored trial's ``0.6100000000000001`` and
    a sampled ``0.61`` are the same configuration."""
    return {k: round(v, FLOAT_DIGITS) if isinstance(v, float) else v for k, v in params.items()}


# ---- reading many --------------------------------------------------------------------------------


def records(study: optuna.Study) -> list[TrialFacts]:
    """Every trial of the study as :class:`TrialFacts`, by number."""
    return [TrialFacts.from_trial(t) for t in study.get_trials(deepcopy=False)]


def _values(trial: FrozenTrial) -> dict[str, Any]:
    """``value`` (and for a multi-objective trial ``values``) of a COMPLETE trial; Optuna's ``trial.value``
    raises for a trial with several values."""
    values = trial.values if trial.state == TrialState.COMPLETE else None
    if not values:
        return {"value": None, "values": None}
    if len(values) == 1:
        return {"value": values[0], "values": None}
    return {"value": values[0], "values": list(values)}


def value_text(rec: TrialFacts, fmt: str = "{:.1f}") -> str:
    """A trial's value for a table cell: its value, or a pareto trial's values joined by `` / ``; ``-``
    when it has none."""
    if rec.values is not None:
        return " / ".join(fmt.format(v) for v in rec.values)
    return fmt.format(rec.value) if rec.value is not None else "-"


#: Tags a trial is queued with (``study.enqueue_trial(params, user_attrs=...)``), read back into the record.
QUEUED_TAGS = ("probe", "design", "confirmation_of", "final")


def _queued_tags(attrs: Mapping[str, Any], data: Mapping[str, Any]) -> dict[str, Any]:
    """The queued tags in ``attrs`` that ``data`` (a record) does not already hold."""
    return {key: attrs[key] for key in QUEUED_TAGS if attrs.get(key) is not None and not data.get(key)}


# ---- servetune 0.1.0 ------------------------------------------------------------------------------

#: User attrs of servetune 0.1.0 that map one to one onto a field of the record.
_LEGACY_FIELDS = (
    "outcome", "phase", "reason", "exit_code", "host", "gpu_name", "gpu_count", "engine", "engine_version",
    "simulated", "launch_config", "argv", "env", "run_id", "levels", "level_reached", "log_tail",
    "objective_metric", "objective_level", "duplicate_of", "startup_s", "bench_s", "stop_method", "stop_s",
    "stop_error", "artifacts_dir", "artifact_ids",
    # the memory-aware search's facts, for studies stored by its first version
    "predicted_margin_gib", "predicted_sd_gib", "predicted_phase", "prediction_rests_on", "measured_margin_gib",
    "sim_seconds",
)


def _legacy(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The record of a trial stored by servetune 0.1.0 (one user attr per fact, ``mem.*`` figures)."""
    data = {key: attrs[key] for key in _LEGACY_FIELDS if key in attrs}
    if data.get("outcome") == "":
        data["outcome"] = None
    data["memory"] = {k.removeprefix(MEM_PREFIX): v for k, v in attrs.items() if k.startswith(MEM_PREFIX)}
    return data
