"""The server path of a trial: launch the engine on a host, wait until it is ready, sweep, stop, record.

:class:`ServerEvaluator` is the :class:`~search.trial.evaluate.Evaluator` of ``servetune run``: a success returns
the objective (the metric at the target level; a ``pareto`` trial its metrics there), each finished level's
throughput is reported as an intermediate value (never a 0 for a level the server died in); a config-caused
death records its telemetry and raises :class:`optuna.TrialPruned`; infrastructure trouble raises
:class:`~search.trial.objective.TrialFailed`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optuna
from optuna.artifacts import upload_artifact

from runners.engines import Engine, engine_for
from runners.engines.nodes import render_nodes
from runners.engines.script import RenderedLaunch, render
from runners.errors import ConfigError, RunnerError
from runners.host import Host, HostInfo, Resources
from runners.nodes import NodeSession
from runners.server import BenchPlan, BenchResult, ServerSession, merge_smi_peak
from runners.telemetry import Failure, FailureKind, Phase, kind_of_error
from search.trial.correctness import GatePlan, compare, gate_files, gate_plan, store_reference, stored_reference
from search.trial.early import first_requests, stop_early
from search.trial.evaluate import Slot, level_order
from search.trial.objective import Benchmarking, Ended, HostChosen, TrialEnv, TrialFailed, emit, run_folder
from search.trial.preflight import preflight
from search.trial.records import (
    CORRECTNESS_CONSTRAINT,
    LevelResult,
    MemoryFacts,
    RankFacts,
    RateStepFacts,
    TrialFacts,
)
from search.trial.slo import find_max_rate
from search.trial.workload import bench_plan, run_files
from spaces.launch import LaunchConfig

log = logging.getLogger(__name__)

__all__ = ["RELEASE_WINDOW_S", "ServerEvaluator"]

#: A host whose last server stopped less than this many seconds ago may still be releasing GPU memory.
RELEASE_WINDOW_S = 30.0


class ServerEvaluator:
    """Launch the trial's server on the host the caller holds, wait, sweep, stop (the real evaluator)."""

    def __init__(self, env: TrialEnv) -> None:
        self.env = env
        self._gpus_used = 1

    def _preflight(self, slot: Slot, engine: Engine, host: Host | None = None) -> HostInfo:
        """Stop orphans, check the host (``slot``'s, or one of its group's) is reachable, the engine present and
        the GPUs free."""
        env = self.env
        host = slot.host if host is None else host
        orphans = host.cleanup_orphans(grace=env.space.budget.stop_grace)
        for ref in orphans:
            log.warning("stopped an orphaned server on %s before the next trial (process group %d, %s)", host.name,
                        ref.pgid, ref.run_dir)
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

    def evaluate(self, trial: optuna.Trial, launch: LaunchConfig, slot: Slot | None,
                 facts: TrialFacts) -> float | list[float]:
        assert slot is not None, "a server launch needs a host"
        env = self.env
        space = env.space
        # What the host's inventory entry overrides: the port the server binds, the engine's python.
        host_overrides = {"port": slot.host.launch_port(), "python": slot.host.python}
        launch = launch.model_copy(update={k: v for k, v in host_overrides.items() if v is not None})
        facts.launch_config = launch
        emit(self.env, trial, HostChosen(slot.name))
        facts.host = slot.name
        engine = engine_for(launch)  # resolved once per trial and passed on
        session, script, gate, reference = self._prepare(trial, slot, launch, engine, facts)
        failure: Failure | None = None
        levels: list[dict[str, Any]] = []
        started = time.monotonic()
        try:
            session.start()  # HostBusy when another program holds the port: nothing is started
        except RunnerError as exc:
            self._fail(trial, facts, Failure(kind_of_error(exc), Phase.STARTING, str(exc)))
        try:
            # A cluster job waits in the queue first: that wait is the trial's queue_s, not its start-up.
            failure = session.wait_scheduled(env.abort)
            facts.queue_s = session.queued_s
            if session.queued_s is not None:
                started = time.monotonic()
            if failure is None:
                failure = self._wait_ready(session)
            facts.startup_s = round(time.monotonic() - started, 3)
            if failure is None and gate is not None:
                self._check(trial, _head(session), gate, reference, facts)
            if failure is None:
                emit(self.env, trial, Benchmarking())
                bench_started = time.monotonic()
                if space.objective.kind == "max_rate_under_slo":
                    bench = self._rate_search(session, engine.bench_api, launch.model_path, facts)
                else:
                    plan = _fail_fast(bench_plan(space, api=engine.bench_api, model=launch.model_path),
                                      space.target_level)
                    plan, on_partial = self._early_look(plan, facts)
                    bench = self._benchmark(session, plan, on_partial)
                    if not any(level.get("stopped_early") for level in bench.levels):
                        facts.stopped_early = None  # the stop came too late: the sweep ran whole
                facts.bench_s = round(time.monotonic() - bench_started, 3)
                levels, failure = bench.levels, bench.failure
        finally:
            self._stop(session, slot, facts)
            self._record(trial, facts, session, levels, script)
        if failure is None:
            return self._complete(trial, facts)
        if failure.kind.config_caused:
            self._prune(trial, facts, failure)
        self._fail(trial, facts, failure)
        raise AssertionError("unreachable")

    def _stop(self, session: ServerSession | NodeSession, slot: Slot, facts: TrialFacts) -> None:
        """Stop the server (every rank) and note how it went; a server spanning nodes: every node's GPUs are
        checked free."""
        try:
            stop = session.stop()
            slot.last_server_stop = time.monotonic()
            if stop is not None:
                facts.stop_method = stop.method
                facts.stop_s = round(stop.seconds, 3)
            if isinstance(session, NodeSession) and self.env.space.engine.device == "gpu":
                held = session.check_gpus_free()  # every node's GPUs, at once
                if held:
                    facts.stop_error = "GPU memory still held after the stop: " + "; ".join(held)
        except RunnerError as exc:
            facts.stop_error = str(exc)

    def _prepare(self, trial: optuna.Trial, slot: Slot, launch: LaunchConfig, engine: Engine,
                 facts: TrialFacts) -> tuple[ServerSession | NodeSession, str, GatePlan | None,
                                             list[dict[str, Any]] | None]:
        """Preflight the trial's host (every node's), render its command (one per rank) and make its session;
        the launch script the trial records, the correctness gate's plan and the reference's answers. Fails or
        prunes the trial when it cannot be launched."""
        env = self.env
        space = env.space
        self._gpus_used = engine.tp_size(launch.fixed_args)
        facts.price_per_gpu_hour = slot.host.price_per_gpu_hour
        if space.objective.needs_price and slot.host.price_per_gpu_hour is None:
            self._fail(trial, facts, Failure(FailureKind.HOST_CONFIG, None,
                                             f"{slot.name}: the cost_per_mtok objective needs the host's price: set "
                                             "price_per_gpu_hour for it in the inventory"))
        hosts = [slot.host, *slot.workers][:launch.nodes] if launch.nodes > 1 else [slot.host]
        if launch.nodes > 1 and not slot.workers:  # a Slurm job slot runs every rank in one job
            hosts = slot.host.rank_hosts(launch.nodes)
        facts.nodes = launch.nodes
        if len(hosts) < launch.nodes:
            self._fail(trial, facts, Failure(FailureKind.HOST_CONFIG, None,
                                             f"a server of {launch.nodes} nodes needs a host group of "
                                             f"{launch.nodes}; {slot.name} has {len(hosts)} host(s)"))
        try:
            infos = [self._preflight(slot, engine, host) for host in hosts]  # every node's GPUs free
        except RunnerError as exc:
            self._fail(trial, facts, Failure(kind_of_error(exc), None, str(exc)))
        info = infos[0]
        version = space.engine.version or info.engine_version
        facts.engine_version = version
        facts.gpu_name = info.gpu_name
        facts.gpu_count = sum(len(i.gpus) for i in infos)
        header = [f"servetune trial {trial.number} of study {env.study_name}"]
        run_id = f"{env.study_name}-{trial.number}-{uuid.uuid4().hex[:8]}"
        facts.run_id = run_id
        try:
            scripts = self._render(engine, launch, version, hosts, header)
        except ConfigError as exc:  # e.g. a TP size that does not divide over the nodes: the configuration's
            self._prune(trial, facts, Failure(FailureKind.BAD_FLAG, Phase.STARTING, str(exc)))
        except RunnerError as exc:
            self._fail(trial, facts, Failure(kind_of_error(exc), Phase.STARTING, str(exc)))
        facts.argv = list(scripts[0][1].argv)
        facts.env = dict(scripts[0][1].env)
        gate = self._gate(trial, launch, engine, version, list(scripts[0][1].argv), scripts[0][1].env, facts)
        reference = self._reference_answers(trial, slot, engine, version, gate, facts) if gate else None
        sessions = [
            ServerSession(
                host, engine, ranked, script=rendered.script, run_dir=host.run_dir(run_folder(env), str(trial.number)),
                run_id=run_id if rank == 0 else f"{run_id}-rank{rank}",
                python=launch.python, stop_grace=space.budget.stop_grace,
                smi_interval=env.smi_interval if space.engine.device == "gpu" else 0.0,
                on_event=(lambda event: emit(self.env, trial, event)) if rank == 0 else None,
                memory_limit_bytes=space.memory_limit_bytes,
                files={**run_files(space), **gate_files(gate)} if rank == 0 else None,
                resources=_resources(engine, launch, gpu=space.engine.device == "gpu"),
            )
            for rank, (host, (ranked, rendered)) in enumerate(zip(hosts, scripts, strict=True))
        ]
        if len(sessions) == 1:
            return sessions[0], scripts[0][1].script, gate, reference
        facts.host = f"{slot.name} ({', '.join(h.name for h in hosts)})"
        return NodeSession(sessions), "\n".join(r.script for _, r in scripts), gate, reference

    def _render(self, engine: Engine, launch: LaunchConfig, version: str, hosts: Sequence[Host],
                header: Sequence[str]) -> list[tuple[LaunchConfig, RenderedLaunch]]:
        """Each rank's launch (its host's port) and rendered command: one for one node; for a server spanning
        nodes, :func:`runners.engines.nodes.render_nodes` with the dist-init port picked free on the head."""
        if len(hosts) == 1:
            return [(launch, render(engine, launch, version, header=header))]
        ports = [launch.port if h is hosts[0] else (h.launch_port() or launch.port) for h in hosts]
        head = hosts[0]
        dist_port = head.free_port(launch.python, head.node_address)
        rendered = render_nodes(engine, launch, version, [h.node_address for h in hosts], dist_port, ports=ports,
                                header=header)
        rendered = [dataclasses.replace(r, script=head.rank_script(r.script)) for r in rendered]
        return [(launch.model_copy(update={"port": p}), r) for p, r in zip(ports, rendered, strict=True)]

    def _wait_ready(self, session: ServerSession | NodeSession) -> Failure | None:
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

    def _early_look(self, plan: BenchPlan,
                    facts: TrialFacts) -> tuple[BenchPlan, Callable[[Mapping[str, Any]], bool] | None]:
        """The plan with the early look at the target level (:mod:`search.trial.early`) and the callback that
        decides on the load generator's partial record; the plan unchanged for a trial without a stop bar, or
        an objective the partial record does not estimate (it counts every output token streamed so far, so
        ``output_throughput`` only)."""
        space = self.env.space
        target, metric = space.target_level, space.objective.metric
        if (facts.stop_bar is None or space.objective.kind != "throughput_at" or metric != "output_throughput"
                or not plan.levels or plan.levels[0] != target or plan.request_rate is not None):
            return plan, None

        def on_partial(record: Mapping[str, Any]) -> bool:
            first = record.get(metric)
            if record.get("max_concurrency") != target or not isinstance(first, int | float):
                return False
            return stop_early(facts, metric, target, float(first))

        return dataclasses.replace(plan, early_look=first_requests(plan.requests[0])), on_partial

    def _benchmark(self, session: ServerSession | NodeSession, plan: BenchPlan,
                   on_partial: Callable[[Mapping[str, Any]], bool] | None = None) -> BenchResult:
        # The abort event is honoured by running the sweep in a thread and stopping the server.
        result: dict[str, Any] = {}

        def run() -> None:
            result["bench"] = session.benchmark(plan, timeout=self.env.space.budget.benchmark_timeout,
                                                on_partial=on_partial)

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

    def _rate_search(self, session: ServerSession | NodeSession, api: str, model: str,
                     facts: TrialFacts) -> BenchResult:
        """``max_rate_under_slo``: the highest request rate (Poisson arrivals, at most the target level in
        flight) at which the SLO holds, by :func:`search.trial.slo.find_max_rate`; every step is one load generator
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

    # ---- the correctness gate ----------------------------------------------------------------------

    def _gate(self, trial: optuna.Trial, launch: LaunchConfig, engine: Engine, version: str, argv: list[str],
              env: Mapping[str, str], facts: TrialFacts) -> GatePlan | None:
        """The gate's plan for this launch, or None: the gate is off, or a launch of the same configuration was
        checked already (a repeat takes its verdict: the gate runs once per configuration)."""
        space = self.env.space
        if not space.gate_on:
            return None
        if facts.confirmation_of is not None:
            origin = next((t for t in trial.study.get_trials(deepcopy=False)
                           if t.number == facts.confirmation_of), None)
            checked = TrialFacts.from_trial(origin).correctness if origin is not None else None
            if checked is not None:
                facts.correctness = checked.model_copy(update={"from_trial": facts.confirmation_of, "seconds": 0.0})
                return None
        return gate_plan(space, launch, engine, version, argv, env, self.env.gate_reference)

    def _reference_answers(self, trial: optuna.Trial, slot: Slot, engine: Engine, version: str, plan: GatePlan,
                           facts: TrialFacts) -> list[dict[str, Any]] | None:
        """The reference configuration's answers: stored with the study once asked; else its server is launched
        here, on this trial's host, asked, and stopped. None when this launch is the reference itself."""
        if plan.same_as_reference:
            return None
        stored = stored_reference(trial.study, plan.key)
        if stored is not None:
            return stored
        env, space = self.env, self.env.space
        launch = plan.reference_launch
        rendered = render(engine, launch, version,
                          header=[f"servetune correctness reference for study {env.study_name}"])
        run_id = f"{env.study_name}-{trial.number}-reference-{uuid.uuid4().hex[:8]}"
        session = ServerSession(
            slot.host, engine, launch, script=rendered.script,
            run_dir=slot.host.run_dir(run_folder(env), f"{trial.number}-reference"), run_id=run_id,
            python=launch.python, stop_grace=space.budget.stop_grace, smi_interval=0.0,
            memory_limit_bytes=space.memory_limit_bytes, files=gate_files(plan),
            resources=_resources(engine, launch, gpu=space.engine.device == "gpu"),
        )
        started = time.monotonic()
        error = ""
        # A fault of the host's (a directive Slurm rejects, a job Slurm ended) keeps its own kind, so a
        # set-up fault retires the host here as it does when the trial's own server meets it.
        kind = FailureKind.INFRA
        answers: list[dict[str, Any]] = []
        try:
            session.start()
            failure = session.wait_scheduled(env.abort)  # a cluster job waits in the queue first
            if failure is None:
                failure = self._wait_ready(session)
            if failure is not None:
                error = failure.reason
                if failure.kind in (FailureKind.SCHEDULER, FailureKind.INTERRUPTED):
                    kind = failure.kind
            else:
                answers, error = session.answers(plan.answer_plan(launch.model_path))
        except RunnerError as exc:
            error, kind = str(exc), kind_of_error(exc)
        finally:
            with contextlib.suppress(RunnerError):
                session.stop()
            slot.last_server_stop = time.monotonic()
        if error or not answers:
            self._fail(trial, facts, Failure(kind, Phase.STARTING,
                                             f"the correctness gate's reference ({plan.reference_name}) did not "
                                             f"answer: {error or 'no answer'}"))
        store_reference(trial.study, plan.key, answers, time.monotonic() - started, trial.number)
        return answers

    def _check(self, trial: optuna.Trial, session: ServerSession, plan: GatePlan,
               reference: list[dict[str, Any]] | None, facts: TrialFacts) -> None:
        """Ask this server the gate's prompts and judge its answers (``facts.correctness``)."""
        started = time.monotonic()
        answers, error = session.answers(plan.answer_plan(session.launch.model_path))
        seconds = round(time.monotonic() - started, 3)
        if reference is None:  # this launch is the reference: its answers become the study's reference
            if answers:
                store_reference(trial.study, plan.key, answers, seconds, trial.number)
            verdict = compare(answers, answers, plan.prompts, plan.settings, reference_name=plan.reference_name)
            facts.correctness = verdict.model_copy(update={"seconds": seconds, "same_as_reference": True})
            return
        verdict = compare(reference, answers, plan.prompts, plan.settings, reference_name=plan.reference_name)
        if error and not answers:
            verdict = verdict.model_copy(update={"passed": False, "reason": f"no answers: {error}"})
        facts.correctness = verdict.model_copy(update={"seconds": seconds})

    def _power(self, facts: TrialFacts, session: ServerSession) -> None:
        """Power, energy per output token and cost per million output tokens at the target level (its own load
        window only: start-up, warm-up and other levels excluded)."""
        target = self.env.space.target_level
        index = next((i for i, lv in enumerate(facts.levels) if lv.max_concurrency == target and lv.served), None)
        if index is None:
            return
        throughput = facts.levels[index].output_throughput
        if not throughput:
            return
        gpus = self._gpus_used
        if facts.price_per_gpu_hour is not None:
            facts.cost_per_mtok = round(facts.price_per_gpu_hour * gpus / 3600 / throughput * 1e6, 6)
        if index < len(session.level_windows):
            power = session.power_during(*session.level_windows[index], gpus=gpus)
            if power is not None:
                facts.power_w = round(power, 2)
                facts.energy_per_token_j = round(power / throughput, 6)

    @staticmethod
    def _set_gate_constraint(trial: optuna.Trial, facts: TrialFacts) -> None:
        if facts.correctness is not None:
            trial.set_constraint(CORRECTNESS_CONSTRAINT, facts.correctness.constraint)

    # ---- recording -----------------------------------------------------------------------------

    def _record_ranks(self, facts: TrialFacts, session: NodeSession) -> None:
        """Each rank's host, end and memory ladder, and which rank died first (its death is the verdict)."""
        facts.died_first = session.first_dead()
        ranks = []
        for rank, (s, failure) in enumerate(zip(session.sessions, session.rank_failures(), strict=True)):
            memory = merge_smi_peak(s)
            memory.pop("simulated", None)
            ranks.append(RankFacts(
                rank=rank, host=s.host.name, outcome=failure.kind if failure else None,
                phase=failure.phase if failure else None, reason=failure.reason if failure else "",
                exit_code=s.exit_code if failure else None,
                memory=MemoryFacts.model_validate(
                    {k: v for k, v in memory.items() if isinstance(v, int | float | str | bool)})))
        facts.ranks = ranks

    def _record(self, trial: optuna.Trial, facts: TrialFacts, session: ServerSession | NodeSession,
                levels: list[dict[str, Any]], script: str) -> None:
        env = self.env
        if isinstance(session, NodeSession):
            self._record_ranks(facts, session)
        # A Slurm host's preflight knows only sinfo's GRES type ("gpu", "h100"); nvidia-smi on the job's head
        # node names the card the server ran on.
        named = next((g.name for _, gpus in _head(session).smi_samples for g in gpus if g.name), None)
        if named:
            facts.gpu_name = named
        memory = merge_smi_peak(session)
        facts.simulated = bool(memory.pop("simulated", False))
        facts.memory = MemoryFacts.model_validate(
            {k: v for k, v in memory.items() if isinstance(v, int | float | str | bool)})
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
        self._power(facts, _head(session))
        facts.log_tail = session.log_tail(60)
        if session.exit_code is not None:
            facts.exit_code = session.exit_code
        out = env.artifacts_dir / env.study_name / str(trial.number)
        files = {
            "server.log": session.log_text(),
            "launch.sh": script,  # a server spanning nodes: every rank's script, rank 0 first
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
        derived = {"cost_per_mtok": facts.cost_per_mtok, "energy_per_token_j": facts.energy_per_token_j}
        missing = [m for m in names if row is None or (derived[m] if m in derived else row.figure(m)) is None]
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
        self._set_gate_constraint(trial, facts)
        facts.outcome, facts.phase, facts.reason = "ok", None, facts.stopped_early or ""
        emit(self.env, trial, Ended("ok"))
        values = [float(derived[m] if m in derived else row.figure(m)) for m in names]  # type: ignore[arg-type]
        return values if space.objective.kind == "pareto" else values[0]

    def _complete_rate(self, trial: optuna.Trial, facts: TrialFacts) -> float:
        """The rate found (or the output throughput measured at it); a configuration that holds the SLO at
        no rate in range scores 0 and is infeasible, so it is never the best."""
        objective = self.env.space.objective
        rate = facts.slo_rate
        trial.set_constraint("slo_rate", 0.0 if rate is not None else 1.0)
        self._set_gate_constraint(trial, facts)
        facts.outcome, facts.phase, facts.reason = "ok", None, ""
        emit(self.env, trial, Ended("ok"))
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
            facts.memory = facts.memory.merged({"oom_phase": failure.phase.value})
        emit(self.env, trial, Ended(failure.kind.value))

    def _prune(self, trial: optuna.Trial, facts: TrialFacts, failure: Failure) -> None:
        self._set_failure(trial, facts, failure)
        raise optuna.TrialPruned(f"{failure.kind.value} in {failure.phase.value if failure.phase else '?'}: "
                                 f"{failure.reason}")

    def _fail(self, trial: optuna.Trial, facts: TrialFacts, failure: Failure) -> None:
        self._set_failure(trial, facts, failure)
        raise TrialFailed(failure)


def _head(session: ServerSession | NodeSession) -> ServerSession:
    """The server's rank 0 (the session itself on one node)."""
    return session.head if isinstance(session, NodeSession) else session


def _resources(engine: Engine, launch: LaunchConfig, *, gpu: bool) -> Resources:
    """What the trial's server asks of a cluster: its nodes, and its tensor parallel size spread over them."""
    nodes = max(1, int(getattr(launch, "nodes", 1) or 1))  # a multi-node launch names its node count
    gpus = -(-engine.tp_size(launch.fixed_args) // nodes) if gpu else 0
    return Resources(nodes=nodes, gpus_per_node=gpus)


def _fail_fast(plan: BenchPlan, target: int) -> BenchPlan:
    """The plan with its levels in fail-fast order (target first), each with its request count."""
    per_level = dict(zip(plan.levels, plan.requests, strict=True))
    order = level_order(plan.levels, target)
    return dataclasses.replace(plan, levels=order, requests=tuple(per_level[c] for c in order))
