"""The Optuna objective: sample, launch, wait, sweep, record, stop — and map the outcome to a trial state.

* success returns the objective (the metric at the target concurrency level); each level's throughput is
  also reported as an intermediate value (step = concurrency);
* a config-caused death (OOM anywhere, an illegal NCCL combination, a flag the engine rejects, a crash)
  records its telemetry and raises :class:`optuna.TrialPruned` -> PRUNED;
* infrastructure trouble (host unreachable, timeouts, a GPU busy with a foreign process, interruption)
  records its reason and raises :class:`TrialFailed` -> FAIL, so the sampler learns no false lesson;
* a configuration already measured (COMPLETE or PRUNED) is not run again: its result is reused.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.artifacts import upload_artifact
from optuna.artifacts._protocol import ArtifactStore
from optuna.trial import TrialState

from runners.errors import RunnerError, ServetuneError
from runners.host import HostInfo
from runners.server import BenchPlan, BenchResult, ServerSession, merge_smi_peak
from runners.telemetry import Failure, FailureKind, Phase
from search.evaluate import Evaluator, level_order
from search.hosts import preflight
from search.memory import MARGIN_CONSTRAINT, PREDICTED_OOM, Candidate, MemoryModel, facts_from_attrs, record
from search.pool import HostSlot
from search.records import MEM_PREFIX
from search.sampling import normal_params, sample
from search.study import fail_stale
from spaces.launch import LaunchConfig, render_script
from spaces.schema import Space

#: A host whose last server stopped less than this many seconds ago may still be releasing GPU memory.
RELEASE_WINDOW_S = 30.0

#: After this many skips in a row the next sampled configuration is launched whatever the model says
#: (a wrong model must not starve the search).
MAX_SKIPS_IN_A_ROW = 30

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


class Objective:
    """The objective bound to a :class:`TrialEnv`: :meth:`run` runs a trial on a host the caller holds.

    A trial goes: sample -> reuse a measured twin -> the memory model's verdict (a configuration it
    predicts dies, with certainty, is not launched: PRUNED ``predicted_oom``) -> the evaluator (by default
    this objective's own server launch; :mod:`search.evaluate`) -> the margin as an Optuna constraint.
    Confirmations (``confirmation_of``) and the probe skip the reuse and the verdict.
    """

    def __init__(self, env: TrialEnv, evaluator: Evaluator | None = None, *, memory_gate: bool = True) -> None:
        self.env = env
        self.evaluator: Evaluator = evaluator or _ServerEvaluator(self)
        self.memory_gate = memory_gate

    def run(self, trial: optuna.Trial, slot: HostSlot | None) -> float:
        """Run the trial on a host the caller holds (and gives back)."""
        env = self.env
        params = sample(trial, env.space)
        attrs = trial.user_attrs
        repeat = attrs.get("confirmation_of") is not None
        # A configuration someone queued (the probe, a retry, a person's enqueue_trial) is launched as
        # asked; the start-up design's points are ours and the model may skip them.
        queued = "fixed_params" in trial.storage.get_trial_system_attrs(trial._trial_id) and not attrs.get("design")
        if not repeat:
            reused = _reuse(trial, params, abort=env.abort)
            if reused is not None:
                return reused
        launch = LaunchConfig.from_params(env.space, params)
        trial.set_user_attr("engine", launch.engine)
        trial.set_user_attr("objective_metric", env.space.objective.metric)
        trial.set_user_attr("objective_level", env.space.target_level)
        model = self._model(trial) if self.memory_gate else None
        if model is not None and not repeat and not queued:
            self._verdict(trial, params, model)
        try:
            value = self.evaluator.evaluate(trial, launch, slot)
        except optuna.TrialPruned:
            self._measured(trial, params, model)
            raise
        self._measured(trial, params, model)
        return value

    # ---- the memory model ----------------------------------------------------------------------

    def _model(self, trial: optuna.Trial) -> MemoryModel | None:
        """The study's memory model, refitted from every finished trial (so a launch that contradicts a
        prediction counts at once). SGLang-style engines only."""
        if self.env.space.engine.kind not in ("sglang", "sim"):
            return None
        past = trial.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
        return MemoryModel.from_trials(past, target=self.env.space.target_level)

    def _candidate(self, params: dict[str, Any]) -> Candidate:
        mfs = params.get("mem_fraction_static")
        bs = params.get("cuda_graph_max_bs")
        return Candidate(mfs=float(mfs) if isinstance(mfs, float) else None,
                         max_bs=int(bs) if isinstance(bs, int) else None,
                         concurrency=self.env.space.target_level)

    def _verdict(self, trial: optuna.Trial, params: dict[str, Any], model: MemoryModel) -> None:
        pred = model.predict(self._candidate(params))
        if pred is None:
            return
        facts = {"predicted_margin_gib": round(pred.margin_gib, 3), "predicted_sd_gib": round(pred.sd_gib, 3),
                 "predicted_phase": pred.tightest, "prediction_rests_on": list(pred.rests_on)}
        if not pred.certain_death or _skips_in_a_row(trial) >= MAX_SKIPS_IN_A_ROW:
            record(trial, facts)
            return
        record(trial, {**facts, "outcome": PREDICTED_OOM, "phase": pred.tightest,
                       "reason": f"predicted to die in {pred.tightest}: margin {pred.margin_gib:+.2f} GiB "
                                 f"(sd {pred.sd_gib:.2f}), from trials {list(pred.rests_on)}"})
        trial.set_constraint(MARGIN_CONSTRAINT, max(-pred.margin_gib, 0.01))
        self._emit(trial, "outcome", PREDICTED_OOM)
        raise optuna.TrialPruned(f"predicted OOM in {pred.tightest} (margin {pred.margin_gib:+.2f} GiB)")

    def _measured(self, trial: optuna.Trial, params: dict[str, Any], model: MemoryModel | None) -> None:
        """The launch's margin as the memory constraint: an OOM's deficit, else its predicted headroom."""
        if model is None:
            return
        facts = facts_from_attrs(trial.number, trial.user_attrs, params, target=self.env.space.target_level)
        if facts is None or facts.outcome not in ("ok", "oom"):
            return
        model.facts.append(facts)
        margin = model.measured_margin(facts)
        record(trial, {"measured_margin_gib": round(margin, 3)})
        trial.set_constraint(MARGIN_CONSTRAINT, -margin)

    # ------------------------------------------------------------------------------------------

    def _emit(self, trial: optuna.Trial, kind: str, value: Any) -> None:
        if self.env.hook is not None:
            self.env.hook(trial.number, kind, value)

    def _preflight(self, slot: HostSlot) -> HostInfo:
        """Stop orphans, check the host is reachable, the engine present and the GPUs free."""
        env = self.env
        host = slot.host
        orphans = host.cleanup_orphans(grace=env.space.budget.stop_grace)
        cached = env.preflight_cache.get(host.name)
        if cached is None:
            info = preflight(host, env.space)
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

    def _run(self, trial: optuna.Trial, launch: LaunchConfig, slot: HostSlot | None) -> float:
        assert slot is not None, "a server launch needs a host"
        env = self.env
        space = env.space
        # What the host's inventory entry overrides: the port the server binds, the engine's python.
        host_overrides = {"port": slot.host.server_port, "python": slot.host.python}
        launch = launch.model_copy(update={k: v for k, v in host_overrides.items() if v is not None})
        trial.set_user_attr("launch_config", launch.model_dump(mode="json"))
        self._emit(trial, "host", slot.name)
        trial.set_user_attr("host", slot.name)
        try:
            info = self._preflight(slot)
        except RunnerError as exc:
            kind = FailureKind.HOST_BUSY if type(exc).__name__ == "HostBusy" else FailureKind.HOST_UNREACHABLE
            self._fail(trial, Failure(kind, None, str(exc)))
        version = space.engine.version or info.engine_version
        trial.set_user_attr("engine_version", version)
        trial.set_user_attr("gpu_name", info.gpu_name)
        trial.set_user_attr("gpu_count", len(info.gpus))
        engine = launch.engine_impl()
        header = [f"servetune trial {trial.number} of study {env.study_name}"]
        script = render_script(launch, version, header=header)
        trial.set_user_attr("argv", launch.argv(version))
        trial.set_user_attr("env", launch.environment(version))
        run_id = f"{env.study_name}-{trial.number}-{uuid.uuid4().hex[:8]}"
        run_dir = slot.host.run_dir(env.study_name, str(trial.number))
        trial.set_user_attr("run_id", run_id)

        def hook(kind: str, value: Any) -> None:
            if kind == "phase":
                self._emit(trial, "phase", value.value if isinstance(value, Phase) else value)
            elif kind == "level":
                self._emit(trial, "level", value)

        session = ServerSession(
            slot.host, engine, launch, script=script, run_dir=run_dir, run_id=run_id,
            python=launch.python, stop_grace=space.budget.stop_grace,
            smi_interval=env.smi_interval if space.engine.device == "gpu" else 0.0, hook=hook,
            memory_limit_bytes=space.memory_limit_bytes,
        )
        failure: Failure | None = None
        levels: list[dict[str, Any]] = []
        started = time.monotonic()
        try:
            session.start()
        except RunnerError as exc:
            self._fail(trial, Failure(FailureKind.HOST_UNREACHABLE, Phase.STARTING, str(exc)))
        try:
            failure = self._wait_ready(session)
            trial.set_user_attr("startup_s", round(time.monotonic() - started, 3))
            if failure is None:
                self._emit(trial, "phase", "benchmarking")
                plan = BenchPlan(
                    api=engine.bench_api,
                    levels=tuple(space.workload.concurrency),
                    requests=tuple(space.workload.requests()),
                    input_len=space.workload.input_len,
                    output_len=space.workload.output_len,
                    warmup=space.workload.warmup_requests,
                    model=launch.model_path,
                    timeout=space.budget.benchmark_timeout,
                )
                levels_, requests_ = _fail_fast(plan, space.target_level)
                plan = dataclasses.replace(plan, levels=levels_, requests=requests_)
                bench_started = time.monotonic()
                bench = self._benchmark(session, plan)
                trial.set_user_attr("bench_s", round(time.monotonic() - bench_started, 3))
                levels, failure = bench.levels, bench.failure
        finally:
            try:
                stop = session.stop()
                slot.last_server_stop = time.monotonic()
                if stop is not None:
                    trial.set_user_attr("stop_method", stop.method)
                    trial.set_user_attr("stop_s", round(stop.seconds, 3))
            except RunnerError as exc:
                trial.set_user_attr("stop_error", str(exc))
            self._record(trial, session, levels, script)
        if failure is None:
            return self._complete(trial, levels)
        if failure.kind.config_caused:
            self._prune(trial, failure)
        self._fail(trial, failure)
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

    # ---- recording -----------------------------------------------------------------------------

    def _record(self, trial: optuna.Trial, session: ServerSession, levels: list[dict[str, Any]],
                script: str) -> None:
        env = self.env
        memory = merge_smi_peak(session)
        simulated = bool(memory.pop("simulated", False))
        trial.set_user_attr("simulated", simulated)
        for key, value in memory.items():
            if isinstance(value, int | float | str | bool):
                trial.set_user_attr(MEM_PREFIX + key, value)
        trial.set_user_attr("levels", [_slim(level) for level in levels])
        done = [lv["max_concurrency"] for lv in levels if lv.get("completed", 0) > 0 and not lv.get("failed")]
        trial.set_user_attr("level_reached", max(done) if done else 0)
        for lv in levels:
            if lv.get("output_throughput") is not None:
                trial.report(float(lv["output_throughput"]), step=int(lv["max_concurrency"]))
        trial.set_user_attr("log_tail", session.log_tail(60))
        if session.exit_code is not None:
            trial.set_user_attr("exit_code", session.exit_code)
        out = env.artifacts_dir / env.study_name / str(trial.number)
        out.mkdir(parents=True, exist_ok=True)
        files = {
            "server.log": session.log_text(),
            "launch.sh": script,
            "bench.json": json.dumps(levels, indent=2),
            "nvidia-smi.csv": session.smi_csv(),
        }
        for name, text in files.items():
            (out / name).write_text(text)
        trial.set_user_attr("artifacts_dir", str(out))
        if env.artifact_store is not None:
            ids = {}
            for name in files:
                mimetype = "text/plain" if not name.endswith(".json") else "application/json"
                ids[name] = upload_artifact(artifact_store=env.artifact_store, file_path=str(out / name),
                                            study_or_trial=trial, mimetype=mimetype, encoding="utf-8")
            trial.set_user_attr("artifact_ids", ids)

    def _complete(self, trial: optuna.Trial, levels: list[dict[str, Any]]) -> float:
        space = self.env.space
        target = space.target_level
        row = next((lv for lv in levels if lv.get("max_concurrency") == target), None)
        if row is None or row.get(space.objective.metric) is None:
            self._fail(trial, Failure(FailureKind.INFRA, Phase.SERVING, f"no result at concurrency {target}"))
        assert row is not None
        slo = space.objective.slo
        if slo.p99_ttft_ms is not None:
            trial.set_constraint("p99_ttft_ms", float(row.get("p99_ttft_ms") or 0) - slo.p99_ttft_ms)
        if slo.p99_tpot_ms is not None:
            trial.set_constraint("p99_tpot_ms", float(row.get("p99_tpot_ms") or 0) - slo.p99_tpot_ms)
        trial.set_user_attr("outcome", "ok")
        trial.set_user_attr("phase", None)
        trial.set_user_attr("reason", "")
        self._emit(trial, "outcome", "ok")
        return float(row[space.objective.metric])

    def _set_failure(self, trial: optuna.Trial, failure: Failure) -> None:
        trial.set_user_attr("outcome", failure.kind.value)
        trial.set_user_attr("phase", failure.phase.value if failure.phase else None)
        trial.set_user_attr("reason", failure.reason)
        if failure.exit_code is not None:
            trial.set_user_attr("exit_code", failure.exit_code)
        if failure.kind == FailureKind.OOM and failure.phase is not None:
            trial.set_user_attr(MEM_PREFIX + "oom_phase", failure.phase.value)
        self._emit(trial, "outcome", failure.kind.value)

    def _prune(self, trial: optuna.Trial, failure: Failure) -> None:
        self._set_failure(trial, failure)
        raise optuna.TrialPruned(f"{failure.kind.value} in {failure.phase.value if failure.phase else '?'}: "
                                 f"{failure.reason}")

    def _fail(self, trial: optuna.Trial, failure: Failure) -> None:
        self._set_failure(trial, failure)
        raise TrialFailed(failure)


class _ServerEvaluator:
    """The real evaluator: launch the server on the host, wait, sweep, stop (:meth:`Objective._run`)."""

    def __init__(self, objective: Objective) -> None:
        self._objective = objective

    def evaluate(self, trial: optuna.Trial, launch: LaunchConfig, slot: HostSlot | None) -> float:
        return self._objective._run(trial, launch, slot)


def _fail_fast(plan: BenchPlan, target: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The sweep's levels in fail-fast order (target first), with their request counts."""
    per_level = dict(zip(plan.levels, plan.requests, strict=True))
    order = level_order(plan.levels, target)
    return order, tuple(per_level[c] for c in order)


