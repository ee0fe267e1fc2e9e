"""The continuous-batching scheduler of the simulated host, in simulated time.

One copy of the batching logic serves both :func:`runners.simhost.model.evaluate` (which drives it
on a virtual clock) and the HTTP server (which sleeps ``duration / sim_speed`` between batches), so a
prediction and a served run cannot drift apart.

The policy is SGLang's default scheduler (``srt/managers/scheduler.py``, ``schedule_policy.py``,
``schedule_batch.py`` @ 0.5.10):

* new requests are prefilled first; a prefill batch holds at most ``max_prefill_tokens`` new tokens and
  ``chunked_prefill_size`` of them (one request at a time is chunked across batches), at most
  ``max_running_requests`` requests run, and a request is admitted when its prompt plus
  ``min(max_new_tokens, 4096)`` fits in the free KV pool minus the running requests' *estimated*
  remaining need, ``min(max_new - generated, 4096) x new_token_ratio`` (the ratio starts at
  ``0.7 x --schedule-conservativeness`` and decays to 14% of that over 600 decode steps);
* otherwise one decode step runs, one token per running request (``--num-continuous-decode-steps`` is
  defined but never read in SGLang 0.5.2-0.5.23, so it changes nothing here); if the pool cannot hold
  every running request's next token, requests are *retracted* first (fewest output tokens, longest
  prompt first), their KV freed, and they go back to the queue to be prefilled again, prompt plus
  output so far; the ratio jumps to ``(decoded + 20 x running) / sum(max_new_tokens)``;
* a decode step costs ``base + per_request x bs`` (``bs`` padded to the captured graph size, or the
  eager time above the largest graph) plus the attention's read of every running request's KV
  (``kv_read_ms_per_ktoken`` per 1000 context tokens; sliding-window layers read at most the window),
  plus the NCCL variables' effect on its all-reduces; a prefill batch costs ``base + per_token x
  tokens`` plus causal attention's quadratic term (``n x (prefix + n/2)`` pairs per request chunk);
* eager steps and prefill batches allocate transient memory, and an allocation that does not fit makes
  the batch an OOM (the caller decides what dying means).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from runners.simhost.nccl import NcclCost

TRANSIENT_PIECES = 16
"""The small allocations a transient working set (eager decode step, prefill batch) is made of before its
largest buffer: one failing piece is what an OOM then reports."""

__all__ = [
    "TRANSIENT_PIECES",
    "Batch",
    "BatchEngine",
    "Emission",
    "OomDetail",
    "Retraction",
    "RuntimeSpec",
    "SimRequest",
    "oom_detail",
]


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
    schedule_conservativeness: float = 1.0
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
    # timing (ms) and the run's multiplicative noise factor
    decode_base_ms: float
    decode_per_request_ms: float
    moe_experts: int = 0
    moe_top_k: int = 0
    moe_expert_ms: float = 0.0
    eager_multiplier: float
    eager_extra_ms: float
    kv_read_ms_per_ktoken: float = 0.0  # attention reading the KV cache: ms per 1000 context tokens
    attention_window: int | None = None  # sliding-window layers read at most this many tokens ...
    window_layer_fraction: float = 0.0  # ... and are this share of the layers
    prefill_base_ms: float
    prefill_per_token_ms: float
    prefill_attn_ms_per_mpair: float = 0.0  # causal attention: ms per million (query, key) pairs
    prefill_graph_max_tokens: int = 0  # prefill batches up to this many tokens replay a CUDA graph
    prefill_graph_base_factor: float = 1.0  # ... and pay this share of prefill_base_ms
    torch_compile: bool = False
    torch_compile_max_bs: int = 32
    torch_compile_factor: float = 1.0
    time_factor: float = 1.0
    nccl: NcclCost = NcclCost()
    # speculative decoding (0 steps: off)
    spec_steps: int = 0
    spec_topk: int = 1
    spec_draft_tokens: int = 1
    spec_acceptance: float = 0.0
    spec_draft_ms: float = 0.0
    spec_verify_ms_per_token: float = 0.0

    def accepted_per_step(self) -> float:
        """Tokens one speculative step yields per request on average: ``(1 - a^(k+1)) / (1 - a)`` for ``k`` draft
        steps at acceptance ``a`` (wider trees, ``topk``, accept more), at most the verified tokens."""
        if self.spec_steps <= 0:
            return 1.0
        a = 1.0 - (1.0 - self.spec_acceptance) / self.spec_topk ** 0.5
        expected = (1.0 - a ** (self.spec_steps + 1)) / (1.0 - a)
        return max(1.0, min(expected, float(self.spec_draft_tokens)))

    def _speculative(self, ms: float, bs: int) -> float:
        """A token's share of a speculative step: the target's step, the drafts and the extra verified tokens,
        over the tokens accepted (speculation wins while decoding is memory-bound, at small batches)."""
        if self.spec_steps <= 0:
            return ms
        step = (ms + self.spec_steps * self.spec_draft_ms
                + self.spec_verify_ms_per_token * (self.spec_draft_tokens - 1) * bs)
        return step / self.accepted_per_step()

    # -- timing ---------------------------------------------------------------------------------------------
    def graph_bs(self, n: int) -> int | None:
        """Captured batch size a decode batch of ``n`` is padded to, or None if it runs eagerly."""
        if not self.captured_bs or n > self.captured_bs[-1]:
            return None
        return self.captured_bs[bisect.bisect_left(self.captured_bs, n)]

    def attended_tokens(self, context: int) -> float:
        """KV tokens one request's decode step reads, averaged over layers (sliding windows cap some)."""
        if self.attention_window is None or self.window_layer_fraction <= 0:
            return float(context)
        f = self.window_layer_fraction
        return (1.0 - f) * context + f * min(context, self.attention_window)

    def moe_ms(self, bs: int) -> float:
        """Reading the experts a decode batch of ``bs`` activates (the profile's MoE term; 0 without one)."""
        if not self.moe_experts or not self.moe_top_k or self.moe_expert_ms <= 0:
            return 0.0
        e = self.moe_experts
        return self.moe_expert_ms * e * (1.0 - (1.0 - min(self.moe_top_k, e) / e) ** bs)

    def decode_step_s(self, n: int, kv_tokens: float = 0.0) -> tuple[float, bool]:
        """One decode step with ``n`` running requests whose attention reads ``kv_tokens`` KV entries in
        all (see :meth:`attended_tokens`); returns (seconds, whether a CUDA graph ran it)."""
        bs = self.graph_bs(n)
        kv_ms = self.kv_read_ms_per_ktoken * kv_tokens / 1000.0
        if bs is not None:
            ms = self.decode_base_ms + self.decode_per_request_ms * bs + self.moe_ms(bs) + kv_ms
            if self.torch_compile and bs <= self.torch_compile_max_bs:
                ms *= self.torch_compile_factor
            ms += self.nccl.decode_delta_ms(bs)
            return self._speculative(ms, bs) * self.time_factor / 1000.0, True
        ms = ((self.decode_base_ms + self.decode_per_request_ms * n + self.moe_ms(n)) * self.eager_multiplier
              + self.eager_extra_ms)
        ms += kv_ms + self.nccl.decode_delta_ms(n)
        return self._speculative(ms, n) * self.time_factor / 1000.0, False

    def prefill_s(self, tokens: int, attn_pairs: float = 0.0) -> float:
        """A prefill batch of ``tokens`` new tokens with ``attn_pairs`` causal (query, key) pairs in all."""
        base = self.prefill_base_ms
        if 0 < tokens <= self.prefill_graph_max_tokens:
            base *= self.prefill_graph_base_factor
        ms = base + self.prefill_per_token_ms * tokens + self.prefill_attn_ms_per_mpair * attn_pairs / 1e6
        ms += self.nccl.prefill_delta_ms(tokens)
        return ms * self.time_factor / 1000.0

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
        allocated as ``total * (1 - largest_fraction)`` in :data:`TRANSIENT_PIECES` equal pieces (the
        per-layer activations) and last one allocation of ``total * largest_fraction``; each must fit in
        ``free - fragmentation``. The allocation that fails is always one of these real sizes, so the figures
        move with the batch and the free memory, never by the size of the whole working set at once.
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
        piece = rest / TRANSIENT_PIECES
        fitted = max(0, min(TRANSIENT_PIECES - 1, math.floor(usable / piece))) if piece > 0 else 0
        return self.oom(piece, free - fitted * piece, held + fitted * piece)

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
    prefilled: int = 0  # progress of the current prefill (of ``fill_len`` tokens)
    fill_len: int = 0  # tokens the current prefill computes: the prompt, or prompt + output after a retraction
    kv: int = 0  # KV-cache tokens the request holds now
    generated: int = 0
    retracted: int = 0  # times SGLang retracted it
    first_token_s: float | None = None
    finish_s: float | None = None

    def __post_init__(self) -> None:
        if self.fill_len == 0:
            self.fill_len = self.input_len

    @property
    def finished(self) -> bool:
        return self.generated >= self.max_new_tokens

    @property
    def kv_need(self) -> int:
        return self.input_len + self.max_new_tokens

    @property
    def context(self) -> int:
        return self.input_len + self.generated


