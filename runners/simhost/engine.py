"""The continuous-batching scheduler of the simulated host, in simulated time.

One copy of the batching logic serves both :func:`runners.simhost.model.evaluate` (which drives it
on a virtual clock) and the HTTP server (which sleeps ``duration / sim_speed`` between batches), so a
prediction and a served run cannot drift apart.

The policy follows SGLang's default scheduler closely enough for memory and latency figures:

* new requests are prefilled first; a prefill batch holds at most
  ``min(chunked_prefill_size, max_prefill_tokens)`` new tokens (one request may be chunked across
  batches), at most ``max_running_requests`` requests run, and a request is admitted only if its
  prompt plus ``max_new_tokens`` fits in the KV pool (no retraction is simulated);
* the prefill emits each fully prefilled request's first token; otherwise a decode *round* of
  ``num_continuous_decode_steps`` steps runs, one token per running request per step, and its tokens
  are delivered when the round ends; new requests are only admitted between rounds;
* a decode step takes ``base + per_request * bs`` where ``bs`` is the captured graph size the batch is
  padded to, or, above the largest captured graph (or with graphs disabled), the eager time for the
  real batch size; eager steps and prefill batches allocate transient memory, and an allocation that
  does not fit makes the batch an OOM (the caller decides what dying means).
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

__all__ = ["Batch", "BatchEngine", "Emission", "OomDetail", "RuntimeSpec", "SimRequest", "oom_detail"]


class OomDetail(BaseModel):
    """Figures of one failed allocation, enough to print PyTorch's OutOfMemoryError text."""

    model_config = ConfigDict(frozen=True)

    tried_gib: float
    free_gib: float
    total_gib: float
    process_gib: float
    allocated_gib: float
    private_pool_gib: float
    reserved_unallocated_gib: float


def oom_detail(
    tried_gib: float,
    free_gib: float,
    *,
    total_gib: float,
    fragmentation_gib: float,
    non_torch_gib: float,
    torch_gib: float,
    transient_gib: float = 0.0,
    private_pool_gib: float = 0.0,
) -> OomDetail:
    """The figures PyTorch reports when ``tried_gib`` does not fit in ``free_gib``.

    PyTorch holds ``torch_gib + transient_gib``; the caching allocator keeps up to half the
    contiguity allowance reserved but unallocated (never more than is free).
    """
    reserved = min(fragmentation_gib / 2.0, max(free_gib, 0.0))
    return OomDetail(
        tried_gib=tried_gib,
        free_gib=max(free_gib, 0.0),
        total_gib=total_gib,
        process_gib=non_torch_gib + torch_gib + transient_gib + reserved,
        allocated_gib=torch_gib + transient_gib,
        private_pool_gib=private_pool_gib,
        reserved_unallocated_gib=reserved,
    )