def _skips_in_a_row(trial: optuna.Trial) -> int:
    n = 0
    for past in sorted(trial.study.get_trials(deepcopy=False, states=(TrialState.PRUNED, TrialState.COMPLETE)),
                       key=lambda t: t.number, reverse=True):
        if past.user_attrs.get("outcome") != PREDICTED_OOM:
            break
        n += 1
    return n


_SLIM_KEYS = (
    "max_concurrency", "completed", "failed", "duration", "total_input_tokens", "total_output_tokens",
    "request_throughput", "input_throughput", "output_throughput", "total_throughput",
    "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
    "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_e2e_latency_ms", "median_e2e_latency_ms",
    "p99_e2e_latency_ms", "simulated", "time_scale", "errors",
)


def _slim(level: dict[str, Any]) -> dict[str, Any]:
    return {k: level[k] for k in _SLIM_KEYS if k in level}


def _reuse(trial: optuna.Trial, params: dict[str, Any], *, abort: threading.Event | None = None,
           poll: float = 0.5) -> float | None:
    """If these params were already measured (COMPLETE or PRUNED), reuse that result instead of rerunning.

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
            if past.user_attrs.get("outcome") == PREDICTED_OOM:
                continue  # a prediction, not a measurement: the model may have learnt better since
            origin = past.user_attrs.get("duplicate_of", past.number)
            for key, value in past.user_attrs.items():
                if key not in ("duplicate_of", "artifact_ids", "retried_from"):
                    trial.set_user_attr(key, value)
            trial.set_user_attr("duplicate_of", origin)
            if past.state == TrialState.COMPLETE:
                for key, value in past.constraints.items():
                    trial.set_constraint(key, value)
                assert past.value is not None
                return float(past.value)
            raise optuna.TrialPruned(f"same configuration as trial {origin}: {past.user_attrs.get('outcome')}")
        # A twin whose controller died must not be waited for forever: fail it once it is stale
        # (its configuration is then re-queued), as the budget reservation does.
        fail_stale(study)
        twins = [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                 if t.number < trial.number and normal_params(t.params) == params]
        if not twins:
            return None
        if abort is not None and abort.is_set():
            trial.set_user_attr("outcome", FailureKind.INTERRUPTED.value)
            trial.set_user_attr("phase", None)
            trial.set_user_attr("reason", "interrupted")
            raise TrialFailed(Failure(FailureKind.INTERRUPTED, None, "interrupted"))
        trial.set_user_attr("waiting_for", twins[0])
        time.sleep(poll)
