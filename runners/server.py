"""One trial's server on one host, from launch to verified stop.

:class:`ServerSession` starts the launch script detached on a :class:`~runners.host.Host`, follows its log
live through the engine's :class:`~runners.engines.base.LogParser`, samples nvidia-smi, waits until the
server is really ready (the engine's readiness line where it has one, ``/health`` 200, *and* the port's
listening socket held by this server's process group, so a foreign server on the port is never
measured), runs the
load generator on the host beside the server, and stops the whole process group. Death is noticed the
moment the log shows a fatal line or the process group's leader exits, not on a slow poll.

Everything it learns is a value: :class:`~runners.telemetry.Failure` for how it died, the parser's
:class:`~runners.telemetry.Telemetry`, the per-level benchmark records, the nvidia-smi samples; and what it
tells the caller on the way is a typed event (:mod:`runners.events`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import queue
import shlex
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Protocol

from runners.engines.base import Engine, LaunchLike, LogParser
from runners.errors import HostUnreachable, RunnerError
from runners.events import EventSink, FatalSeen, LevelDone, PhaseReached, ServerEvent, ServerReady
from runners.host import Host, Resources, RunRef, StopResult
from runners.host.shell import Shell
from runners.loadgen import EXIT_STOPPED, IMPLAUSIBLE
from runners.logkeep import LogKeep
from runners.smi import GpuStatus
from runners.telemetry import Failure, FailureKind, Phase, kind_of_error
from runners.transport import LineStream

log = logging.getLogger(__name__)

_FATAL_TO_EXIT = 15.0  # how long a server may keep running after a fatal log line before we call it dead
_ADDRESS_IN_USE = "address already in use"
#: nvidia-smi is sampled at least this often (s) while the load runs (power over each level's window).
BENCH_SMI_INTERVAL = 0.25

#: Exit codes of a server stopped from outside by a signal (a shell reports signal N as 128+N). SIGKILL (137)
#: is not here: the kernel's OOM killer sends it, and the engine's classifier judges that.
#: SGLang's own warning when a GPU holds memory of another process (python/sglang/srt/model_executor/
#: model_runner.py, "The memory capacity is unbalanced. Some GPUs may be occupied by other processes.").
_OTHER_PROCESSES = "may be occupied by other processes"
_OUTSIDE_SIGNALS = {129: "SIGHUP", 130: "SIGINT", 131: "SIGQUIT", 143: "SIGTERM"}


#: The file in the run directory whose appearance stops the load generator after its early look.
STOP_FILE = "stop-level"


@dataclass(frozen=True)
class BenchPlan:
    """What the load generator runs: the sweep and where to send it."""

    api: str
    levels: tuple[int, ...]
    requests: tuple[int, ...]
    input_len: int
    output_len: int
    warmup: int
    model: str
    timeout: float
    range_ratio: float = 1.0
    dataset: str | None = None
    """The dataset's file name in the run directory (shipped with ``ServerSession(files=...)``)."""
    prefix_len: int = 0
    prefix_groups: int = 1
    seed: int = 1
    request_rate: float | None = None
    """Open loop: requests per second (Poisson arrivals); None: closed loop."""
    early_look: int | None = None
    """Closed loop: after this many of the first level's requests have finished, the load generator prints a
    partial record and the caller may stop the sweep there (``ServerSession.benchmark``'s ``on_partial``)."""

    def loadgen_args(self) -> list[str]:
        """The load generator's workload and arrival flags for this plan."""
        args = ["--seed", str(self.seed), "--random-range-ratio", f"{self.range_ratio:g}"]
        if self.dataset is not None:
            args += ["--dataset", self.dataset]
        if self.prefix_len:
            args += ["--prefix-len", str(self.prefix_len), "--prefix-groups", str(self.prefix_groups)]
        if self.request_rate is not None:
            args += ["--request-rate", f"{self.request_rate:g}"]
        if self.early_look is not None:
            args += ["--early-look", str(self.early_look), "--stop-file", STOP_FILE]
        return args


