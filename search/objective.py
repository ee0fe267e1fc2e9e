"""The Optuna objective: sample, launch, wait, sweep, record, stop — and map the outcome to a trial state.

* success returns the objective (the metric at the target concurrency level; a ``pareto`` trial: its
  metrics there, one value each); each level's throughput is also reported as an intermediate value (step =
  concurrency), for the levels that finished only (a trial that died at a level reports nothing there, never
  a 0), but in a ``pareto`` study, where Optuna keeps none;
* a config-caused death (OOM anywhere, an illegal NCCL combination, a flag the engine rejects, a crash)
  records its telemetry and raises :class:`optuna.TrialPruned` -> PRUNED;
* infrastructure trouble (host unreachable, timeouts, a GPU busy with a foreign process, interruption)
  records its reason and raises :class:`TrialFailed` -> FAIL, so the sampler learns no false lesson;
* a configuration already measured (COMPLETE or PRUNED) is not run again: its result is reused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.artifacts import upload_artifact
from optuna.trial import TrialState

from runners.engines import Engine, engine_for
from runners.engines.common import flag_value
from runners.engines.script import render
from runners.errors import RunnerError, ServetuneError
from runners.host import HostInfo
from runners.server import BenchPlan, BenchResult, ServerSession, merge_smi_peak
from runners.telemetry import Failure, FailureKind, Phase, kind_of_error
from search._optuna_compat import ArtifactStore, known_params, was_enqueued
from search.evaluate import Evaluator, level_order
from search.hosts import preflight
from search.memory import MARGIN_CONSTRAINT, MemoryModel, VllmMemoryModel, batch_tokens
from search.pool import HostSlot
from search.records import LevelResult, RateStepFacts, TrialFacts, note_waiting, records, write_facts
from search.sampling import normal_params, sample
from search.slo import find_max_rate
from search.study import fail_stale
from search.workload import bench_plan, run_files
from spaces.launch import LaunchConfig
from spaces.schema import Space

#: A host whose last server stopped less than this many seconds ago may still be releasing GPU memory.
RELEASE_WINDOW_S = 30.0

#: After this many skips in a row the next sampled configuration is launched whatever the model says
#: (a wrong model must not starve the search).
MAX_SKIPS_IN_A_ROW = 30

#: The phase a skip is recorded at, for the need the memory model found short.
_SKIP_PHASE = {"kv_pool": Phase.KV_POOL, "cuda_graph": Phase.CUDA_GRAPH, "serve": Phase.SERVING,
               "eager": Phase.DECODE, "max_model_len": Phase.KV_POOL}


def workload_batch_tokens(space: Space) -> int | None:
    """:func:`search.memory.batch_tokens` of the space's workload."""
    wl = space.workload
    return batch_tokens(space.target_level, None if wl.dataset else wl.input_len,
                        wl.prefix.len if wl.prefix is not None else 0)


def vllm_fixed(space: Space) -> dict[str, float]:
    """The vLLM memory settings a space fixes rather than searches: ``--max-model-len`` and
    ``--gpu-memory-utilization`` in ``fixed_args``, ``VLLM_CPU_KVCACHE_SPACE`` in ``env``."""
    given = {"max_model_len": flag_value(space.fixed_args, "--max-model-len"),
             "gpu_memory_utilization": flag_value(space.fixed_args, "--gpu-memory-utilization"),
             "kv_cache_space_gib": (space.env or {}).get("VLLM_CPU_KVCACHE_SPACE")}
    out: dict[str, float] = {}
    for key, value in given.items():
        if value is not None:
            with contextlib.suppress(ValueError):
                out[key] = float(value)
    return out

ProgressHook = Callable[[int, str, Any], None]
"""``hook(trial_number, kind, value)``: kinds ``host``, ``phase``, ``level``, ``outcome``."""


class TrialFailed(ServetuneError):
    """Raised out of the objective for infrastructure trouble: Optuna records the trial as FAIL."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(f"{failure.kind.value}: {failure.reason}")
        self.failure = failure


@dataclass
class TrialEnv:
    """Everything a trial needs besides the trial itself."""

    space: Space
    study_name: str
    artifacts_dir: Path
    artifact_store: ArtifactStore | None = None
    hook: ProgressHook | None = None
    abort: threading.Event = field(default_factory=threading.Event)
    smi_interval: float = 1.0
    preflight_cache: dict[str, HostInfo] = field(default_factory=dict)
    artifacts_error: str = ""
    """Set when a trial's files could not be written (a full disk): the run stops before the next trial."""