@dataclass
class Emission:
    """Tokens a request received when a batch ended."""

    request: SimRequest
    new_tokens: int
    finished: bool


@dataclass
class Retraction:
    """SGLang's ``KV cache pool is full. Retract requests.`` event before a decode step."""

    requests: list[SimRequest]
    tokens_gained: int
    old_ratio: float
    new_ratio: float


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
    retraction: Retraction | None = None

    @property
    def new_tokens(self) -> int:
        return sum(n for _, n in self.prefill)

    @property
    def graph(self) -> bool:
        return all(g for _, _, g in self.decode_steps)


# SGLang's scheduler constants (srt/environ.py, srt/managers/schedule_policy.py @ 0.5.10).
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
RETRACT_DECODE_STEPS = 20
CLIP_MAX_NEW_TOKENS = 4096


class BatchEngine:
    """Continuous batching over :class:`SimRequest` values, in simulated seconds (module docstring)."""

    def __init__(self, spec: RuntimeSpec, *, first_forward_done: bool = True) -> None:
        self.spec = spec
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.chunked: SimRequest | None = None
        self.first_forward_done = first_forward_done
        self.decode_steps_total = 0
        self.tokens_generated = 0
        self.retracted_total = 0
        self.init_ratio = min(INIT_NEW_TOKEN_RATIO * spec.schedule_conservativeness, 1.0)
        self.min_ratio = min(self.init_ratio * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.ratio_decay = (self.init_ratio - self.min_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = self.init_ratio

    # -- queue ----------------------------------------------------------------------------------------------
    def add(self, req: SimRequest) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.chunked)

    @property
    def used_tokens(self) -> int:
        live = self.running + ([self.chunked] if self.chunked else [])
        return sum(r.kv for r in live)

    @property
    def available_tokens(self) -> int:
        return self.spec.max_total_num_tokens - self.used_tokens

    @property
    def token_usage(self) -> float:
        return self.used_tokens / max(self.spec.max_total_num_tokens, 1)

    # -- planning -------------------------------------------------------------------------------------------
    def next_batch(self) -> Batch | None:
        """The batch to run next, or None when idle.

        Planning a prefill changes nothing; planning a decode step may retract requests first, as
        SGLang's ``update_running_batch`` does when it forms the step (``Batch.retraction``).
        """
        prefill = self._plan_prefill()
        if prefill is not None:
            return prefill
        if self.running:
            return self._plan_decode()
        return None

    def _plan_prefill(self) -> Batch | None:
        """SGLang's ``PrefillAdder``: a request joins if its remaining prompt plus its (clipped)
        ``max_new_tokens`` fits in the free pool minus what the running requests are expected to still
        need, ``min(max_new - generated, 4096) x new_token_ratio`` each, and minus what joined before it."""
        s = self.spec
        rem_input = s.max_prefill_tokens
        rem_chunk: int | None = s.chunked_prefill_size if s.chunked_prefill_size > 0 else None
        offset = sum(
            min(r.max_new_tokens - r.generated, CLIP_MAX_NEW_TOKENS) * self.new_token_ratio for r in self.running
        )
        available = self.available_tokens
        items: list[tuple[SimRequest, int]] = []
        slots = s.max_running_requests - len(self.running)
        if self.chunked is not None:
            req = self.chunked
            left = req.fill_len - req.prefilled
            take = min(left, rem_chunk) if rem_chunk is not None else left
            items.append((req, take))
            offset += take + min(req.max_new_tokens - req.generated, CLIP_MAX_NEW_TOKENS)
            rem_input -= take
            if rem_chunk is not None:
                rem_chunk -= take
            slots -= 1
        for req in self.waiting:
            if slots <= 0 or rem_input <= 0 or (rem_chunk is not None and rem_chunk <= 0):
                break
            left = req.fill_len - req.prefilled
            total = left + min(max(req.max_new_tokens - req.generated, 0), CLIP_MAX_NEW_TOKENS)
            if total >= available - offset:
                break
            if left >= rem_input and items:
                break
            if rem_chunk is None or left <= rem_chunk:
                items.append((req, left))
                offset += left + min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS) + 1
                rem_input -= left
                if rem_chunk is not None:
                    rem_chunk -= left
            elif self.chunked is None:
                items.append((req, rem_chunk))  # SGLang keeps one chunked request at a time
                rem_chunk = 0
                break
            else:
                break
            slots -= 1
        if not items:
            return None
        tokens = sum(n for _, n in items)
        pairs = sum(n * (r.prefilled + n / 2.0) for r, n in items)
        batch = Batch(kind="prefill", duration_s=s.prefill_s(tokens, pairs), prefill=items)
        oom = s.transient_oom(s.prefill_gib(tokens), s.prefill_largest_fraction, not self.first_forward_done)
        if oom is not None:
            batch.oom = oom
            batch.phase = "warmup" if any(r.is_warmup for r, _ in items) else "prefill"
            batch.duration_s = 0.0
        return batch

    def _retract(self) -> Retraction | None:
        """``ScheduleBatch.retract_decode`` (0.5.10): when the pool cannot give every running request its
        next token, retract (free the KV of) the requests with the fewest output tokens, longest prompt
        first, at least one, until it can; keep at least one. The new ratio is ``(decoded + 20 x
        remaining) / (sum of max_new_tokens + 1)``, at most 1."""
        if self.available_tokens >= len(self.running):
            return None
        order = sorted(self.running, key=lambda r: (r.generated, -r.input_len), reverse=True)
        before = self.available_tokens
        out: list[SimRequest] = []
        first = True
        while first or self.available_tokens < len(order):
            if len(order) == 1:
                break
            first = False
            req = order.pop()
            self.running.remove(req)
            req.kv = 0
            req.prefilled = 0
            req.fill_len = req.input_len + req.generated
            req.retracted += 1
            out.append(req)
            self.waiting.append(req)
        old = self.new_token_ratio
        decoded = sum(r.generated for r in self.running)
        total_max = sum(r.max_new_tokens for r in self.running)
        self.new_token_ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(self.running)) / (total_max + 1))
        self.retracted_total += len(out)
        return Retraction(out, self.available_tokens - before, old, self.new_token_ratio)

    def _plan_decode(self) -> Batch:
        s = self.spec
        retraction = self._retract()
        alive = list(self.running)
        n = len(alive)
        kv = sum(s.attended_tokens(r.kv) for r in alive)
        batch = Batch(kind="decode", duration_s=0.0, running=alive, retraction=retraction)
        secs, graph = s.decode_step_s(n, kv)
        if not graph:
            oom = s.transient_oom(s.eager_gib(n), s.eager_largest_fraction, not self.first_forward_done)
            if oom is not None:
                batch.oom = oom
                batch.phase = "decode"
                batch.decode_steps.append((n, 0.0, graph))
                return batch
        batch.decode_steps.append((n, secs, graph))
        batch.duration_s = secs
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
                req.prefilled += n
                req.kv += n
                if req.prefilled >= req.fill_len:
                    if req is self.chunked:
                        self.chunked = None
                    req.generated += 1
                    if req.first_token_s is None:
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
            if req not in self.running:
                continue
            req.kv += 1  # the token sampled last step is written to the cache
            req.generated += 1
            self.tokens_generated += 1
            if req.finished:
                self._finish(req, end_s)
                self.running.remove(req)
            out.append(Emission(req, 1, req.finished))
        self.decode_steps_total += 1
        if batch.retraction is None:
            self.new_token_ratio = max(self.new_token_ratio - self.ratio_decay, self.min_ratio)
        return out

    def decode_run(self, max_steps: int) -> tuple[int, float, bool] | None:
        """Run up to ``max_steps`` plain decode steps at once, as ``max_steps`` calls of :meth:`next_batch` and
        :meth:`commit` would, when nothing can change the running set meanwhile: nothing waits or is chunked, no
        request finishes within them, the pool gives every step its tokens (no retraction) and an eager step's
        working set fits. Each step is costed by :meth:`RuntimeSpec.decode_step_s` on its own KV, so a change to
        the step's cost applies here as it does step by step (where the cost is a straight line in the step number
        over a stretch, the stretch is summed from its ends: :func:`_sum_steps`). Returns (steps, their seconds,
        whether CUDA graphs ran them), or None (nothing done) when the conditions do not hold; the caller then
        steps one batch."""
        s = self.spec
        if self.waiting or self.chunked is not None or not self.running or max_steps < 2:
            return None
        n = len(self.running)
        steps = min(max_steps, min(r.max_new_tokens - r.generated for r in self.running) - 1,
                    self.available_tokens // n)
        if steps < 2:
            return None
        _, graph = s.decode_step_s(n, 0.0)
        if not graph and s.transient_oom(s.eager_gib(n), s.eager_largest_fraction, not self.first_forward_done):
            return None
        kvs = [r.kv for r in self.running]
        windowed = s.attention_window is not None and s.window_layer_fraction > 0
        kv0 = float(sum(s.attended_tokens(c) for c in kvs))

        def step(j: int) -> float:  # step j's seconds: its requests' KV as step j reads it
            kv = float(sum(s.attended_tokens(c + j) for c in kvs)) if windowed else kv0 + n * j
            return s.decode_step_s(n, kv)[0]

        total = _sum_steps(step, 0, steps - 1, step(0), step(steps - 1))
        for req in self.running:
            req.kv += steps
            req.generated += steps
        self.tokens_generated += n * steps
        self.decode_steps_total += steps
        for _ in range(steps):  # one step at a time, as commit does, so the ratio is the same float
            self.new_token_ratio = max(self.new_token_ratio - self.ratio_decay, self.min_ratio)
        return steps, total, graph

    def _finish(self, req: SimRequest, end_s: float) -> None:
        req.finish_s = end_s
        req.kv = 0  # SGLang moves it into the radix cache: evictable, so free for admission

    def abort(self, req: SimRequest) -> None:
        """Drop a request (client went away); frees its slot at the next batch boundary."""
        if req in self.waiting:
            self.waiting.remove(req)
        elif req in self.running:
            self.running.remove(req)
            req.kv = 0
        elif req is self.chunked:
            self.chunked = None
            req.kv = 0


def _sum_steps(step: Callable[[int], float], lo: int, hi: int, at_lo: float, at_hi: float) -> float:
    """``sum(step(j) for j in lo..hi)``: a stretch whose middle step lies on the line through its ends (within
    1e-9) is summed as an arithmetic series; otherwise (a kink: a sliding window filling, a cost with a floor)
    each half is summed the same way, down to a few steps added one by one."""
    count = hi - lo + 1
    if count <= 8:
        return at_lo + at_hi + sum(step(j) for j in range(lo + 1, hi)) if count > 1 else at_lo
    mid = (lo + hi) // 2
    at_mid = step(mid)
    line = at_lo + (at_hi - at_lo) * (mid - lo) / (hi - lo)
    if abs(at_mid - line) <= 1e-9 * max(abs(line), 1e-12):
        return count * (at_lo + at_hi) / 2.0
    return _sum_steps(step, lo, mid, at_lo, at_mid) + _sum_steps(step, mid + 1, hi, step(mid + 1), at_hi)
