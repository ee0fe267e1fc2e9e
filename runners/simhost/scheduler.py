"""The simulated server's scheduler thread: SGLang's continuous batching (:mod:`runners.simhost.engine`) run
on the server's own simulated clock, paced at the server's speed, with SGLang's prefill, decode and retraction
log lines.

The simulated clock is not the wall clock times the speed. It advances by exactly each batch's simulated
duration, and by the wall clock (times the speed) only while the server has nothing to do and nobody to wait
for. Every streamed chunk carries the simulated time its tokens were produced (``sim_time_s``), so a client
that reads those times measures the model, not how busy the machine running it is: a batch that ends late on
the wall clock, or a client that is slow to send its next request, moves no simulated figure.

A load generator that wants exact figures declares its level with each request (simulator-only body fields,
ignored otherwise): ``sim_level`` (an id), ``sim_level_requests`` (N) and ``sim_level_concurrency`` (C), and
per request ``sim_after_s`` (the simulated time the slot it takes was freed: the previous request's last
chunk) and ``sim_offset_s`` (an open loop's planned arrival after the level's start). The request arrives at
``max(level start + offset, after)``, in the future if need be. Knowing N and C, the scheduler waits (on the
wall clock, up to :data:`LEVEL_WAIT_S`) before each batch until every request that can arrive before that
batch starts has been received: C at the start, one more per request of the level that ended, N in all. So
the batches, and every simulated time, are what the pure model (:func:`runners.simhost.model.run_level`) gives
for the same arrivals, however late the client's requests are on the wall clock.
"""

from __future__ import annotations

import heapq
import itertools
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

from runners.simhost import texts
from runners.simhost.engine import Batch, BatchEngine, Retraction, RuntimeSpec, SimRequest
from runners.simhost.gpumem import GpuMemory
from runners.simhost.launch import SimLaunch
from runners.simhost.model import Failure
from runners.simhost.simlog import SimLog

# A batch that starts late by less than this starts at its scheduled time (absorbing Python's own
# overhead between batches); a longer hiccup shifts the wall-clock pacing (never the simulated clock).
_CATCH_UP_S = 0.002

LEVEL_WAIT_S = 10.0
"""How long (wall clock) the scheduler waits for a declared level's next request before it gives up waiting
for that level (a client that went away, or stopped early); from then on its requests arrive when they come."""


#: Wall seconds without a batch before the simulated GPU reads as idle.
IDLE_AFTER_S = 0.5


def _utilization(batch: Batch, max_running: int) -> int:
    """``utilization.gpu`` while ``batch`` runs: a prefill keeps the GPU busy; a decode step fills it with its
    batch (a third busy with one request, full at the largest running batch), so power rises with the load."""
    if batch.kind != "decode" or not batch.decode_steps:
        return 100
    n = max(size for size, _, _ in batch.decode_steps)
    return min(100, round(35 + 65 * n / max(1, max_running)))


class SchedulerHost(Protocol):
    """What the scheduler needs of the server it runs in (:class:`runners.simhost.server.SimServer`)."""

    @property
    def speed(self) -> float: ...
    @property
    def launch(self) -> SimLaunch: ...
    @property
    def log(self) -> SimLog: ...
    @property
    def v(self) -> tuple[int, int, int]: ...
    @property
    def first_forward_failure(self) -> Failure | None: ...
    @property
    def gpu_memory(self) -> GpuMemory: ...

    def die_first_forward(self, failure: Failure) -> None: ...
    def die_runtime(self, batch: Batch) -> None: ...


class TokenChannel:
    """Tokens for one request, delivered by the scheduler when a batch ends, with the simulated time the
    batch ended."""

    def __init__(self) -> None:
        self.q: queue.SimpleQueue[tuple[int, bool, float]] = queue.SimpleQueue()

    def put(self, n: int, finished: bool, sim_time_s: float) -> None:
        self.q.put((n, finished, sim_time_s))

    def get(self) -> tuple[int, bool, float]:
        return self.q.get()