@dataclass
class BenchResult:
    """Per-level records (sglang.bench_serving names), and how the sweep ended."""

    levels: list[dict[str, Any]] = field(default_factory=list)
    failure: Failure | None = None


@functools.cache
def answers_source() -> bytes:
    """The correctness probe's source (``runners/answers.py``), copied into every run directory."""
    return resources.files("runners").joinpath("answers.py").read_bytes()


@dataclass(frozen=True)
class AnswerPlan:
    """What the correctness probe asks: the prompts file (in the run directory) and how long each answer is."""

    prompts_file: str
    max_tokens: int
    model: str
    timeout: float = 600.0
    """Seconds for the whole probe (every prompt): the trial's benchmark timeout."""


@functools.cache
def loadgen_source() -> bytes:
    """The load generator's source, copied into every run directory (read once per process)."""
    return resources.files("runners").joinpath("loadgen.py").read_bytes()



class ServerSession:
    """Context manager: ``with ServerSession(...) as s: s.wait_ready(...); s.benchmark(...)``.

    Leaving the block always stops the process group (TERM, TERM, KILL) and verifies nothing is left.
    ``on_event`` is called with each :data:`~runners.events.ServerEvent` (a phase reached, a fatal line, the
    server ready, a level benchmarked) as it happens.
    """

    def __init__(
        self,
        host: Host,
        engine: Engine,
        launch: LaunchLike,
        *,
        script: str,
        run_dir: str,
        run_id: str,
        python: str,
        stop_grace: float = 15.0,
        smi_interval: float = 1.0,
        on_event: EventSink | None = None,
        memory_limit_bytes: int | None = None,
        files: Mapping[str, str] | None = None,
        resources: Resources | None = None,
    ) -> None:
        self.host = host
        self.resources = resources
        self.files = dict(files or {})
        self.engine = engine
        self.launch = launch
        self.script = script
        self.run_dir = run_dir
        self.run_id = run_id
        self.python = python
        self.stop_grace = stop_grace
        self.smi_interval = smi_interval
        self._on_event: EventSink = on_event or _ignore
        self.memory_limit_bytes = memory_limit_bytes
        self.evidence: dict[str, Any] = {}
        self.parser = engine.parser()
        self.ref: RunRef | None = None
        self.lines = LogKeep()
        """The log's head and tail (:mod:`runners.logkeep`): the controller's memory stays flat."""
        self.exit_code: int | None = None
        self.server_info: dict[str, Any] = {}
        self.smi_samples: list[tuple[float, list[GpuStatus]]] = []
        self._load_started_at: float | None = None  # when the benchmark began (time.time(), as the samples)
        self.stop_result: StopResult | None = None
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._dead = threading.Event()
        self._lost = threading.Event()
        self._lost_error: RunnerError | None = None
        self._closing = threading.Event()
        self._stream: LineStream | None = None
        self._threads: list[threading.Thread] = []
        self._fatal_seen_at: float | None = None
        self._died_at: float | None = None
        self.queued_s: float | None = None
        """Seconds the server waited for its resources (a cluster job in the queue); None on a plain host."""
        self._loading = threading.Event()
        self.level_windows: list[tuple[float, float]] = []
        """(start, end) wall-clock time of each level record received, in order (its load window)."""

    # ---- lifetime ------------------------------------------------------------------------------

    def __enter__(self) -> ServerSession:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start the server; HostBusy (before anything is started) when another program holds the port."""
        self.host.require_port_free(int(self.launch.port))
        self.ref = self.host.start(self.run_dir, self.script, self.run_id,
                                   files={"loadgen.py": loadgen_source().decode(),
                                          "answers.py": answers_source().decode(), **self.files},
                                   scratch_vars=self.engine.scratch_vars,
                                   memory_limit_bytes=self.memory_limit_bytes, resources=self.resources)
        self._spawn(self._follow, "follow")
        if self.smi_interval > 0:
            self._spawn(self._sample_smi, "smi")

    def wait_scheduled(self, abort: threading.Event, *, timeout: float | None = None) -> Failure | None:
        """Wait until the server holds its resources (a Slurm job has left the queue), apart from its start-up
        time; the wait is kept in :attr:`queued_s`. A plain host: None at once."""
        assert self.ref is not None
        began = time.monotonic()
        failure = self.host.wait_scheduled(self.ref, stop=abort, timeout=timeout)
        waited = time.monotonic() - began
        if waited >= 0.05 or failure is not None:
            self.queued_s = round(waited, 3)
        return failure

    def _beside(self) -> Shell:
        """Where the load generator and ``/health`` run: the server's own machine."""
        return self.host.beside(self.ref) if self.ref is not None else self.host

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=target, name=f"{name}-{self.run_id}", daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self) -> StopResult | None:
        """Stop the process group and verify it is gone. Idempotent."""
        if self.ref is None or self.stop_result is not None:
            return self.stop_result
        self._closing.set()
        try:
            self.stop_result = self.host.stop(self.ref, grace=self.stop_grace)
            self.host.remove_scratch(self.ref)
            if self.memory_limit_bytes is not None:
                self.host.remove_cgroup(self.ref)
                self._note_evidence(self.host.oom_evidence(self.ref))
        finally:
            stream = self._stream
            if stream is not None:
                stream.close()
            for t in self._threads:
                t.join(timeout=5)
        if self.exit_code is None:
            with contextlib.suppress(RunnerError):
                self.exit_code = self.host.exit_code(self.ref)
        return self.stop_result

    # ---- watching ------------------------------------------------------------------------------

    def _follow(self) -> None:
        assert self.ref is not None
        skip = 0
        while not self._closing.is_set():
            try:
                stream = self.host.follow(self.ref)
            except RunnerError as exc:
                self._mark_lost(exc)
                return
            self._stream = stream
            seen = 0
            for line in stream:
                seen += 1
                if seen <= skip:
                    continue  # a re-attached tail replays the log from its start
                self._feed(line)
            skip = max(skip, seen)
            if self._closing.is_set():
                return
            if stream.exit_code is not None:
                # tail --pid ended: the wrapper (process-group leader) has exited.
                try:
                    code = self.host.exit_code(self.ref)
                except RunnerError:
                    code = None
                self._mark_dead(code)
                return
            # Stream lost (connection dropped). Is the host still there?
            try:
                alive = self.host.alive(self.ref)
            except RunnerError as exc:
                self._mark_lost(exc)
                return
            if not alive:
                self._mark_dead(self.host.exit_code(self.ref))
                return

    def _mark_dead(self, code: int | None) -> None:
        with self._changed:
            if self._died_at is None:
                self._died_at = time.monotonic()
            self.exit_code = code
            self._dead.set()
            self._changed.notify_all()

    def _mark_lost(self, exc: RunnerError | None = None) -> None:
        with self._changed:
            self._lost_error = self._lost_error or exc
            self._lost.set()
            self._changed.notify_all()

    def _lost_failure(self, reason: str) -> Failure:
        """Why the host was lost: a permanent fault of the host (a host key that changed mid-run) is its own
        kind and line, so the host is dropped at once; anything else is HOST_UNREACHABLE with ``reason``."""
        exc = self._lost_error
        if exc is not None and kind_of_error(exc) is not FailureKind.HOST_UNREACHABLE:
            return Failure(kind_of_error(exc), self.parser.phase, str(exc))
        return Failure(FailureKind.HOST_UNREACHABLE, self.parser.phase, reason)

    def _feed(self, line: str) -> None:
        with self._changed:
            before_phase, before_fatal = self.parser.phase, self.parser.fatal
            self.lines.append(line)
            self.parser.feed(line)
            phase, fatal = self.parser.phase, self.parser.fatal
            if fatal is not None and before_fatal is None:
                self._fatal_seen_at = time.monotonic()
            self._changed.notify_all()
        if phase != before_phase:
            self._on_event(PhaseReached(phase))
        if fatal is not None and before_fatal is None:
            self._on_event(FatalSeen(fatal))

    def _sample_smi(self) -> None:
        # While the load runs, samples come at least every BENCH_SMI_INTERVAL s: the power of a level is read
        # from its own samples only (a simulated level can be short).
        while not self._closing.wait(min(self.smi_interval, BENCH_SMI_INTERVAL) if self._loading.is_set()
                                     else self.smi_interval):
            if self._dead.is_set():
                return
            try:
                sample = self.host.smi_sample()
            except (RunnerError, ValueError):
                continue
            with self._lock:
                self.smi_samples.append(sample)

    @property
    def dead(self) -> bool:
        return self._dead.is_set()

    @property
    def lost(self) -> bool:
        """The host was lost while the server ran (its fate is unknown)."""
        return self._lost.is_set()

    @property
    def death_seen_at(self) -> float | None:
        """``time.monotonic()`` of the first sign of death: the first fatal log line, else the exit; None while
        neither was seen. Which rank of a multi-node server died first is the one with the earliest."""
        with self._lock:
            seen = [t for t in (self._fatal_seen_at, self._died_at) if t is not None]
        return min(seen) if seen else None

    def dying(self) -> bool:
        """Dead, or a fatal line was logged long enough ago that the server is as good as dead."""
        return self._dying()

    def _dying(self) -> bool:
        """Dead, or a fatal line was logged long enough ago that the server is as good as dead."""
        if self._dead.is_set():
            return True
        return self._fatal_seen_at is not None and time.monotonic() - self._fatal_seen_at > _FATAL_TO_EXIT

    def oom_evidence(self) -> dict[str, Any]:
        """The host's evidence of OOM kills in the server's memory cgroup (empty without a memory limit)."""
        if self.memory_limit_bytes is None or self.ref is None:
            return {}
        with contextlib.suppress(RunnerError):
            self._note_evidence(self.host.oom_evidence(self.ref))
        return dict(self.evidence)

    def _note_evidence(self, evidence: Mapping[str, Any]) -> None:
        """Keep the cgroup evidence and put its figures into the telemetry (GiB, like the rest)."""
        if not evidence:
            return
        self.evidence = dict(evidence)
        extra = self.parser.telemetry.extra
        names = {"memory_limit_bytes": "cgroup_limit_gib", "memory_peak_bytes": "cgroup_peak_gib"}
        for key, name in names.items():
            value = evidence.get(key)
            if isinstance(value, int):
                extra[name] = round(value / 2**30, 3)
        if isinstance(evidence.get("oom_kill"), int):
            extra["cgroup_oom_kill"] = evidence["oom_kill"]

    def failure(self) -> Failure:
        """Classify the death from the parsed log, the exit code, the log tail and the host's OOM evidence."""
        if self.ref is not None:
            with contextlib.suppress(RunnerError):
                ended = self.host.scheduler_end(self.ref)
                if ended is not None:
                    return Failure(ended.kind, ended.phase or self.parser.phase, ended.reason, self.exit_code)
        with self._lock:
            tail = "\n".join(self.lines.last(400))
        evidence = self.oom_evidence()
        failure = self.engine.classify(self.parser, self.exit_code, tail, evidence=evidence or None)
        failure = self._not_the_config(failure, tail)
        if failure.phase is None:
            failure = Failure(failure.kind, self.parser.phase, failure.reason, failure.exit_code)
        return failure

    def _not_the_config(self, failure: Failure, tail: str) -> Failure:
        """Re-blame a death the engine calls an OOM or a crash when the host caused it: another process
        appeared on the GPUs during the trial (:meth:`_foreign_on_gpus`), the port was taken (``address
        already in use``), or the server was stopped by a signal servetune did not send
        (:data:`_OUTSIDE_SIGNALS`) or exited 0 unasked."""
        if failure.kind is FailureKind.OOM:
            foreign = self._foreign_on_gpus(tail)
            if foreign:
                return Failure(FailureKind.HOST_BUSY, failure.phase,
                               f"{foreign}; the engine's error: {failure.reason}", failure.exit_code)
            return failure
        if _ADDRESS_IN_USE in tail.lower():
            return Failure(FailureKind.PORT_IN_USE, failure.phase,
                           f"the server could not bind port {int(self.launch.port)} on {self.host.name}: "
                           "address already in use (another program holds it)", failure.exit_code)
        code = self.exit_code
        if failure.kind is FailureKind.CRASH and not self._closing.is_set() and (
                code == 0 or code in _OUTSIDE_SIGNALS):
            how = "exited 0 without being asked" if code == 0 else (
                f"was stopped by {_OUTSIDE_SIGNALS[code]} (exit {code}), which servetune did not send")
            return Failure(FailureKind.STOPPED_FROM_OUTSIDE, failure.phase,
                           f"the server {how}", failure.exit_code)
        return failure

    def _foreign_on_gpus(self, tail: str) -> str:
        """Why the GPUs were not the server's alone ("" when nothing says so): a compute process of another
        program on them now (nvidia-smi, pids outside the server's process group), or the engine's own
        "occupied by other processes" warning in the log. The preflight found them free before the launch."""
        if self.smi_interval > 0 and self.ref is not None:
            with contextlib.suppress(RunnerError, ValueError):
                apps = self.host.foreign_apps(self.ref)
                if apps:
                    listed = ", ".join(f"pid {a.pid} ({a.used_mib:.0f} MiB)" if a.used_mib is not None
                                       else f"pid {a.pid}" for a in apps[:5])
                    return (f"another process appeared on the GPUs of {self.host.name} during the trial "
                            f"(nvidia-smi: {listed})")
        if _OTHER_PROCESSES in tail:
            return (f"another process appeared on the GPUs of {self.host.name} during the trial (the engine's "
                    f"log: 'Some GPUs {_OTHER_PROCESSES}')")
        return ""

    def log_text(self) -> str:
        with self._lock:
            return self.lines.text()

    def log_tail(self, n: int = 80) -> str:
        with self._lock:
            return "\n".join(self.lines.last(n))

    def smi_peak_mib(self) -> float | None:
        """Highest memory.used of any GPU over the load window (the samples taken since the benchmark
        started), None when no sample fell in it: a peak taken while the weights loaded is not a peak under
        load, and a server that died between two samples left none of its last memory. Samples of empty GPUs
        (0 MiB used: the server had already died and freed its memory) are no peak of it either."""
        with self._lock:
            start = self._load_started_at
            per_gpu = [max((g.used_mib or 0) for g in gpus) for ts, gpus in self.smi_samples
                       if gpus and start is not None and ts >= start]
        peak = max(per_gpu) if per_gpu else None
        return peak if peak else None

    def smi_csv(self) -> str:
        rows = ["timestamp,index,name,memory.total [MiB],memory.used [MiB],memory.free [MiB],utilization.gpu [%],"
                "power.draw [W]"]
        with self._lock:
            for ts, gpus in self.smi_samples:
                for g in gpus:
                    rows.append(f"{ts:.3f},{g.index},{g.name},{_n(g.total_mib)},{_n(g.used_mib)},"
                                f"{_n(g.free_mib)},{_n(g.utilization_pct)},{_n(g.power_w)}")
        return "\n".join(rows) + "\n"

    # ---- HTTP on the host ----------------------------------------------------------------------

    def http_get(self, path: str, *, timeout: float = 10.0) -> tuple[int, str]:
        """GET ``path`` from the server *on the host* (bash /dev/tcp), so it works behind SSH too."""
        res = self._beside().run_script("http_get.sh", int(self.launch.port), path, f"{timeout:g}",
                                        timeout=timeout + 10)
        if res.rc == 7 or not res.stdout:
            return 0, ""
        head, _, body = res.stdout.partition("\r\n\r\n")
        try:
            status = int(head.split()[1])
        except (IndexError, ValueError):
            return 0, ""
        return status, body

    def power_during(self, start: float, end: float, *, gpus: int) -> float | None:
        """Mean ``power.draw`` (W) summed over the server's ``gpus`` GPUs (those holding the most memory), over the
        nvidia-smi samples taken between ``start`` and ``end`` (wall clock); None without a sample there or
        without power figures."""
        totals: list[float] = []
        after: list[float] = []
        before: list[float] = []
        slack = max(2.0, 4 * max(self.smi_interval, BENCH_SMI_INTERVAL))
        with self._lock:
            for ts, sample in self.smi_samples:
                ours = sorted(sample, key=lambda g: -(g.used_mib or 0))[:max(1, gpus)]
                if not ours or any(g.power_w is None for g in ours):
                    continue
                watts = sum(g.power_w or 0.0 for g in ours)
                if start <= ts <= end:
                    totals.append(watts)
                elif end < ts <= end + slack and not after:
                    after.append(watts)
                elif start - slack <= ts < start:
                    before = [watts]
        # A level shorter than the sampling period (a fast simulated one, or a sampler slowed by a busy host):
        # nvidia-smi's power.draw is an average over the period before a sample, so the first sample after the
        # window reads the load; failing that, the last one before it (the level before, or the warm-up's load).
        totals = totals or after or before
        return sum(totals) / len(totals) if totals else None

    def answers(self, plan: AnswerPlan) -> tuple[list[dict[str, Any]], str]:
        """Ask the server ``plan``'s prompts greedily (``answers.py`` on the host): one record per prompt (its
        ``text``, ``tokens``, ``logprobs``, ``error``), and an error line when the probe itself failed."""
        assert self.ref is not None
        args = [self.python, "answers.py", "--base-url", f"http://127.0.0.1:{int(self.launch.port)}",
                "--model", plan.model, "--prompts", plan.prompts_file, "--max-tokens", str(plan.max_tokens),
                "--timeout", f"{plan.timeout:g}"]
        cmd = f"cd {shlex.quote(self.ref.run_dir)} && exec " + " ".join(shlex.quote(a) for a in args)
        try:
            # Beside the server (a Slurm job's head node): 127.0.0.1 is the server's machine, not the login node.
            res = self._beside().run(cmd, timeout=plan.timeout + 30)  # the probe bounds itself; 30 s to say so
        except RunnerError as exc:
            return [], str(exc)
        records = [r for r in (_answer_record(line) for line in res.stdout.splitlines()) if r is not None]
        if res.rc != 0 and not records:
            return [], f"the correctness probe exited with {res.rc}: {res.stderr.strip()[-300:]}"
        return records, ""

    # ---- readiness -----------------------------------------------------------------------------

    def wait_ready(self, timeout: float, *, poll: float = 0.25) -> Failure | None:
        """Block until ready (None) or return why it never got there.

        Ready = the engine's readiness line (when it has one), ``/health`` 200, and the port's listening
        socket held by a member of our process group. A foreign listener answering ``/health`` returns
        ``port_in_use`` (it is never measured); a dead server, a fatal line, a lost host or the timeout each
        return a Failure.
        """
        deadline = time.monotonic() + timeout
        next_health = 0.0
        while True:
            with self._changed:
                if not (self._dying() or self._lost.is_set()):
                    wait = 0.1 if self._fatal_seen_at is not None else poll
                    self._changed.wait(timeout=wait)
                dying, lost = self._dying(), self._lost.is_set()
                ready_line = self.parser.ready_line
            if dying:
                return self.failure()
            if lost:
                return self._lost_failure(f"lost {self.host.name} while the server was starting")
            now = time.monotonic()
            if now > deadline:
                return Failure(FailureKind.STARTUP_TIMEOUT, self.parser.phase,
                               f"not ready after {timeout:g}s (last phase: {self.parser.phase.value})")
            waiting = self._fatal_seen_at is not None or (self.engine.needs_ready_line and not ready_line)
            if waiting or now < next_health:
                continue
            next_health = now + poll
            done, failure = self._health_check()
            if done:
                return failure

    def _health_check(self) -> tuple[bool, Failure | None]:
        """One look at ``/health`` and the port: (False, None) while not ready yet, (True, None) once ready
        (and noted so), (True, failure) when it never will be."""
        try:
            status, _ = self.http_get(self.engine.health_path, timeout=5)
        except HostUnreachable:
            return True, Failure(FailureKind.HOST_UNREACHABLE, self.parser.phase,
                                 f"lost {self.host.name} while waiting for /health")
        if status != 200:
            return False, None
        holder = self._port_holder()
        if holder == "foreign":
            return True, Failure(FailureKind.PORT_IN_USE, self.parser.phase,
                                 f"port {int(self.launch.port)} on {self.host.name} answers /health but is held "
                                 "by a program that is not this trial's server; it is not measured")
        if holder == "free":
            return False, None  # answered, but our group holds no listening socket yet: not ours
        self._read_server_info()
        if self.parser.phase in (Phase.STARTING, Phase.WARMUP, Phase.CUDA_GRAPH, Phase.KV_POOL):
            self.parser.phase = Phase.READY
        self._on_event(ServerReady(dict(self.server_info)))
        return True, None

    def _port_holder(self) -> str:
        """``ours``/``foreign``/``free``/``unknown`` for the server's port; a lost host counts as unknown
        (the follower reports the loss)."""
        try:
            return self.host.port_holder(int(self.launch.port), self.ref)
        except RunnerError:
            return "unknown"

    def _read_server_info(self) -> None:
        for path in self.engine.info_paths:
            try:
                status, body = self.http_get(path, timeout=10)
            except RunnerError:
                return
            if status == 200:
                try:
                    self.server_info = json.loads(body)
                except ValueError:
                    continue
                break
        info = self.server_info
        if not info:
            return
        tele = self.parser.telemetry
        for key in ("max_total_num_tokens", "max_running_requests", "chunked_prefill_size", "mem_fraction_static"):
            if getattr(tele, key) is None and isinstance(info.get(key), int | float):
                setattr(tele, key, info[key])
        if info.get("simulated"):
            tele.simulated = True
            tele.extra["sim_speed"] = info.get("sim_speed")

    # ---- benchmark -----------------------------------------------------------------------------

    def benchmark(self, plan: BenchPlan, *, timeout: float,
                  on_partial: Callable[[Mapping[str, Any]], bool] | None = None) -> BenchResult:
        """Run the load generator on the host; stop at once if the server dies or the host is lost.

        ``on_partial``: asked about the load generator's partial record (``plan.early_look``); True stops the
        sweep there (the stop file is created in the run directory), and the level's record is then that partial
        figure, marked ``stopped_early``."""
        assert self.ref is not None
        with self._lock:
            if self._load_started_at is None:
                self._load_started_at = time.time()  # the smi samples' clock (Host.smi_sample)
        args = [
            self.python, "loadgen.py",
            "--base-url", f"http://127.0.0.1:{int(self.launch.port)}",
            "--api", plan.api, "--model", plan.model,
            "--levels", ",".join(map(str, plan.levels)),
            "--requests", ",".join(map(str, plan.requests)),
            "--input-len", str(plan.input_len), "--output-len", str(plan.output_len),
            "--warmup", str(plan.warmup), "--timeout", f"{plan.timeout:g}",
            "--out", "bench.jsonl", "--time-scale", "auto", *plan.loadgen_args(),
        ]
        cmd = f"cd {shlex.quote(self.ref.run_dir)} && exec " + " ".join(shlex.quote(a) for a in args)
        result = BenchResult()
        try:
            stream = self._beside().stream(cmd)
        except RunnerError as exc:
            result.failure = Failure(kind_of_error(exc), Phase.SERVING, str(exc))
            return result
        lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            try:
                for line in stream:
                    lines.put(line)
            finally:
                lines.put(None)

        pumper = threading.Thread(target=pump, name=f"bench-{self.run_id}", daemon=True)
        self._loading.set()
        window_start = time.time()
        pumper.start()
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self._dying():
                    result.failure = self.failure()
                    break
                if self._lost.is_set():
                    result.failure = self._lost_failure(f"lost {self.host.name} during the benchmark")
                    break
                if time.monotonic() > deadline:
                    result.failure = Failure(FailureKind.BENCHMARK_TIMEOUT, self.parser.phase,
                                             f"benchmark did not finish in {timeout:g}s")
                    break
                try:
                    line = lines.get(timeout=0.05)
                except queue.Empty:
                    continue
                if line is None:
                    result.failure = self._bench_end(stream.exit_code, result)
                    break
                window_start = self._take(_json_record(line), result, window_start, on_partial)
        finally:
            self._loading.clear()
            stream.close()
            pumper.join(timeout=5)
        return result

    def _take(self, record: dict[str, Any] | None, result: BenchResult, window_start: float,
              on_partial: Callable[[Mapping[str, Any]], bool] | None) -> float:
        """One record of the load generator: a level's (kept, its load window noted) or the early look's partial
        one (``on_partial`` asked). Returns when the next level's window starts."""
        if record is None:
            return window_start
        if record.get("partial"):
            if on_partial is not None and on_partial(record):
                self._stop_load()
            return window_start
        now = time.time()
        self.level_windows.append((window_start, now))
        result.levels.append(record)
        self._on_event(LevelDone(record))
        return now

    def _stop_load(self) -> None:
        """Create the stop file the load generator watches after its early look."""
        assert self.ref is not None
        try:
            self._beside().run(f"touch {shlex.quote(self.ref.run_dir)}/{STOP_FILE}", timeout=30)
        except RunnerError as exc:  # the load then runs to its end: a cost, not a wrong figure
            log.warning("could not stop the load generator after its early look: %s", exc)

    def _bench_end(self, code: int | None, result: BenchResult) -> Failure | None:
        lie = next((e for level in result.levels for e in level.get("errors") or ()
                    if isinstance(e, str) and e.startswith(IMPLAUSIBLE)), None)
        if lie is not None:  # the server's figures contradict what was asked: no figure of it is believed
            return Failure(FailureKind.IMPLAUSIBLE_FIGURE, self.parser.phase, lie)
        failed = any(level.get("failed") for level in result.levels)
        if code == 0 and result.levels and not failed:
            return None
        if code == EXIT_STOPPED and result.levels and result.levels[-1].get("stopped_early"):
            return None  # stopped after the early look, as asked: the requests not sent are not failures
        # Requests failed or the load generator stopped early: most likely the server died under load.
        # The follower sees the exit within a poll; give it that moment, then ask the host directly.
        with self._changed:
            self._changed.wait_for(lambda: self._dead.is_set() or self.parser.fatal is not None, timeout=2.0)
        if not self._dying() and self.parser.fatal is None and self.ref is not None:
            try:
                if not self.host.alive(self.ref):
                    with self._changed:
                        self._changed.wait_for(self._dead.is_set, timeout=2.0)
            except RunnerError as exc:
                self._mark_lost(exc)
                return self._lost_failure("host lost after the benchmark")
        if self._dying() or self.parser.fatal is not None:
            with self._changed:
                self._changed.wait_for(self._dead.is_set, timeout=_FATAL_TO_EXIT)
            return self.failure()
        if code == 0 and result.levels:
            return None  # some requests failed, but the server is alive and the sweep finished
        if code is None:
            return Failure(FailureKind.HOST_UNREACHABLE, self.parser.phase, "load generator connection lost")
        return Failure(FailureKind.INFRA, self.parser.phase, f"load generator exited with {code}")


def _answer_record(line: str) -> dict[str, Any] | None:
    try:
        data = json.loads(line)
    except ValueError:
        return None
    return data if isinstance(data, dict) and "index" in data else None


def _json_record(line: str) -> dict[str, Any] | None:
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        data = json.loads(line)
    except ValueError:
        return None
    return data if isinstance(data, dict) and "max_concurrency" in data else None


def _ignore(event: ServerEvent) -> None:
    pass


def _n(value: float | None) -> str:
    return "" if value is None else f"{value:g}"


class HasTelemetry(Protocol):
    """What :func:`merge_smi_peak` reads of a session (one server's, or a multi-node server's)."""

    @property
    def parser(self) -> LogParser: ...

    def smi_peak_mib(self) -> float | None: ...


def merge_smi_peak(session: HasTelemetry) -> dict[str, Any]:
    """The session's telemetry as a dict, with the nvidia-smi peak folded in."""
    tele = session.parser.telemetry
    peak = session.smi_peak_mib()
    if peak is not None:
        tele.smi_peak_used_mib = peak
    return tele.to_dict()