class Objective:
    """The objective bound to a :class:`TrialEnv`: :meth:`run` runs a trial on a host the caller holds.

    A trial goes: sample -> reuse a measured twin -> the memory model's verdict (a configuration it
    predicts dies, likely or for certain, is not launched: PRUNED ``predicted_oom``) -> the evaluator (by default
    this objective's own server launch; :mod:`search.evaluate`) -> the margin as an Optuna constraint.
    Confirmations (``confirmation_of``) and the probe skip the reuse and the verdict.
    """

    def __init__(self, env: TrialEnv, evaluator: Evaluator | None = None, *, memory_gate: bool = True) -> None:
        self.env = env
        self.evaluator: Evaluator = evaluator or _ServerEvaluator(self)
        self.memory_gate = memory_gate

    def run(self, trial: optuna.Trial, slot: HostSlot | None) -> float | list[float]:
        """Run the trial on a host the caller holds (and gives back): its value, or a ``pareto`` trial's
        values (one per metric)."""
        env = self.env
        params = sample(trial, env.space)
        facts = TrialFacts.for_trial(trial)
        try:
            return self._evaluate(trial, params, slot, facts)
        finally:
            # The one write of the trial's record, however it ended.
            write_facts(trial, facts)

    def _evaluate(self, trial: optuna.Trial, params: dict[str, Any], slot: HostSlot | None,
                  facts: TrialFacts) -> float | list[float]:
        env = self.env
        repeat = facts.confirmation_of is not None
        # A configuration someone queued (the probe, a retry, a person's enqueue_trial) is launched as
        # asked; the start-up design's points are ours and the model may skip them.
        queued = was_enqueued(trial) and not facts.design
        if not repeat:
            reused = _reuse(trial, params, facts, abort=env.abort)
            if reused is not None:
                return reused
        launch = LaunchConfig.from_params(env.space, params)
        facts.engine = launch.engine
        facts.objective_metric = env.space.objective.scored_by
        if env.space.objective.kind == "pareto":
            facts.objective_metrics = env.space.objective.metric_names
        facts.objective_level = env.space.target_level
        model = self._model(trial) if self.memory_gate else None
        if model is not None and not repeat and not queued:
            self._verdict(trial, params, model, facts)
        try:
            value = self.evaluator.evaluate(trial, launch, slot, facts)
        except optuna.TrialPruned:
            self._measured(trial, params, model, facts)
            raise
        self._measured(trial, params, model, facts)
        return value

    # ---- the memory model ----------------------------------------------------------------------

    def _model(self, trial: optuna.Trial) -> MemoryModel | VllmMemoryModel | None:
        """The study's memory model, refitted from every finished trial (so a launch that contradicts a
        prediction counts at once): SGLang's arithmetic for SGLang and the simulated host, vLLM's start-up
        checks for vLLM."""
        space = self.env.space
        past = [TrialFacts.from_trial(t) for t in
                trial.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))]
        if space.engine.kind == "vllm":
            return VllmMemoryModel.from_trials(past, vllm_fixed(space))
        if space.engine.kind not in ("sglang", "sim"):
            return None
        return MemoryModel.from_trials(past, target=space.target_level, batch_tokens=workload_batch_tokens(space))

    def _verdict(self, trial: optuna.Trial, params: dict[str, Any], model: MemoryModel | VllmMemoryModel,
                 facts: TrialFacts) -> None:
        pred = model.predict_params(params)
        if pred is None:
            return
        facts.predicted_margin_gib = round(pred.margin_gib, 3)
        facts.predicted_sd_gib = round(pred.sd_gib, 3)
        facts.predicted_phase = pred.tightest
        facts.prediction_rests_on = list(pred.rests_on)
        if not pred.likely_death or _skips_in_a_row(trial) >= MAX_SKIPS_IN_A_ROW:
            return
        facts.outcome, facts.phase = FailureKind.PREDICTED_OOM, _SKIP_PHASE.get(pred.tightest)
        facts.reason = (f"predicted to die in {pred.tightest}: margin {pred.margin_gib:+.2f} GiB "
                        f"(sd {pred.sd_gib:.2f}), from trials {list(pred.rests_on)}")
        trial.set_constraint(MARGIN_CONSTRAINT, max(-pred.margin_gib, 0.01))
        self._emit(trial, "outcome", FailureKind.PREDICTED_OOM.value)
        raise optuna.TrialPruned(f"predicted OOM in {pred.tightest} (margin {pred.margin_gib:+.2f} GiB)")

    def _measured(self, trial: optuna.Trial, params: dict[str, Any], model: MemoryModel | VllmMemoryModel | None,
                  facts: TrialFacts) -> None:
        """The launch's margin as the memory constraint: an OOM's deficit, else its predicted headroom."""
        if model is None:
            return
        margin = model.add_record(facts.model_copy(update={"number": trial.number, "params": params}))
        if margin is None:
            return
        facts.measured_margin_gib = round(margin, 3)
        trial.set_constraint(MARGIN_CONSTRAINT, -margin)

    # ------------------------------------------------------------------------------------------

    def _emit(self, trial: optuna.Trial, kind: str, value: Any) -> None:
        if self.env.hook is not None:
            self.env.hook(trial.number, kind, value)

    def _preflight(self, slot: HostSlot, engine: Engine) -> HostInfo:
        """Stop orphans, check the host is reachable, the engine present and the GPUs free."""
        env = self.env
        host = slot.host
        orphans = host.cleanup_orphans(grace=env.space.budget.stop_grace)
        cached = env.preflight_cache.get(host.name)
        if cached is None:
            info = preflight(host, env.space, engine)
            env.preflight_cache[host.name] = info
        else:
            # Engine and python do not change between trials; the GPUs do.
            gpus, apps = host.gpu_state() if env.space.engine.device == "gpu" else ([], [])
            info = HostInfo(cached.name, cached.python, cached.engine, cached.engine_version, gpus, apps)
            host.judge_busy(info)
        if info.busy and (orphans or time.monotonic() - slot.last_server_stop < RELEASE_WINDOW_S):
            # A server of ours stopped a moment ago may still be releasing memory: give it a moment.
            # (Otherwise the memory is a foreign process's, and waiting would only delay the FAIL.)
            try:
                host.wait_gpus_free(timeout=10)
                info.busy, info.reason = False, ""
            except RunnerError:
                pass
        host.require_free(info)
        return info

    def _run(self, trial: optuna.Trial, launch: LaunchConfig, slot: HostSlot | None,
             facts: TrialFacts) -> float | list[float]:
        assert slot is not None, "a server launch needs a host"
        env = self.env
        space = env.space
        # What the host's inventory entry overrides: the port the server binds, the engine's python.
        host_overrides = {"port": slot.host.launch_port(), "python": slot.host.python}
        launch = launch.model_copy(update={k: v for k, v in host_overrides.items() if v is not None})
        facts.launch_config = launch.model_dump(mode="json")
        self._emit(trial, "host", slot.name)
        facts.host = slot.name
        engine = engine_for(launch)  # resolved once per trial and passed on
        try:
            info = self._preflight(slot, engine)
        except RunnerError as exc:
            self._fail(trial, facts, Failure(kind_of_error(exc), None, str(exc)))
        version = space.engine.version or info.engine_version
        facts.engine_version = version
        facts.gpu_name = info.gpu_name
        facts.gpu_count = len(info.gpus)
        header = [f"servetune trial {trial.number} of study {env.study_name}"]
        rendered = render(engine, launch, version, header=header)
        script = rendered.script
        facts.argv = list(rendered.argv)
        facts.env = dict(rendered.env)
        run_id = f"{env.study_name}-{trial.number}-{uuid.uuid4().hex[:8]}"
        run_dir = slot.host.run_dir(env.study_name, str(trial.number))
        facts.run_id = run_id

        def hook(kind: str, value: Any) -> None:
            if kind == "phase":
                self._emit(trial, "phase", value.value if isinstance(value, Phase) else value)
            elif kind == "level":
                self._emit(trial, "level", value)

        session = ServerSession(
            slot.host, engine, launch, script=script, run_dir=run_dir, run_id=run_id,
            python=launch.python, stop_grace=space.budget.stop_grace,
            smi_interval=env.smi_interval if space.engine.device == "gpu" else 0.0, hook=hook,
            memory_limit_bytes=space.memory_limit_bytes, files=run_files(space),
        )
        failure: Failure | None = None
        levels: list[dict[str, Any]] = []
        started = time.monotonic()
        try:
            session.start()  # HostBusy when another program holds the port: nothing is started
        except RunnerError as exc:
            self._fail(trial, facts, Failure(kind_of_error(exc), Phase.STARTING, str(exc)))
        try:
            failure = self._wait_ready(session)
            facts.startup_s = round(time.monotonic() - started, 3)
            if failure is None:
                self._emit(trial, "phase", "benchmarking")
                bench_started = time.monotonic()
                if space.objective.kind == "max_rate_under_slo":
                    bench = self._rate_search(session, engine.bench_api, launch.model_path, facts)
                else:
                    plan = _fail_fast(bench_plan(space, api=engine.bench_api, model=launch.model_path),
                                      space.target_level)
                    bench = self._benchmark(session, plan)
                facts.bench_s = round(time.monotonic() - bench_started, 3)
                levels, failure = bench.levels, bench.failure
        finally:
            try:
                stop = session.stop()
                slot.last_server_stop = time.monotonic()
                if stop is not None:
                    facts.stop_method = stop.method
                    facts.stop_s = round(stop.seconds, 3)
            except RunnerError as exc:
                facts.stop_error = str(exc)
            self._record(trial, facts, session, levels, script)
        if failure is None:
            return self._complete(trial, facts)
        if failure.kind.config_caused:
            self._prune(trial, facts, failure)
        self._fail(trial, facts, failure)
        raise AssertionError("unreachable")

    def _wait_ready(self, session: ServerSession) -> Failure | None:
        space = self.env.space
        deadline = time.monotonic() + space.budget.startup_timeout
        while True:
            if self.env.abort.is_set():
                return Failure(FailureKind.INTERRUPTED, session.parser.phase, "interrupted")
            left = deadline - time.monotonic()
            failure = session.wait_ready(min(left, 1.0)) if left > 0 else session.wait_ready(0)
            if failure is None:
                return None
            if failure.kind != FailureKind.STARTUP_TIMEOUT or left <= 1.0:
                if failure.kind == FailureKind.STARTUP_TIMEOUT:
                    return Failure(FailureKind.STARTUP_TIMEOUT, failure.phase,
                                   f"not ready after {space.budget.startup_timeout:g}s "
                                   f"(last phase: {session.parser.phase.value})")
                return failure

    def _benchmark(self, session: ServerSession, plan: BenchPlan) -> BenchResult:
        # The abort event is honoured by running the sweep in a thread and stopping the server.
        result: dict[str, Any] = {}

        def run() -> None:
            result["bench"] = session.benchmark(plan, timeout=self.env.space.budget.benchmark_timeout)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        while t.is_alive():
            t.join(timeout=0.1)
            if self.env.abort.is_set():
                session.stop()
                t.join(timeout=10)
                bench = result.get("bench")
                levels = bench.levels if bench else []
                return BenchResult(levels, Failure(FailureKind.INTERRUPTED, session.parser.phase, "interrupted"))
        return result["bench"]

    def _rate_search(self, session: ServerSession, api: str, model: str, facts: TrialFacts) -> BenchResult:
        """``max_rate_under_slo``: the highest request rate (Poisson arrivals, at most the target level in
        flight) at which the SLO holds, by :func:`search.slo.find_max_rate`; every step is one load generator
        run at one rate, kept as a level of the trial. A death ends the search (the trial is then PRUNED)."""
        space = self.env.space
        plan_of = space.objective.rate_search
        out = BenchResult()

        def measure(rate: float) -> Mapping[str, Any]:
            if out.failure is not None:  # the server died: no rate holds any more
                return {"completed": 0, "failed": plan_of.requests}
            plan = bench_plan(space, api=api, model=model, levels=(space.target_level,),
                              requests=(plan_of.requests,), request_rate=rate,
                              warmup=space.workload.warmup_requests if not out.levels else 0)
            bench = self._benchmark(session, plan)
            out.levels.extend(bench.levels)
            out.failure = bench.failure
            return bench.levels[-1] if bench.levels else {"completed": 0, "failed": plan_of.requests}

        found = find_max_rate(measure, space.objective.slo, plan_of)
        facts.slo_rate = found.rate
        facts.slo_rate_steps = len(found.steps)
        facts.slo_rate_search = [RateStepFacts(rate=s.rate, holds=s.holds, violations=list(s.violations))
                                 for s in found.steps]
        facts.slo_limits = dict(space.objective.slo.limits())
        return out

    # ---- recording -----------------------------------------------------------------------------

    def _record(self, trial: optuna.Trial, facts: TrialFacts, session: ServerSession,
                levels: list[dict[str, Any]], script: str) -> None:
        env = self.env
        memory = merge_smi_peak(session)
        facts.simulated = bool(memory.pop("simulated", False))
        facts.memory = {k: v for k, v in memory.items() if isinstance(v, int | float | str | bool)}
        facts.levels = [LevelResult.model_validate(level) for level in levels]
        finished = [lv for lv in facts.levels if lv.served]
        facts.level_reached = max((lv.max_concurrency for lv in finished), default=0)
        # Only the levels that finished are reported: a level the server died in has no throughput to
        # report, and a 0 there would read as a measurement in Optuna's history and intermediate plots.
        rate_search = self.env.space.objective.kind == "max_rate_under_slo"
        # Optuna keeps intermediate values for single-objective studies only (``Trial.report`` raises in a
        # multi-objective one): a pareto trial's levels are in its record alone.
        reported = [] if self.env.space.objective.kind == "pareto" else facts.levels
        for i, lv in enumerate(reported, start=1):
            if lv.served and lv.output_throughput is not None:
                # A rate search measures one level at several rates: its steps are numbered.
                trial.report(float(lv.output_throughput), step=i if rate_search else lv.max_concurrency)
        facts.log_tail = session.log_tail(60)
        if session.exit_code is not None:
            facts.exit_code = session.exit_code
        out = env.artifacts_dir / env.study_name / str(trial.number)
        files = {
            "server.log": session.log_text(),
            "launch.sh": script,
            "bench.json": json.dumps(levels, indent=2),
            "nvidia-smi.csv": session.smi_csv(),
        }
        # NOTE: the trial's figures are already in the study storage; a full (or read-only) artifacts disk
        # must not turn its outcome into an error. It is noted on the trial and the run stops after it.
        try:
            out.mkdir(parents=True, exist_ok=True)
            for name, text in files.items():
                (out / name).write_text(text)
            facts.artifacts_dir = str(out)
            if env.artifact_store is not None:
                ids = {}
                for name in files:
                    mimetype = "text/plain" if not name.endswith(".json") else "application/json"
                    ids[name] = upload_artifact(artifact_store=env.artifact_store, file_path=str(out / name),
                                                study_or_trial=trial, mimetype=mimetype, encoding="utf-8")
                facts.artifact_ids = ids
        except OSError as exc:
            where = exc.filename or out
            env.artifacts_error = f"{where}: {exc.strerror or exc}"
            facts.artifacts_error = env.artifacts_error

    def _complete(self, trial: optuna.Trial, facts: TrialFacts) -> float | list[float]:
        space = self.env.space
        if space.objective.kind == "max_rate_under_slo":
            return self._complete_rate(trial, facts)
        target = space.target_level
        names = space.objective.metric_names
        row = next((lv for lv in facts.levels if lv.max_concurrency == target), None)
        missing = [m for m in names if row is None or row.figure(m) is None]
        if missing:
            self._fail(trial, facts, Failure(FailureKind.INFRA, Phase.SERVING,
                                             f"no {missing[0]} at concurrency {target}"
                                             if row is not None else f"no result at concurrency {target}"))
        assert row is not None
        slo = space.objective.slo
        if slo.p99_ttft_ms is not None:
            trial.set_constraint("p99_ttft_ms", float(row.p99_ttft_ms or 0) - slo.p99_ttft_ms)
        if slo.p99_tpot_ms is not None:
            trial.set_constraint("p99_tpot_ms", float(row.p99_tpot_ms or 0) - slo.p99_tpot_ms)
        facts.outcome, facts.phase, facts.reason = "ok", None, ""
        self._emit(trial, "outcome", "ok")
        values = [float(row.figure(m)) for m in names]
        return values if space.objective.kind == "pareto" else values[0]

    def _complete_rate(self, trial: optuna.Trial, facts: TrialFacts) -> float:
        """The rate found (or the output throughput measured at it); a configuration that holds the SLO at
        no rate in range scores 0 and is infeasible, so it is never the best."""
        objective = self.env.space.objective
        rate = facts.slo_rate
        trial.set_constraint("slo_rate", 0.0 if rate is not None else 1.0)
        facts.outcome, facts.phase, facts.reason = "ok", None, ""
        self._emit(trial, "outcome", "ok")
        if rate is None:
            facts.reason = f"no rate from {objective.rate_search.low:g} req/s up holds the SLO"
            return 0.0
        if objective.rate_search.result == "rate":
            return float(rate)
        at = next(lv for lv in reversed(facts.levels) if lv.request_rate == rate and lv.served)
        return float(at.output_throughput or 0.0)

    def _set_failure(self, trial: optuna.Trial, facts: TrialFacts, failure: Failure) -> None:
        facts.outcome, facts.phase, facts.reason = failure.kind, failure.phase, failure.reason
        if failure.exit_code is not None:
            facts.exit_code = failure.exit_code
        if failure.kind == FailureKind.OOM and failure.phase is not None:
            facts.memory = {**facts.memory, "oom_phase": failure.phase.value}
        self._emit(trial, "outcome", failure.kind.value)

    def _prune(self, trial: optuna.Trial, facts: TrialFacts, failure: Failure) -> None:
        self._set_failure(trial, facts, failure)
        raise optuna.TrialPruned(f"{failure.kind.value} in {failure.phase.value if failure.phase else '?'}: "
                                 f"{failure.reason}")

    def _fail(self, trial: optuna.Trial, facts: TrialFacts, failure: Failure) -> None:
        self._set_failure(trial, facts, failure)
        raise TrialFailed(failure)