@dataclass(frozen=True)
class LevelHint:
    """What a request says of the load it belongs to (the ``sim_level*`` body fields); see the module doc."""

    level: str
    requests: int
    concurrency: int
    after_s: float | None = None
    offset_s: float | None = None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> LevelHint | None:
        """The hint a request body carries, or None when it carries none (or a malformed one)."""
        level, n, c = body.get("sim_level"), body.get("sim_level_requests"), body.get("sim_level_concurrency")
        if not isinstance(level, str) or not isinstance(n, int) or not isinstance(c, int):
            return None
        if not _positive_int(n) or not _positive_int(c):
            return None
        after, offset = body.get("sim_after_s"), body.get("sim_offset_s")
        return cls(level, n, c, _time_or_none(after), _time_or_none(offset))


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _time_or_none(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 else None


@dataclass
class _Level:
    """A declared level's bookkeeping: when it started, requests received, requests that ended."""

    requests: int
    concurrency: int
    start_s: float
    received: int = 0
    ended: int = 0
    heard_wall: float = 0.0

    @property
    def expected(self) -> int:
        """Requests that can have arrived by now: C at the start, one more per request that ended."""
        return min(self.requests, self.concurrency + self.ended)


class Scheduler(threading.Thread):
    """SGLang's scheduler loop on the simulated clock: forms batches (:class:`BatchEngine`), waits them out,
    delivers tokens to each request's :class:`TokenChannel` and logs SGLang's batch lines."""

    def __init__(self, server: SchedulerHost, spec: RuntimeSpec) -> None:
        super().__init__(name="sim-scheduler", daemon=True)
        self.server = server
        self.engine = BatchEngine(spec, first_forward_done=False)
        self.spec = spec
        self.speed = server.speed
        self.inbox: queue.SimpleQueue[tuple[str, SimRequest, LevelHint | None]] = queue.SimpleQueue()
        self.wake = threading.Event()
        self.deadline = 0.0
        self.clock_s = 0.0  # the simulated clock: the end of the last batch, or later after idle time
        self._idle_since = time.monotonic()  # wall time from which idle time advances the clock
        self._idle = True
        self._levels: dict[str, _Level] = {}
        self._level_of: dict[int, str] = {}  # id(request) -> its declared level
        self._future: list[tuple[float, int, SimRequest]] = []  # requests that arrive later (a heap)
        self._order = itertools.count()
        self._jump: tuple[float, float] | None = None  # (planned arrival, wall time to jump to it)
        self.last_gen_throughput = 0.0
        self._log_tokens = 0
        self._log_t = time.monotonic()
        self._next_decode_log = server.launch.decode_log_interval
        self._busy = False
        self._util = 0
        self._last_batch = 0.0

    def sim_now(self) -> float:
        """The simulated clock now: advanced by the wall clock only while the scheduler is idle."""
        if self._idle:
            return self.clock_s + (time.monotonic() - self._idle_since) * self.speed
        return self.clock_s

    def submit(self, req: SimRequest, hint: LevelHint | None = None) -> None:
        self.inbox.put(("add", req, hint))
        self.wake.set()

    def abort(self, req: SimRequest) -> None:
        self.inbox.put(("abort", req, None))
        self.wake.set()

    def _set_idle(self, idle: bool) -> None:
        """Idle time moves the simulated clock; busy or waiting time does not."""
        if idle and not self._idle:
            self._idle_since = time.monotonic()
        elif not idle and self._idle:
            self.clock_s = self.sim_now()
        self._idle = idle

    def _drain(self) -> None:
        while True:
            try:
                op, req, hint = self.inbox.get_nowait()
            except queue.Empty:
                return
            if op == "add":
                self._arrive(req, hint)
            else:
                self._ended(req)
                self._future = [f for f in self._future if f[2] is not req]
                heapq.heapify(self._future)
                self.engine.abort(req)

    def _arrive(self, req: SimRequest, hint: LevelHint | None) -> None:
        """Stamp a request's simulated arrival and queue it (now, or in the future for a planned arrival)."""
        self._set_idle(False)
        now = self.clock_s
        arrival = now
        if hint is not None:
            level = self._levels.get(hint.level)
            if level is None:
                level = self._levels[hint.level] = _Level(hint.requests, hint.concurrency, start_s=now)
            level.received += 1
            level.heard_wall = time.monotonic()
            self._level_of[id(req)] = hint.level
            planned = [level.start_s + hint.offset_s] if hint.offset_s is not None else []
            after = [hint.after_s] if hint.after_s is not None else []
            arrival = max(planned + after) if planned or after else level.start_s
        req.arrival_s = arrival
        if arrival > self.clock_s:
            heapq.heappush(self._future, (arrival, next(self._order), req))
        else:
            self.engine.add(req)

    def _ended(self, req: SimRequest) -> None:
        """A request finished or was aborted: its level may now send one more."""
        name = self._level_of.pop(id(req), None)
        level = self._levels.get(name) if name is not None else None
        if level is None:
            return
        level.ended += 1
        if level.ended >= level.requests:
            del self._levels[name]  # type: ignore[arg-type]

    def _awaited(self) -> bool:
        """Whether a declared level still owes requests that could arrive before the next batch; a level
        silent for :data:`LEVEL_WAIT_S` is given up on."""
        now = time.monotonic()
        waiting = False
        for name, level in list(self._levels.items()):
            if level.received >= level.expected:
                continue
            if now - level.heard_wall > LEVEL_WAIT_S:
                del self._levels[name]
                continue
            waiting = True
        return waiting

    def _release_due(self) -> None:
        """Hand the engine every planned arrival the clock has reached."""
        while self._future and self._future[0][0] <= self.clock_s:
            self.engine.add(heapq.heappop(self._future)[2])

    def _next_batch(self) -> Batch | None:
        """The next batch at the simulated clock, once every request that can arrive before it has; None when
        there is nothing to run yet (the caller waits for a wake-up)."""
        if self._awaited():
            self._set_idle(False)
            self.wake.wait(timeout=0.5)
            return None
        self._release_due()
        batch = self.engine.next_batch()
        if batch is not None:
            self._set_idle(False)
            return batch
        if self._future:  # nothing runs until the next planned arrival: pace the gap, then jump to it
            self._set_idle(False)
            target = self._future[0][0]
            if self._jump is None or self._jump[0] != target:
                self._jump = (target, time.monotonic() + (target - self.clock_s) / self.speed)
            if not self.wake.wait(timeout=max(self._jump[1] - time.monotonic(), 0.0)):
                self.clock_s = target
                self._jump = None
            return None
        # A GPU between two requests of a closed loop still reads as busy (nvidia-smi's utilization is an average
        # over its sample period): idle only after IDLE_AFTER_S without a batch.
        if self._busy and time.monotonic() - self._last_batch >= IDLE_AFTER_S:
            self._busy = False
            self._util = 0
            self.server.gpu_memory.set_util(0)
        self._set_idle(True)
        self.wake.wait(timeout=IDLE_AFTER_S if self._busy else 1.0)
        return None

    def run(self) -> None:
        while True:
            self.wake.clear()
            self._drain()
            batch = self._next_batch()
            if batch is None:
                continue
            self._busy = True
            self._last_batch = time.monotonic()
            util = _utilization(batch, self.spec.max_running_requests)
            if util != self._util:
                self._util = util
                self.server.gpu_memory.set_util(util)
            wall = batch.duration_s / self.speed
            if batch.kind == "prefill":  # SGLang logs a prefill batch when it forms it, before running it
                self._log_prefill(batch, wall)
            if self.server.first_forward_failure is not None:
                self.server.die_first_forward(self.server.first_forward_failure)
            if batch.retraction is not None:
                self._log_retraction(batch.retraction)
            if batch.oom is not None:
                self.server.die_runtime(batch)
            self.server.gpu_memory.note_transient(batch, self.spec)
            self._wait_out(wall)
            self.clock_s += batch.duration_s
            emissions = self.engine.commit(batch, self.clock_s)
            for em in emissions:
                if em.finished:
                    self._ended(em.request)
                if isinstance(em.request.sink, TokenChannel):
                    em.request.sink.put(em.new_tokens, em.finished, self.clock_s)
            if batch.kind == "decode":
                self._log_decode(batch)

    def _log_retraction(self, rt: Retraction) -> None:
        self.server.log.line(
            texts.retract_line(
                self.server.v,
                retracted=len(rt.requests),
                gained=rt.tokens_gained,
                old_ratio=rt.old_ratio,
                new_ratio=rt.new_ratio,
            ),
            rank=0,
            level="warning" if self.server.v >= (0, 5, 10) else "info",
        )

    def _wait_out(self, wall: float) -> float:
        """Sleep until a batch of ``wall`` seconds, started at the previous batch's end when that is recent,
        is done; return its end (monotonic clock)."""
        now = time.monotonic()
        start = self.deadline if now - _CATCH_UP_S < self.deadline <= now else now
        end = start + wall
        delay = end - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        self.deadline = end
        return end

    def _log_prefill(self, batch: Batch, wall: float) -> None:
        eng = self.engine
        queued = len(eng.waiting) - sum(1 for r, _ in batch.prefill if r is not eng.chunked)
        self.server.log.line(
            texts.prefill_batch(
                self.server.v,
                new_seq=len(batch.prefill),
                new_token=batch.new_tokens,
                usage=eng.token_usage,
                running=len(eng.running),
                queued=max(queued, 0),
                throughput=batch.new_tokens / max(wall, 1e-9),
            ),
            rank=0,
        )

    def _log_decode(self, batch: Batch) -> None:
        v = self.server.v
        eng = self.engine
        self._log_tokens += sum(n for n, _, _ in batch.decode_steps)
        if eng.decode_steps_total >= self._next_decode_log:
            now = time.monotonic()
            self.last_gen_throughput = self._log_tokens / max(now - self._log_t, 1e-9)
            self.server.log.line(
                texts.decode_batch(
                    v,
                    running=len(eng.running),
                    tokens=eng.used_tokens,
                    usage=eng.token_usage,
                    graph=batch.graph,
                    throughput=self.last_gen_throughput,
                    queued=len(eng.waiting),
                ),
                rank=0,
            )
            self._log_tokens = 0
            self._log_t = now
            interval = max(self.server.launch.decode_log_interval, 1)
            self._next_decode_log = (eng.decode_steps_total // interval + 1) * interval

