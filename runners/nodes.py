"""A server that spans nodes, from launch to verified stop: one :class:`~runners.server.ServerSession` per rank,
watched together.

:class:`NodeSession` answers what a trial asks of one server (start, wait until ready, benchmark, stop, why it
died, its telemetry and logs), so the trial's code does not change with the node count:

* every rank starts detached in its own process group on its own host, all at once (the ranks wait for each
  other at init, so one started late only delays the meeting);
* ready means the head (rank 0) is ready, as a one-node server is, *and* every other rank is alive;
* the first death of any rank ends the trial: every rank is stopped, in parallel, and each host's stop is
  verified (its process group gone) before the trial's outcome is written;
* the verdict is the first rank to die (the earliest fatal line or exit), in its phase, for its reason: the other
  ranks die after it of the NCCL error its death causes, which says nothing of the configuration;
* its telemetry is the *binding* rank's: the rank that died first, else the one with the least GPU memory left
  after start-up, which is the one a memory model must learn from.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from runners.engines.base import LogParser
from runners.host import StopResult
from runners.server import BenchPlan, BenchResult, ServerSession
from runners.telemetry import Failure, FailureKind, Phase

__all__ = ["NodeSession"]

_T = TypeVar("_T")
_STOP_ORDER = {"gone": 0, "term": 1, "kill": 2}


def _parallel(calls: Sequence[Callable[[], _T]]) -> list[_T | BaseException]:
    """Run ``calls`` at once; each one's result or the exception it raised, in order."""
    def run(call: Callable[[], _T]) -> _T | BaseException:
        try:
            return call()
        except Exception as exc:  # handed back to the caller, which decides
            return exc

    with ThreadPoolExecutor(max_workers=max(1, len(calls))) as pool:
        return list(pool.map(run, calls))