class _ServerEvaluator:
    """The real evaluator: launch the server on the host, wait, sweep, stop (:meth:`Objective._run`)."""

    def __init__(self, objective: Objective) -> None:
        self._objective = objective

    def evaluate(self, trial: optuna.Trial, launch: LaunchConfig, slot: HostSlot | None,
                 facts: TrialFacts) -> float | list[float]:
        return self._objective._run(trial, launch, slot, facts)


def _fail_fast(plan: BenchPlan, target: int) -> BenchPlan:
    """The plan with its levels in fail-fast order (target first), each with its request count."""
    per_level = dict(zip(plan.levels, plan.requests, strict=True))
    order = level_order(plan.levels, target)
    return dataclasses.replace(plan, levels=order, requests=tuple(per_level[c] for c in order))


def _skips_in_a_row(trial: optuna.Trial) -> int:
    """How many of the study's latest finished trials in a row were predicted-OOM skips."""
    n = 0
    done = [r for r in records(trial.study) if r.state in (TrialState.PRUNED, TrialState.COMPLETE)]
    for past in sorted(done, key=lambda r: r.number, reverse=True):
        if not past.predicted_oom:
            break
        n += 1
    return n


def _reuse(trial: optuna.Trial, params: dict[str, Any], facts: TrialFacts, *,
           abort: threading.Event | None = None, poll: float = 0.5) -> float | list[float] | None:
    """If these params were already measured (COMPLETE or PRUNED), reuse that result instead of rerunning:
    ``facts`` become the measured trial's (with ``duplicate_of``).

    A trial with the same params that is still RUNNING under a lower number (another host or controller
    got there first) is waited for, so that a configuration is never run twice at once; if it ends FAIL
    (infrastructure trouble), this trial runs the configuration itself.
    """
    study = trial.study
    params = normal_params(params)
    while True:
        for past in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
            if past.number == trial.number or normal_params(past.params) != params:
                continue
            measured = TrialFacts.from_trial(past)
            if measured.predicted_oom:
                continue  # a prediction, not a measurement: the model may have learnt better since
            origin = measured.duplicate_of if measured.duplicate_of is not None else past.number
            for name in TrialFacts.model_fields:
                if name not in _NOT_REUSED:
                    setattr(facts, name, getattr(measured, name))
            facts.duplicate_of = origin
            if past.state == TrialState.COMPLETE:
                for key, value in past.constraints.items():
                    trial.set_constraint(key, value)
                assert past.values
                return float(past.values[0]) if len(past.values) == 1 else [float(v) for v in past.values]
            raise optuna.TrialPruned(f"same configuration as trial {origin}: {measured.label}")
        # A twin whose controller died must not be waited for forever: fail it once it is stale
        # (its configuration is then re-queued), as the budget reservation does.
        fail_stale(study)
        # A twin that was queued and has not sampled yet counts by its queued params.
        twins = [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                 if t.number < trial.number and normal_params(known_params(t)) == params]
        if not twins:
            return None
        if abort is not None and abort.is_set():
            facts.outcome, facts.phase, facts.reason = FailureKind.INTERRUPTED, None, "interrupted"
            raise TrialFailed(Failure(FailureKind.INTERRUPTED, None, "interrupted"))
        note_waiting(trial, twins[0])
        time.sleep(poll)


#: What a reused trial does not take over from the trial it repeats: Optuna's own facts (its number,
#: state, params, times...), where it came from, and the measured trial's artifact ids.
_NOT_REUSED = frozenset(
    {name for name, f in TrialFacts.model_fields.items() if f.exclude}
    | {"duplicate_of", "artifact_ids", "probe", "design", "confirmation_of", "final"}
)