class RuntimeSpec(BaseModel):
    """Everything the scheduler needs once the server is up (built by the model from a profile)."""

    model_config = ConfigDict(frozen=True)

    max_running_requests: int
    max_total_num_tokens: int
    chunked_prefill_size: int
    max_prefill_tokens: int
    captured_bs: tuple[int, ...]
    continuous_steps: int = 1
    # memory (GiB): free device memory when serving starts, and the contiguity allowance
    free_gib: float
    fragmentation_gib: float
    first_forward_gib: float = 0.0  # kept after the very first forward (if warm-up was skipped)
    prefill_mib_per_token: float
    prefill_largest_fraction: float
    eager_mib_per_request: float
    eager_largest_fraction: float
    # OOM text context
    total_gib: float
    non_torch_gib: float  # CUDA context + NCCL
    torch_static_gib: float  # weights + KV + pools + graphs held by PyTorch
    private_pool_gib: float
    # timing (ms) and the run's multiplicative factor (noise x NCCL all-reduce effect)
    decode_base_ms: float
    decode_per_request_ms: float
    scheduler_overhead_ms: float
    eager_multiplier: float
    eager_extra_ms: float
    prefill_base_ms: float
    prefill_per_token_ms: float
    torch_compile: bool = False
    torch_compile_max_bs: int = 32
    torch_compile_factor: float = 1.0
    time_factor: float = 1.0

    # -- timing ---------------------------------------------------------------------------------------------
    def graph_bs(self, n: int) -> int | None:
        """Captured batch size a decode batch of ``n`` is padded to, or None if it runs eagerly."""
        if not self.captured_bs or n > self.captured_bs[-1]:
            return None
        return self.captured_bs[bisect.bisect_left(self.captured_bs, n)]

    def decode_step_s(self, n: int) -> tuple[float, bool]:
        """Duration of one decode step with ``n`` running requests, and whether it used a CUDA graph."""
        base = self.decode_base_ms - self.scheduler_overhead_ms * (1.0 - 1.0 / self.continuous_steps)
        bs = self.graph_bs(n)
        if bs is not None:
            ms = base + self.decode_per_request_ms * bs
            if self.torch_compile and bs <= self.torch_compile_max_bs:
                ms *= self.torch_compile_factor
            return ms * self.time_factor / 1000.0, True
        ms = (base + self.decode_per_request_ms * n) * self.eager_multiplier + self.eager_extra_ms
        return ms * self.time_factor / 1000.0, False

    def prefill_s(self, tokens: int) -> float:
        return (self.prefill_base_ms + self.prefill_per_token_ms * tokens) * self.time_factor / 1000.0

    # -- memory ---------------------------------------------------------------------------------------------
    def prefill_gib(self, tokens: int) -> float:
        """Transient working set of a prefill batch of ``tokens`` new tokens."""
        return tokens * self.prefill_mib_per_token / 1024.0

    def eager_gib(self, n: int) -> float:
        """Transient working set of an eager decode step with ``n`` running requests."""
        return n * self.eager_mib_per_request / 1024.0

    def transient_oom(self, total_gib: float, largest_fraction: float, first_forward: bool) -> OomDetail | None:
        """Check a transient working set; ``None`` if it fits, else the failing allocation's figures.

        The buffers the first forward keeps (``first_forward_gib``) are held from the first batch on;
        with ``first_forward`` this batch is the one that allocates them. The working set is then
        allocated as ``total * (1 - largest_fraction)`` in small pieces and one allocation of
        ``total * largest_fraction``; each must fit in ``free - fragmentation``.
        """
        free = self.free_gib
        held = 0.0
        if first_forward and self.first_forward_gib > free - self.fragmentation_gib:
            return self.oom(self.first_forward_gib, free, 0.0)
        free -= self.first_forward_gib
        held += self.first_forward_gib
        usable = free - self.fragmentation_gib
        if total_gib <= usable:
            return None
        largest = total_gib * largest_fraction
        rest = total_gib - largest
        if rest <= usable:
            return self.oom(largest, free - rest, held + rest)
        return self.oom(rest, free, held)

    def oom(self, tried_gib: float, free_at_gib: float, transient_held_gib: float) -> OomDetail:
        return oom_detail(
            tried_gib,
            free_at_gib,
            total_gib=self.total_gib,
            fragmentation_gib=self.fragmentation_gib,
            non_torch_gib=self.non_torch_gib,
            torch_gib=self.torch_static_gib,
            transient_gib=transient_held_gib,
            private_pool_gib=self.private_pool_gib,
        )


@dataclass(eq=False)
class SimRequest:
    """One generation request as the scheduler sees it."""

    input_len: int
    max_new_tokens: int
    arrival_s: float = 0.0
    is_warmup: bool = False
    sink: Any = None  # the server's per-request channel
    prefilled: int = 0
    generated: int = 0
    first_token_s: float | None = None
    finish_s: float | None = None

    @property
    def finished(self) -> bool:
        return self.generated >= self.max_new_tokens

    @property
    def kv_need(self) -> int:
        return self.input_len + self.max_new_tokens


@dataclass
class Emission:
    """Tokens a request received when a batch ended."""

    request: SimRequest
    new_tokens: int
    finished: bool


@dataclass
class Batch:
    """What the scheduler runs next; ``oom`` set means running it kills the server."""

    kind: Literal["prefill", "decode"]
    duration_s: float
    prefill: list[tuple[SimRequest, int]] = field(default_factory=list)
    decode_steps: list[tuple[int, float, bool]] = field(default_factory=list)  # (batch size, secs, graph)
    running: list[SimRequest] = field(default_factory=list)
    oom: OomDetail | None = None
    phase: str = ""

    @property
    def new_tokens(self) -> int:
        return sum(n for _, n in self.prefill)

    @property
    def graph(self) -> bool:
        return all(g for _, _, g in self.decode_steps)