class NodeSession:
    """Context manager over the ranks' sessions (``sessions[0]`` is the head, rank 0)."""

    def __init__(self, sessions: Sequence[ServerSession]) -> None:
        if not sessions:
            raise ValueError("a server needs at least one rank")
        self.sessions = list(sessions)
        self.head = self.sessions[0]
        self.stop_result: StopResult | None = None
        self.stop_results: list[StopResult | None] = [None] * len(self.sessions)
        self._stopped = threading.Lock()

    def __enter__(self) -> NodeSession:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- lifetime ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start every rank at once; if one cannot start, stop those that did and raise its error."""
        results = _parallel([s.start for s in self.sessions])
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            self.stop()
            raise errors[0]

    def wait_scheduled(self, abort: threading.Event, *, timeout: float | None = None) -> Failure | None:
        """Wait until every rank holds its resources (plain hosts: at once); the first failure ends the wait."""
        for session in self.sessions:
            failure = session.wait_scheduled(abort, timeout=timeout)
            if failure is not None:
                return failure
        return None

    @property
    def queued_s(self) -> float | None:
        """The longest wait of a rank for its resources; None when none waited."""
        waits = [s.queued_s for s in self.sessions if s.queued_s is not None]
        return max(waits) if waits else None

    def stop(self) -> StopResult | None:
        """Stop every rank in parallel and verify each is gone. Idempotent. The result is the slowest stop
        (the hardest method, the longest time, every survivor)."""
        with self._stopped:
            if self.stop_result is not None:
                return self.stop_result
            results = _parallel([s.stop for s in self.sessions])
            done = [r if isinstance(r, StopResult) else None for r in results]
            self.stop_results = done
            found = [r for r in done if r is not None]
            if found:
                self.stop_result = StopResult(
                    method=max((r.method for r in found), key=lambda m: _STOP_ORDER.get(m, 3)),
                    seconds=max(r.seconds for r in found),
                    survivors=tuple(p for r in found for p in r.survivors),
                    resent_term=any(r.resent_term for r in found),
                )
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                raise errors[0]
            return self.stop_result

    def check_gpus_free(self, *, timeout: float = 15.0) -> list[str]:
        """After the stop, wait on every node at once until its GPUs are free; one line per node whose GPUs
        are not (a rank's memory still held), empty when all are."""
        def check(session: ServerSession) -> Callable[[], object]:
            return lambda: session.host.wait_gpus_free(timeout=timeout)

        results = _parallel([check(s) for s in self.sessions])
        return [f"{s.host.name}: {r}" for s, r in zip(self.sessions, results, strict=True)
                if isinstance(r, BaseException)]

    # ---- who died first ------------------------------------------------------------------------

    def first_dead(self) -> int | None:
        """The rank that showed the first sign of death (fatal line or exit), or None while all live."""
        seen = [(s.death_seen_at, rank) for rank, s in enumerate(self.sessions) if s.death_seen_at is not None]
        return min(seen)[1] if seen else None

    def _ended(self) -> bool:
        return any(s.dying() or s.lost for s in self.sessions)

    def binding_rank(self) -> int:
        """The rank whose figures stand for the server: the first to die, else the one with the least GPU
        memory left after start-up (the head when none says)."""
        dead = self.first_dead()
        if dead is not None:
            return dead

        def left(rank: int) -> float:
            tele = self.sessions[rank].parser.telemetry
            free = tele.free_after_capture_gib
            return free if free is not None else float("inf")

        return min(range(len(self.sessions)), key=lambda r: (left(r), r))

    @property
    def parser(self) -> LogParser:
        """The binding rank's parser (its phase, telemetry and fatal line)."""
        return self.sessions[self.binding_rank()].parser

    @property
    def exit_code(self) -> int | None:
        return self.sessions[self.binding_rank()].exit_code

    @property
    def server_info(self) -> dict[str, Any]:
        return self.head.server_info

    def _named(self, rank: int) -> str:
        return f"rank {rank} of {len(self.sessions)} ({self.sessions[rank].host.name})"

    def failure(self) -> Failure:
        """Why the server died: the first rank to die, its phase and reason, named."""
        rank = self.first_dead()
        if rank is None:
            lost = next((r for r, s in enumerate(self.sessions) if s.lost), 0)
            return Failure(FailureKind.HOST_UNREACHABLE, self.sessions[lost].parser.phase,
                           f"lost {self.sessions[lost].host.name} ({self._named(lost)}) while the server ran")
        failure = self.sessions[rank].failure()
        where = failure.phase.value if failure.phase is not None else "?"
        return Failure(failure.kind, failure.phase, f"{self._named(rank)} died first, in {where}: {failure.reason}",
                       failure.exit_code)

    def rank_failures(self) -> list[Failure | None]:
        """Each rank's own reading of its death (None for a rank that did not die before the stop)."""
        return [s.failure() if s.death_seen_at is not None else None for s in self.sessions]

    # ---- readiness -----------------------------------------------------------------------------

    def wait_ready(self, timeout: float, *, poll: float = 0.25) -> Failure | None:
        """Block until the head is ready and every rank alive (None), or return why it never got there."""
        deadline = time.monotonic() + timeout
        while True:
            if self._ended():
                return self.failure()
            left = deadline - time.monotonic()
            if left <= 0:
                return Failure(FailureKind.STARTUP_TIMEOUT, self.head.parser.phase,
                               f"not ready after {timeout:g}s (last phase of rank 0: {self.head.parser.phase.value})")
            failure = self.head.wait_ready(min(left, 0.5), poll=poll)
            if failure is None:
                return self.failure() if self._ended() else None
            if failure.kind is not FailureKind.STARTUP_TIMEOUT:
                return self.failure() if self._ended() else failure

    # ---- benchmark -----------------------------------------------------------------------------

    def benchmark(self, plan: BenchPlan, *, timeout: float,
                  on_partial: Callable[[Mapping[str, Any]], bool] | None = None) -> BenchResult:
        """The load generator on the head; the death of any rank ends it at once (every rank is stopped)."""
        out: dict[str, BenchResult] = {}
        runner = threading.Thread(target=lambda: out.setdefault(
            "r", self.head.benchmark(plan, timeout=timeout, on_partial=on_partial)),
                                  name="bench-nodes", daemon=True)
        runner.start()
        while runner.is_alive():
            runner.join(timeout=0.1)
            workers_ended = any(s.dying() or s.lost for s in self.sessions[1:])
            if workers_ended:
                failure = self.failure()
                self.stop()
                runner.join(timeout=30)
                bench = out.get("r")
                return BenchResult(list(bench.levels) if bench else [], failure)
        bench = out["r"]
        if bench.failure is not None and self._ended():
            bench.failure = self.failure()
        return bench

    # ---- logs and figures ----------------------------------------------------------------------

    def log_text(self) -> str:
        """Every rank's log, each under a ``==> rank R of N (host) <==`` line."""
        return "".join(f"==> {self._named(r)} <==\n{s.log_text()}" for r, s in enumerate(self.sessions))

    def log_tail(self, n: int = 80) -> str:
        rank = self.binding_rank()
        return f"==> {self._named(rank)} <==\n{self.sessions[rank].log_tail(n)}"

    def smi_peak_mib(self) -> float | None:
        peaks = [p for p in (s.smi_peak_mib() for s in self.sessions) if p is not None]
        return max(peaks) if peaks else None

    def smi_csv(self) -> str:
        return self.sessions[self.binding_rank()].smi_csv()

    @property
    def phase(self) -> Phase:
        return self.parser.phase
