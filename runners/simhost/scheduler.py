"""The simulated server's scheduler thread: SGLang's continuous batching (:mod:`runners.simhost.engine`) run
on a clock compressed by the server's speed, with SGLang's prefill, decode and retraction log lines."""

from __future__ import annotations

import queue
import threading
import time
from typing import Protocol

from runners.simhost import texts
from runners.simhost.engine import Batch, BatchEngine, Retraction, RuntimeSpec, SimRequest
from runners.simhost.gpumem import GpuMemory
from runners.simhost.launch import SimLaunch
from runners.simhost.model import Failure
from runners.simhost.simlog import SimLog

# A batch that starts late by less than this starts at its scheduled time (absorbing Python's own
# overhead between batches); a longer hiccup shifts the timeline, as a stalled GPU step would.
_CATCH_UP_S = 0.002


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
    """Tokens for one request, delivered by the scheduler when a batch ends."""

    def __init__(self) -> None:
        self.q: queue.SimpleQueue[tuple[int, bool]] = queue.SimpleQueue()

    def put(self, n: int, finished: bool) -> None:
        self.q.put((n, finished))

    def get(self) -> tuple[int, bool]:
        return self.q.get()


class Scheduler(threading.Thread):
    """SGLang's scheduler loop on the simulated clock: forms batches (:class:`BatchEngine`), waits them out,
    delivers tokens to each request's :class:`TokenChannel` and logs SGLang's batch lines."""

    def __init__(self, server: SchedulerHost, spec: RuntimeSpec) -> None:
        super().__init__(name="sim-scheduler", daemon=True)
        self.server = server
        self.engine = BatchEngine(spec, first_forward_done=False)
        self.spec = spec
        self.speed = server.speed
        self.inbox: queue.SimpleQueue[tuple[str, SimRequest]] = queue.SimpleQueue()
        self.wake = threading.Event()
        self.t0 = time.monotonic()
        self.deadline = 0.0
        self.last_gen_throughput = 0.0
        self._log_tokens = 0
        self._log_t = time.monotonic()
        self._next_decode_log = server.launch.decode_log_interval
        self._busy = False
        self._util = 0
        self._last_batch = 0.0

    def sim_now(self) -> float:
        return (time.monotonic() - self.t0) * self.speed

    def submit(self, req: SimRequest) -> None:
        self.inbox.put(("add", req))
        self.wake.set()

    def abort(self, req: SimRequest) -> None:
        self.inbox.put(("abort", req))
        self.wake.set()

    def _drain(self) -> None:
        while True:
            try:
                op, req = self.inbox.get_nowait()
            except queue.Empty:
                return
            if op == "add":
                self.engine.add(req)
            else:
                self.engine.abort(req)

    def run(self) -> None:
        while True:
            self.wake.clear()
            self._drain()
            batch = self.engine.next_batch()
            if batch is None:
                # A GPU between two requests of a closed loop still reads as busy (nvidia-smi's utilization is
                # an average over its sample period): idle only after IDLE_AFTER_S without a batch.
                now = time.monotonic()
                if self._busy and now - self._last_batch >= IDLE_AFTER_S:
                    self._busy = False
                    self._util = 0
                    self.server.gpu_memory.set_util(0)
                self.wake.wait(timeout=IDLE_AFTER_S if self._busy else 1.0)
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
            end = self._wait_out(wall)
            emissions = self.engine.commit(batch, (end - self.t0) * self.speed)
            for em in emissions:
                if isinstance(em.request.sink, TokenChannel):
                    em.request.sink.put(em.new_tokens, em.finished)
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