class BatchEngine:
    """Continuous batching over :class:`SimRequest` values, in simulated seconds."""

    def __init__(self, spec: RuntimeSpec, *, first_forward_done: bool = True) -> None:
        self.spec = spec
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.chunked: SimRequest | None = None
        self.reserved_tokens = 0
        self.first_forward_done = first_forward_done
        self.decode_steps_total = 0
        self.tokens_generated = 0

    # -- queue ----------------------------------------------------------------------------------------------
    def add(self, req: SimRequest) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.chunked)

    @property
    def used_tokens(self) -> int:
        live = self.running + ([self.chunked] if self.chunked else [])
        return sum(r.prefilled + r.generated for r in live)

    @property
    def token_usage(self) -> float:
        return self.used_tokens / max(self.spec.max_total_num_tokens, 1)

    # -- planning -------------------------------------------------------------------------------------------
    def next_batch(self) -> Batch | None:
        """The batch to run next (without changing state), or None when idle."""
        prefill = self._plan_prefill()
        if prefill is not None:
            return prefill
        if self.running:
            return self._plan_decode()
        return None

    def _plan_prefill(self) -> Batch | None:
        s = self.spec
        budget = s.max_prefill_tokens
        chunking = s.chunked_prefill_size > 0
        if chunking:
            budget = min(budget, s.chunked_prefill_size)
        items: list[tuple[SimRequest, int]] = []
        slots = s.max_running_requests - len(self.running)
        reserved = self.reserved_tokens
        if self.chunked is not None:
            req = self.chunked
            left = req.input_len - req.prefilled
            take = min(left, budget) if chunking else left
            items.append((req, take))
            budget -= take
            slots -= 1
        for req in self.waiting:
            if budget <= 0 or slots <= 0:
                break
            if reserved + req.kv_need > s.max_total_num_tokens:
                break
            left = req.input_len - req.prefilled
            if left <= budget:
                items.append((req, left))
                budget -= left
            elif chunking and self.chunked is None:
                items.append((req, budget))  # SGLang keeps one chunked request at a time
                budget = 0
            elif not items:
                items.append((req, left))
                budget = 0
            else:
                break
            reserved += req.kv_need
            slots -= 1
        if not items:
            return None
        tokens = sum(n for _, n in items)
        batch = Batch(kind="prefill", duration_s=s.prefill_s(tokens), prefill=items)
        oom = s.transient_oom(s.prefill_gib(tokens), s.prefill_largest_fraction, not self.first_forward_done)
        if oom is not None:
            batch.oom = oom
            batch.phase = "warmup" if any(r.is_warmup for r, _ in items) else "prefill"
            batch.duration_s = 0.0
        return batch

    def _plan_decode(self) -> Batch:
        s = self.spec
        remaining = {id(r): r.max_new_tokens - r.generated for r in self.running}
        batch = Batch(kind="decode", duration_s=0.0, running=list(self.running))
        for step in range(s.continuous_steps):
            alive = [r for r in self.running if remaining[id(r)] > step]
            n = len(alive)
            if n == 0:
                break
            secs, graph = s.decode_step_s(n)
            if not graph:
                oom = s.transient_oom(s.eager_gib(n), s.eager_largest_fraction, not self.first_forward_done)
                if oom is not None:
                    batch.oom = oom
                    batch.phase = "decode"
                    batch.decode_steps.append((n, 0.0, graph))
                    return batch
            batch.decode_steps.append((n, secs, graph))
            batch.duration_s += secs
        return batch

    # -- committing -----------------------------------------------------------------------------------------
    def commit(self, batch: Batch, end_s: float) -> list[Emission]:
        """Apply a batch that ran to completion at simulated time ``end_s``; return what it emitted."""
        out: list[Emission] = []
        if batch.kind == "prefill":
            self.first_forward_done = True
            for req, n in batch.prefill:
                if req is not self.chunked:
                    self.waiting.remove(req)
                    self.reserved_tokens += req.kv_need
                req.prefilled += n
                if req.prefilled >= req.input_len:
                    if req is self.chunked:
                        self.chunked = None
                    req.generated = 1
                    req.first_token_s = end_s
                    self.tokens_generated += 1
                    if req.finished:
                        self._finish(req, end_s)
                    else:
                        self.running.append(req)
                    out.append(Emission(req, 1, req.finished))
                else:
                    self.chunked = req
            return out
        for req in batch.running:
            steps = min(len(batch.decode_steps), req.max_new_tokens - req.generated)
            req.generated += steps
            self.tokens_generated += steps
            if req.finished:
                self._finish(req, end_s)
                self.running.remove(req)
            out.append(Emission(req, steps, req.finished))
        self.decode_steps_total += len(batch.decode_steps)
        return out

    def _finish(self, req: SimRequest, end_s: float) -> None:
        req.finish_s = end_s
        self.reserved_tokens -= req.kv_need

    def abort(self, req: SimRequest) -> None:
        """Drop a request (client went away); frees its slot at the next batch boundary."""
        if req in self.waiting:
            self.waiting.remove(req)
        elif req in self.running:
            self.running.remove(req)
            self.reserved_tokens -= req.kv_need
        elif req is self.chunked:
            self.chunked = None
            self.reserved_tokens -= req.kv_need
