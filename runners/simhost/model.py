"""The pure model of a simulated SGLang host: ``evaluate(profile, launch, workload) -> Outcome``.

Nothing here touches the clock, the network or the file system; the HTTP server (``server.py``)
replays :func:`plan_startup` and drives :class:`~runners.simhost.engine.BatchEngine` with the same
:class:`~runners.simhost.engine.RuntimeSpec`, so what ``predict`` says is what the process does.

Memory per GPU, in the order SGLang allocates it (GiB; sglang-facts §1.3, §2):

1. ``pre = total - driver baseline - other processes - CUDA context - NCCL buffers`` (what SGLang
   measures before loading; ``Load weight begin. avail mem=pre``);
2. weights, copied shard by shard (an OOM here tries to allocate one shard);
3. KV pool: ``rest = (pre - weights) - pre * (1 - mem_fraction_static)``, ``#tokens = rest // bytes per
   token`` (rounded to the page size, capped by ``--max-total-tokens``); then the req_to_token table
   ``(max_running_requests + 1) x (context_len + 4) x 4 B`` and the profile's other static buffers;
   ``Memory pool end. avail mem`` is what is left;
4. CUDA-graph capture (batch sizes per SGLang's list for the version, cut at max_running_requests):
   a contiguous workspace, then the largest graph's pool in one piece, then a little per further
   graph; each allocation must fit in ``free - fragmentation``; the workspace is released after; then,
   from 0.5.10 where the model allows them, the prefill CUDA graphs (one pool for the largest token
   count), which can die of OOM in capture too;
5. warm-up: the first forward keeps ``warmup_transient_gib``; the warm-up request itself is a
   prefill + decode through the scheduler;
6. serving: prefill batches and eager decode steps allocate transient memory (engine.py).

Failure kinds in :class:`Outcome`: ``oom`` (phase tells which: ``load_weights``, ``kv_pool``,
``cuda_graph``, ``warmup``, ``prefill``, ``decode``), ``nccl_error`` (an NCCL setting with no path for one
of SGLang's collectives: at communicator init for AllReduce, at the first forward for the logits
AllGather; :mod:`runners.simhost.nccl`), ``bad_flag`` (argparse refused the command line, exit 2) and
``error`` (anything else, e.g. more TP ranks than GPUs).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from runners.engines.sglang_memory import (
    ESTIMATED_RESERVE_SINCE,
    memory_tiers,
    reserved_055,
    reserved_before_055,
)
from runners.simhost import texts
from runners.simhost.engine import BatchEngine, OomDetail, RuntimeSpec, SimRequest, oom_detail
from runners.simhost.launch import DEFAULT_VERSION, V_NEW_CG_FLAGS, BadFlag, SimLaunch, Version
from runners.simhost.nccl import NcclCost, NcclEffect, nccl_effect_for
from runners.simhost.numerics import Numerics
from runners.simhost.profile import SimProfile

__all__ = [
    "WARMUP_PROMPT",
    "BadFlag",
    "Failure",
    "LevelResult",
    "MemoryFigures",
    "NcclEffect",
    "Outcome",
    "ResolvedArgs",
    "SimLaunch",
    "StartupPlan",
    "Workload",
    "approx_tokens",
    "evaluate",
    "nccl_effect",
    "numerics_of",
    "oom_text",
    "plan_startup",
    "predict_from_argv",
    "resolve_args",
    "run_level",
]

GIB = float(1 << 30)
MIB_PER_GIB = 1024.0
WARMUP_PROMPT = "The capital city of France is"
WARMUP_MAX_NEW_TOKENS = 8

_KV_DTYPE_BYTES = {
    "bfloat16": 2.0,
    "bf16": 2.0,
    "float16": 2.0,
    "half": 2.0,
    "float32": 4.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
    "mxfp8": 1.03125,
    "fp4_e2m1": 0.5625,
    "nvfp4": 0.5625,
    "fp4_mx_block16": 0.5625,
}
_KV_TORCH_DTYPE = {
    "bfloat16": "torch.bfloat16",
    "bf16": "torch.bfloat16",
    "float16": "torch.float16",
    "half": "torch.float16",
    "float32": "torch.float32",
    "fp8_e4m3": "torch.float8_e4m3fn",
    "fp8_e5m2": "torch.float8_e5m2",
    "mxfp8": "torch.float8_e4m3fn",
    "fp4_e2m1": "torch.uint8",
    "nvfp4": "torch.uint8",
    "fp4_mx_block16": "torch.uint8",
}

OutcomeKind = Literal["ok", "oom", "nccl_error", "bad_flag", "error"]
Phase = Literal["init", "load_weights", "kv_pool", "cuda_graph", "warmup", "prefill", "decode"]


def approx_tokens(text: str) -> int:
    """Token count the simulator assigns to a prompt text: one token per 4 characters, at least 1."""
    return max(1, math.ceil(len(text) / 4))


# ---------------------------------------------------------------------------------------------------------
# values
# ---------------------------------------------------------------------------------------------------------


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class Workload(_Frozen):
    """A bench_serving-like load: at each concurrency level, ``requests_per_level`` requests (default
    ``max(4, 2 x concurrency)``), at most ``concurrency`` in flight, each with ``input_len`` prompt tokens
    and exactly ``output_len`` new tokens. Requests are sent as fast as slots free up, or, with
    ``request_rate`` (requests per simulated second), evenly spaced and still capped by concurrency."""

    input_len: int = Field(default=256, ge=1)
    output_len: int = Field(default=128, ge=1)
    concurrency: tuple[int, ...] = (1,)
    requests_per_level: int | None = Field(default=None, ge=1)
    request_rate: float | None = Field(default=None, gt=0)

    def requests_for(self, concurrency: int) -> int:
        return self.requests_per_level or max(4, 2 * concurrency)


class ResolvedArgs(_Frozen):
    """The server arguments after SGLang's defaults were filled in for this host (sglang-facts §1.3)."""

    tp_size: int
    mem_fraction_static: float
    chunked_prefill_size: int
    max_prefill_tokens: int
    cuda_graph_max_bs: int | None
    capture_bs_candidates: tuple[int, ...]
    disable_cuda_graph: bool
    page_size: int
    context_len: int
    kv_cache_dtype: str
    kv_torch_dtype: str
    kv_bytes_per_token: float
    max_running_requests: int | None  # as given (or the model's override), before the pool is sized
    num_continuous_decode_steps: int  # as given; SGLang 0.5.2-0.5.23 never reads it
    prefill_graph_tokens: tuple[int, ...]  # prefill CUDA-graph token counts (empty: none captured)
    server_args: dict[str, Any]  # every field, named as the emulated version names them


class Failure(_Frozen):
    kind: OutcomeKind
    phase: Phase
    message: str  # the exception line(s) as the log prints them (class: text)
    elapsed_s: float = 0.0  # simulated seconds into the phase
    oom: OomDetail | None = None
    stage: str = ""  # "prefill_graph": the prefill CUDA-graph capture (phase cuda_graph)


class MemoryFigures(_Frozen):
    """Per-GPU memory at each start-up stage, in GiB (SGLang's "GB"), as far as the run got."""

    total_gib: float
    pre_load_avail_gib: float | None = None
    weights_gib: float | None = None
    avail_after_weights_gib: float | None = None
    kv_tokens: int | None = None
    kv_gib: float | None = None
    req_to_token_gib: float | None = None
    free_after_pool_gib: float | None = None
    capture_bs: list[int] | None = None
    graph_gib: float | None = None  # decode and prefill CUDA graphs together
    prefill_graph_tokens: list[int] | None = None
    prefill_graph_gib: float | None = None
    free_after_capture_gib: float | None = None
    max_running_requests: int | None = None
    max_total_num_tokens: int | None = None
    tried_to_allocate_gib: float | None = None
    free_at_oom_gib: float | None = None


class StartupPlan(_Frozen):
    """Start-up as the server replays it: resolved args, memory stages, durations, failure if any."""

    profile: str
    version: str
    resolved: ResolvedArgs | None
    nccl: NcclEffect
    memory: MemoryFigures
    ctx_gib: float = 0.0  # CUDA context + NCCL buffers
    failure: Failure | None = None
    durations: dict[str, float] = Field(default_factory=dict)  # simulated seconds per stage
    noise_factor: float = 1.0
    runtime: RuntimeSpec | None = None
    warnings: list[str] = Field(default_factory=list)


class LevelResult(_Frozen):
    concurrency: int
    num_requests: int
    ok: bool
    completed: int = 0
    duration_s: float | None = None
    output_throughput: float | None = None
    request_throughput: float | None = None
    mean_ttft_ms: float | None = None
    median_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    mean_tpot_ms: float | None = None
    median_tpot_ms: float | None = None
    mean_e2e_latency_ms: float | None = None
    decode_mode: str | None = None  # graph | eager | mixed
    retracted: int = 0  # requests SGLang retracted (KV pool full during decode)
    died_phase: str | None = None
    tried_to_allocate_gib: float | None = None
    free_at_oom_gib: float | None = None
    error: str | None = None


class Outcome(_Frozen):
    outcome: OutcomeKind
    phase: Phase | None = None
    simulated: bool = True
    profile: str | None = None
    version: str
    error: str | None = None
    exit_code: int | None = None  # what a shell sees: 137 (SIGKILL) after a death, 2 for a refused flag
    memory: MemoryFigures | None = None
    resolved: dict[str, Any] | None = None
    startup_s: float | None = None
    nccl: dict[str, Any] | None = None
    levels: list[LevelResult] = Field(default_factory=list)

    def to_json_dict(self, digits: int = 4) -> dict[str, Any]:
        """JSON-ready dict with floats rounded to ``digits`` decimals."""
        out: dict[str, Any] = _round(self.model_dump(mode="json"), digits)
        return out


def _round(value: Any, digits: int) -> Any:
    if isinstance(value, float):
        return round(value, digits)
    if isinstance(value, dict):
        return {k: _round(v, digits) for k, v in value.items()}
    if isinstance(value, list):
        return [_round(v, digits) for v in value]
    return value


# ---------------------------------------------------------------------------------------------------------
# argument resolution
# ---------------------------------------------------------------------------------------------------------


def _capture_candidates(
    v: Version, gpu_mem: int, max_bs: int | None, explicit: Sequence[int] | None, disabled: bool
) -> tuple[int, ...]:
    if disabled:
        return ()
    if explicit:
        return tuple(sorted(set(explicit)))
    if v < (0, 5, 5):
        lst = {1, 2, 4, 8, *range(16, 161, 8)}
        if gpu_mem > 90 * 1024:
            lst |= set(range(160, 257, 8))
        if gpu_mem > 160 * 1000:
            lst |= set(range(256, 513, 16))
        out = sorted(lst)
        if max_bs is not None:
            top = out[-1]
            out = [b for b in out if b <= max_bs]
            if max_bs > top:
                out = sorted(set(out) | set(range(top, max_bs + 1, 16)))
        return tuple(out)
    assert max_bs is not None
    cand = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    out = sorted({b for b in cand if b <= max_bs} | {max_bs})
    return tuple(out)


def _defaults_before_055(profile: SimProfile, launch: SimLaunch) -> tuple[int, int | None, float]:
    """(chunked_prefill_size, cuda_graph_max_bs, mem_fraction_static) as SGLang 0.5.2 fills them in (the
    estimated reserve starts at 0.5.3: ESTIMATED_RESERVE_SINCE)."""
    gpu_mem = profile.host.memory_total_mib
    chunked = launch.chunked_prefill_size
    max_bs = launch.cuda_graph_max_bs
    mfs = launch.mem_fraction_static
    if chunked is None:
        chunked = 2048 if gpu_mem < 35 * 1024 else 8192 if gpu_mem < 160 * 1024 else 16384
    if max_bs is None and gpu_mem < 35 * 1024:
        max_bs = 8 if launch.tp_size < 4 else 80
    if mfs is None:
        reserved = reserved_before_055(gpu_mem, launch.tp_size, speculative=launch.speculative_algorithm or None,
                                       dp_attention=bool(launch.enable_dp_attention))
        mfs = round((gpu_mem - reserved) / gpu_mem, 3)
    return chunked, max_bs, mfs


def _max_bs_055(launch: SimLaunch, v: Version, bs_small: int, bs_large: int) -> int:
    """``cuda_graph_max_bs`` from 0.5.5: the largest ``--cuda-graph-bs``, else the memory tier's value, which
    0.5.20+ caps at ``--max-running-requests``."""
    max_bs = launch.cuda_graph_max_bs
    if launch.cuda_graph_bs:
        max_bs = max(launch.cuda_graph_bs)
    if max_bs is not None:
        return max_bs
    max_bs = bs_small if launch.tp_size < 4 else bs_large
    if v >= (0, 5, 20) and launch.max_running_requests is not None and launch.max_running_requests < max_bs:
        max_bs = launch.max_running_requests
    return max_bs


def _reserved_mib_055(profile: SimProfile, launch: SimLaunch, chunked: int, max_bs: int) -> float:
    """Memory SGLang 0.5.3+ keeps out of ``mem_fraction_static`` (MiB)."""
    prefill_graph_mib = 0.0
    if _prefill_graph_on(profile, launch):
        n_tokens = len(_prefill_graph_tokens(_prefill_graph_max_tokens(profile, launch, chunked)))
        prefill_graph_mib = 1.5 * 1024 if profile.model.attention == "mla" else n_tokens * 8
    return reserved_055(profile.host.memory_total_mib, chunked if chunked > 0 else launch.max_prefill_tokens,
                        max_bs, launch.tp_size, version=launch.version_tuple,
                        dp_size=launch.dp_size if launch.enable_dp_attention else None,
                        prefill_graph_mib=prefill_graph_mib, speculative=launch.speculative_algorithm)


def _defaults_055(profile: SimProfile, launch: SimLaunch) -> tuple[int, int, float]:
    """(chunked_prefill_size, cuda_graph_max_bs, mem_fraction_static) as SGLang 0.5.3+ fills them in."""
    v = launch.version_tuple
    gpu_mem = profile.host.memory_total_mib
    tier_chunked, bs_small, bs_large = memory_tiers(v, gpu_mem)
    chunked = launch.chunked_prefill_size
    if chunked is None:
        chunked = tier_chunked
    max_bs = _max_bs_055(launch, v, bs_small, bs_large)
    mfs = launch.mem_fraction_static
    if mfs is None:
        mfs = round((gpu_mem - _reserved_mib_055(profile, launch, chunked, max_bs)) / gpu_mem, 3)
    return chunked, max_bs, mfs


def _server_args(
    profile: SimProfile, launch: SimLaunch, mfs: float, chunked: int, max_bs: int | None
) -> tuple[dict[str, Any], tuple[int, ...]]:
    """The ``server_args`` SGLang logs (and ``/get_server_info`` returns), and the prefill-graph token sizes."""
    v = launch.version_tuple
    mdl = profile.model
    sa = dict(launch.args)
    sa.update(
        {
            "model_path": launch.model_path,
            "tokenizer_path": sa.get("tokenizer_path") or launch.model_path,
            "served_model_name": launch.served_model_name or launch.model_path,
            "mem_fraction_static": mfs,
            "chunked_prefill_size": chunked,
            "max_running_requests": launch.max_running_requests or mdl.default_max_running_requests,
            "page_size": launch.page_size or 1,
            "attention_backend": launch.attention_backend or ("triton" if mdl.attention == "mla" else "flashinfer"),
        }
    )
    if v < V_NEW_CG_FLAGS:
        sa["cuda_graph_max_bs"] = max_bs
    else:
        sa["cuda_graph_max_bs_decode"] = max_bs
    prefill_tokens: tuple[int, ...] = ()
    if _prefill_graph_on(profile, launch):
        prefill_tokens = _prefill_graph_tokens(_prefill_graph_max_tokens(profile, launch, int(chunked)))
        if v >= V_NEW_CG_FLAGS:
            sa["cuda_graph_max_bs_prefill"] = prefill_tokens[-1] if prefill_tokens else None
        else:
            sa["piecewise_cuda_graph_max_tokens"] = prefill_tokens[-1] if prefill_tokens else None
    return sa, prefill_tokens


def resolve_args(profile: SimProfile, launch: SimLaunch) -> ResolvedArgs:
    """Fill in what SGLang derives when a flag is absent, for the emulated version and this GPU."""
    v = launch.version_tuple
    gpu_mem = profile.host.memory_total_mib
    tp = launch.tp_size
    mdl = profile.model
    max_bs: int | None
    if v < ESTIMATED_RESERVE_SINCE:
        chunked, max_bs, mfs = _defaults_before_055(profile, launch)
    else:
        chunked, max_bs, mfs = _defaults_055(profile, launch)

    candidates = _capture_candidates(v, gpu_mem, max_bs, launch.cuda_graph_bs, launch.disable_cuda_graph)
    kv_name = launch.kv_cache_dtype
    resolved_kv = mdl.kv_cache_dtype_default if kv_name == "auto" else kv_name
    default_bytes = _KV_DTYPE_BYTES.get(mdl.kv_cache_dtype_default, 2.0)
    ratio = _KV_DTYPE_BYTES.get(resolved_kv, default_bytes) / default_bytes
    max_running_arg = launch.max_running_requests or mdl.default_max_running_requests
    page_size = launch.page_size or 1
    context_len = launch.context_length or mdl.context_length
    sa, prefill_tokens = _server_args(profile, launch, mfs, chunked, max_bs)
    return ResolvedArgs(
        tp_size=tp,
        mem_fraction_static=float(mfs),
        chunked_prefill_size=int(chunked),
        max_prefill_tokens=launch.max_prefill_tokens,
        cuda_graph_max_bs=max_bs,
        capture_bs_candidates=candidates,
        disable_cuda_graph=launch.disable_cuda_graph,
        page_size=page_size,
        context_len=context_len,
        kv_cache_dtype=resolved_kv,
        kv_torch_dtype=_KV_TORCH_DTYPE.get(resolved_kv, "torch.bfloat16"),
        kv_bytes_per_token=mdl.kv_bytes(tp, ratio),
        max_running_requests=max_running_arg,
        num_continuous_decode_steps=launch.num_continuous_decode_steps,
        prefill_graph_tokens=prefill_tokens,
        server_args=sa,
    )


def _prefill_graph_on(profile: SimProfile, launch: SimLaunch) -> bool:
    """Prefill CUDA graphs are on by default from 0.5.10 (piecewise 0.5.10-0.5.13, tc_piecewise 0.5.14,
    breakable 0.5.15+), unless the model's architecture or another option turns them off
    (0.5.10 ``server_args._handle_piecewise_cuda_graph``)."""
    return (
        launch.version_tuple >= (0, 5, 10)
        and profile.model.piecewise_cuda_graph
        and not launch.disable_piecewise_cuda_graph
        and not launch.disable_cuda_graph
        and not launch.enable_torch_compile
        and not launch.enable_dp_attention
        and not launch.speculative_algorithm
    )


def _prefill_graph_max_tokens(profile: SimProfile, launch: SimLaunch, chunked: int) -> int:
    """``piecewise_cuda_graph_max_tokens`` / ``cuda_graph_max_bs_prefill``: chunked prefill size (2048 for
    MLA), capped by ``--max-total-tokens``."""
    if launch.cuda_graph_max_bs_prefill is not None:
        return launch.cuda_graph_max_bs_prefill
    top = 2048 if profile.model.attention == "mla" else (chunked if chunked > 0 else 8192)
    if launch.max_total_tokens is not None:
        top = min(top, launch.max_total_tokens)
    return top


def _prefill_graph_tokens(max_tokens: int) -> tuple[int, ...]:
    """0.5.10 ``_generate_piecewise_cuda_graph_tokens``."""
    sizes = [
        *range(4, 33, 4),
        *range(48, 257, 16),
        *range(288, 513, 32),
        *range(576, 1025, 64),
        *range(1280, 4097, 256),
        *range(4608, max_tokens + 1, 512),
    ]
    return tuple(t for t in sizes if t <= max_tokens)


# ---------------------------------------------------------------------------------------------------------
# NCCL
# ---------------------------------------------------------------------------------------------------------


def nccl_effect(profile: SimProfile, launch: SimLaunch) -> NcclEffect:
    """Whether the NCCL variables are legal for SGLang on this interconnect, and what they force
    (:mod:`runners.simhost.nccl`)."""
    nt = profile.timing.nccl
    return nccl_effect_for(
        launch.env,
        tp_size=launch.tp_size,
        interconnect=profile.host.interconnect,
        version=launch.version_tuple,
        nccl=profile.host.nccl,
        enable_nccl_nvls=bool(launch.args.get("enable_nccl_nvls")),
        disable_custom_all_reduce=launch.disable_custom_all_reduce,
        p2p_disable_factor=nt.p2p_disable_factor,
        shm_disable_factor=nt.shm_disable_factor,
    )


def nccl_cost(profile: SimProfile, launch: SimLaunch, effect: NcclEffect) -> NcclCost:
    """The per-step all-reduce cost model for this host, model and NCCL environment."""
    nt, ic = profile.timing.nccl, profile.host.interconnect
    return NcclCost(
        ranks=launch.tp_size,
        interconnect=ic,
        link_gb_s=nt.link_gb_s or (20.0 if ic == "pcie" else 350.0),
        hop_latency_scale=nt.hop_latency_scale or (3.0 if ic == "pcie" else 1.0),
        num_layers=profile.model.num_layers,
        hidden_size=profile.model.hidden_size,
        custom_ar_max_bytes=int(nt.custom_ar_max_mib * 1024 * 1024),
        effect=effect,
        nnodes=launch.nnodes,
        inter_node_gb_s=nt.inter_node_gb_s,
        inter_node_latency_scale=nt.inter_node_latency_scale,
    )


# ---------------------------------------------------------------------------------------------------------
# start-up
# ---------------------------------------------------------------------------------------------------------


def noise_factor(profile: SimProfile, seed: int | None) -> float:
    """The run's multiplicative time factor: 1 without a seed, else N(1, noise_pct%) clipped to 3 sigma."""
    if seed is None or profile.timing.noise_pct <= 0:
        return 1.0
    sigma = profile.timing.noise_pct / 100.0
    draw = random.Random(seed).gauss(0.0, sigma)
    return 1.0 + max(-3 * sigma, min(3 * sigma, draw))


def _others(other_used_gib: float | Sequence[float]) -> float:
    if isinstance(other_used_gib, (int, float)):
        return float(other_used_gib)
    return max(other_used_gib, default=0.0)


class _StartupWalk:
    """One walk through SGLang's start-up memory stages. Each stage method records its figures and durations
    and returns the :class:`Failure` that stops start-up there, or ``None`` to go on to the next stage."""

    def __init__(
        self,
        profile: SimProfile,
        launch: SimLaunch,
        other_used_gib: float | Sequence[float],
        seed: int | None,
        world_other_used_gib: float | None = None,
    ) -> None:
        host, mem = profile.host, profile.memory
        self.profile, self.launch = profile, launch
        self.mem, self.tim, self.mdl = mem, profile.timing, profile.model
        self.v = launch.version_tuple
        self.total = host.memory_total_gib
        self.baseline = host.smi_baseline_used_mib / MIB_PER_GIB
        self.others = _others(other_used_gib)
        # Multi-node: the KV pool is sized from the least free memory of any rank (the MIN all-reduce over the
        # world group); the other figures are this node's own.
        self.world_others = self.others if world_other_used_gib is None else max(self.others, world_other_used_gib)
        self.tp = tp = launch.tp_size
        self.frag = mem.fragmentation_gib
        self.nf = noise_factor(profile, seed)
        self.figs: dict[str, Any] = {"total_gib": self.total}
        self.durations: dict[str, float] = {}
        self.warnings: list[str] = []
        self.resolved = resolve_args(profile, launch)
        self.nccl = nccl_effect(profile, launch)
        self.ctx = mem.cuda_context_gib + ((mem.nccl_base_gib + mem.nccl_per_peer_gib * (tp - 1)) if tp > 1 else 0.0)
        # figures later stages read; each is set by the stage that computes it
        self.pre = self.pre_world = self.weights = self.avail = self.free_pool = self.static_torch = 0.0
        self.tokens = self.max_running = 0
        self.capture: tuple[int, ...] = ()
        self.decode_graph = self.graph = self.free_cap = 0.0

    def plan(self, failure: Failure | None = None, **extra: Any) -> StartupPlan:
        figs = self.figs
        if failure is not None and failure.oom is not None:
            figs["tried_to_allocate_gib"] = failure.oom.tried_gib
            figs["free_at_oom_gib"] = failure.oom.free_gib
        return StartupPlan(
            profile=self.profile.name,
            version=self.launch.version,
            resolved=self.resolved,
            nccl=self.nccl,
            memory=MemoryFigures(**figs),
            ctx_gib=self.ctx,
            failure=failure,
            durations=self.durations,
            noise_factor=self.nf,
            warnings=self.warnings,
            **extra,
        )

    def oom(self, tried: float, free: float, torch_alloc: float, private: float = 0.0) -> OomDetail:
        return oom_detail(
            tried,
            free,
            total_gib=self.total,
            fragmentation_gib=self.frag,
            non_torch_gib=self.ctx,
            torch_gib=torch_alloc,
            private_pool_gib=private,
        )

    def init(self) -> Failure | None:
        """Device ordinals, torch distributed / NCCL, and the memory left before the weights."""
        tim, nf, nccl = self.tim, self.nf, self.nccl
        if self.launch.local_ranks > self.profile.host.gpu_count:
            return Failure(kind="error", phase="init", message="RuntimeError: CUDA error: invalid device ordinal")
        self.durations["dist_init"] = tim.dist_init_s * nf
        if nccl.error is not None:
            return Failure(
                kind="nccl_error",
                phase="init",
                message=texts.nccl_exception(nccl.error, self.profile.host.nccl_version),
                elapsed_s=self.durations["dist_init"],
            )
        pre = self.total - self.baseline - self.others - self.ctx
        self.pre = pre
        self.pre_world = pre - (self.world_others - self.others)
        self.figs["pre_load_avail_gib"] = pre
        if pre <= self.frag:
            return Failure(
                kind="oom",
                phase="init",
                message="RuntimeError: CUDA error: out of memory",
                oom=self.oom(self.ctx, max(pre, 0.0), 0.0),
            )
        return None

    def load_weights(self) -> Failure | None:
        pre = self.pre
        weights = self.mdl.weights_per_gpu(self.tp)
        if self.launch.speculative_algorithm:
            weights += self.profile.speculative.draft_weights_gib  # the draft model loads with the target
        self.weights = weights
        self.figs["weights_gib"] = weights
        self.durations["load_weights"] = self.tim.weight_load_s * self.nf
        if weights > pre:
            shard = self.mdl.weight_shard_gib
            loaded = math.floor(pre / shard) * shard
            tried = min(shard, weights - loaded)
            detail = self.oom(tried, pre - loaded, loaded)
            return Failure(
                kind="oom",
                phase="load_weights",
                elapsed_s=self.durations["load_weights"] * loaded / weights,
                message=_oom_line(detail),
                oom=detail,
            )
        self.avail = pre - weights
        self.figs["avail_after_weights_gib"] = self.avail
        return None

    def kv_pool(self) -> Failure | None:
        """The KV pool (``max_total_num_tokens``), then the request-to-token table and misc static memory."""
        v, resolved = self.v, self.resolved
        pre = self.pre_world
        avail = self.avail - (self.pre - self.pre_world)
        mfs = resolved.mem_fraction_static
        self.durations["kv_pool"] = self.tim.kv_alloc_s * self.nf
        rest = avail - pre * (1.0 - mfs)
        if v >= (0, 5, 15) and rest <= 0:
            minimum = 1.0 - avail / pre
            return Failure(kind="oom", phase="kv_pool", message=texts.weights_leave_no_kv(mfs, minimum))
        bpt = resolved.kv_bytes_per_token
        tokens = int(rest * GIB // bpt) if rest > 0 else 0
        tokens = tokens // resolved.page_size * resolved.page_size
        if tokens <= 0:
            return Failure(kind="oom", phase="kv_pool", message=texts.kv_too_small(v, mfs))
        tokens = self._cap_total_tokens(tokens)
        self.tokens = tokens
        kv_gib = tokens * bpt / GIB
        self.figs["kv_tokens"] = tokens
        self.figs["kv_gib"] = kv_gib
        self.figs["max_total_num_tokens"] = tokens
        return self._req_to_token(kv_gib)

    def _cap_total_tokens(self, profiled: int) -> int:
        """``--max-total-tokens`` lowers the profiled pool; above it, SGLang warns and keeps the profiled one."""
        launch, page_size = self.launch, self.resolved.page_size
        if launch.max_total_tokens is None:
            return profiled
        if launch.max_total_tokens > profiled:
            self.warnings.append(
                f"max_total_tokens={launch.max_total_tokens} is larger than the profiled value "
                f"{profiled}. Use the profiled value instead."
            )
            return profiled
        return max(page_size, launch.max_total_tokens // page_size * page_size)

    def _req_to_token(self, kv_gib: float) -> Failure | None:
        mem, frag, tokens, v = self.mem, self.frag, self.tokens, self.v
        ctx_len = self.resolved.context_len
        user_mr = self.resolved.max_running_requests
        estimated = int(tokens / ctx_len * 512)
        if v >= (0, 5, 10):
            est = max(min(estimated, 4096), 2048)
            max_running = min(user_mr, est) if user_mr else min(est, tokens // 2)
            pool_rows = max_running
        else:
            pool_rows = user_mr or min(max(estimated, 2048), 4096)
            max_running = min(user_mr or tokens // 2, pool_rows)
        if max_running <= 0:
            return Failure(kind="error", phase="kv_pool", message="AssertionError: max_running_request is zero")
        self.max_running = max_running
        self.figs["max_running_requests"] = max_running
        rtt = (pool_rows + 1) * (ctx_len + 4) * 4 / GIB
        self.figs["req_to_token_gib"] = rtt
        after_kv = self.avail - kv_gib
        if rtt + mem.misc_static_gib > after_kv - frag:
            tried = rtt if rtt > after_kv - frag else mem.misc_static_gib
            free_at = after_kv if tried == rtt else after_kv - rtt
            held = self.weights + kv_gib + (0.0 if tried == rtt else rtt)
            detail = self.oom(tried, free_at, held)
            return Failure(kind="oom", phase="kv_pool", message=_oom_line(detail), oom=detail)
        self.free_pool = after_kv - rtt - mem.misc_static_gib
        self.figs["free_after_pool_gib"] = self.free_pool
        self.static_torch = self.weights + kv_gib + rtt + mem.misc_static_gib
        return None

    def decode_graphs(self) -> Failure | None:
        """Decode CUDA-graph capture: the workspace, one pool sized by the largest batch, a little per graph."""
        tim, mem, frag, nf, v = self.tim, self.mem, self.frag, self.nf, self.v
        capture = tuple(b for b in self.resolved.capture_bs_candidates if b <= self.max_running)
        self.capture = capture
        self.figs["capture_bs"] = list(capture)
        tc = tim.torch_compile_capture_factor if self.launch.enable_torch_compile else 1.0
        graph = 0.0
        if capture:
            self.durations["cuda_graph"] = (tim.capture_base_s + tim.capture_per_graph_s * len(capture)) * tc * nf
            free = self.free_pool
            ws = mem.graph_workspace_gib
            if ws > free - frag:
                detail = self.oom(ws, free, self.static_torch)
                return Failure(
                    kind="oom",
                    phase="cuda_graph",
                    message=texts.capture_failed_exception(v, oom_text(detail)),
                    elapsed_s=tim.capture_base_s * 0.5 * tc * nf,
                    oom=detail,
                )
            free -= ws
            allocs = [mem.graph_pool_base_gib + mem.graph_pool_per_bs_gib * capture[-1]]
            allocs += [mem.graph_pool_per_graph_gib] * (len(capture) - 1)
            for i, size in enumerate(allocs):
                if size > free - frag:
                    elapsed = (tim.capture_base_s + tim.capture_per_graph_s * i) * tc * nf
                    detail = self.oom(size, free, self.static_torch + ws + graph, private=graph)
                    self.figs["graph_gib"] = graph
                    return Failure(
                        kind="oom",
                        phase="cuda_graph",
                        message=texts.capture_failed_exception(v, oom_text(detail)),
                        elapsed_s=elapsed,
                        oom=detail,
                    )
                free -= size
                graph += size
        self.decode_graph = graph
        return None

    def prefill_graphs(self) -> Failure | None:
        """Prefill CUDA graphs (default from 0.5.10): one pool for the largest token count, a little per graph."""
        mem, frag, decode_graph, figs = self.mem, self.frag, self.decode_graph, self.figs
        ptokens = self.resolved.prefill_graph_tokens
        figs["prefill_graph_tokens"] = list(ptokens)
        pgraph = 0.0
        if ptokens and self.nccl.allgather_error is None:
            free = self.free_pool - decode_graph
            pdur = (self.tim.capture_base_s * 0.5 + self.tim.capture_per_graph_s * 0.2 * len(ptokens)) * self.nf
            self.durations["prefill_graph"] = pdur
            pool = mem.prefill_graph_base_gib + mem.prefill_graph_mib_per_token * ptokens[-1] / 1024.0
            allocs = [pool] + [mem.graph_pool_per_graph_gib] * (len(ptokens) - 1)
            for i, size in enumerate(allocs):
                if size > free - frag:
                    detail = self.oom(
                        size, free, self.static_torch + decode_graph + pgraph, private=decode_graph + pgraph
                    )
                    figs["graph_gib"] = decode_graph + pgraph
                    figs["prefill_graph_gib"] = pgraph
                    return Failure(
                        kind="oom",
                        phase="cuda_graph",
                        stage="prefill_graph",
                        message=texts.prefill_capture_failed_exception(self.v, oom_text(detail)),
                        elapsed_s=pdur * i / len(allocs),
                        oom=detail,
                    )
                free -= size
                pgraph += size
        figs["prefill_graph_gib"] = pgraph
        self.graph = decode_graph + pgraph
        figs["graph_gib"] = self.graph
        self.free_cap = self.free_pool - self.graph
        figs["free_after_capture_gib"] = self.free_cap
        return None

    def first_forward(self) -> Failure | None:
        """The first forward's logits AllGather has no algorithm: a bare NCCL_ALGO without Ring (NCCL >= 2.24), or
        one naming only other collectives beside a bare NCCL_PROTO (NCCL >= 2.31)."""
        tim, nf = self.tim, self.nf
        if self.nccl.allgather_error is not None:
            text = texts.nccl_exception(self.nccl.allgather_error, self.profile.host.nccl_version)
            if self.capture:
                message = texts.capture_failed_exception(self.v, text.split(": ", 1)[1])
                return Failure(
                    kind="nccl_error", phase="cuda_graph", message=message, elapsed_s=tim.capture_base_s * nf
                )
            return Failure(kind="nccl_error", phase="warmup", message=text)
        self.durations["server_start"] = tim.server_start_s * nf
        self.durations["warmup"] = 0.0 if self.launch.skip_server_warmup else tim.warmup_s * nf
        return None

    def runtime(self) -> RuntimeSpec:
        """What the serving engine needs of the server that started."""
        profile, launch, resolved = self.profile, self.launch, self.resolved
        tim, mem, mdl = self.tim, self.mem, self.mdl
        ptokens = resolved.prefill_graph_tokens
        eff = tim.attention_efficiency
        kv_read = resolved.kv_bytes_per_token * 1000 / (tim.hbm_gb_s * 1e9 * eff) * 1000 if tim.hbm_gb_s > 0 else 0.0
        return RuntimeSpec(
            max_running_requests=self.max_running,
            max_total_num_tokens=self.tokens,
            chunked_prefill_size=resolved.chunked_prefill_size,
            max_prefill_tokens=resolved.max_prefill_tokens,
            captured_bs=self.capture,
            schedule_conservativeness=launch.schedule_conservativeness,
            free_gib=self.free_cap,
            fragmentation_gib=self.frag,
            first_forward_gib=mem.warmup_transient_gib,
            prefill_mib_per_token=mem.prefill_activation_mib_per_token,
            prefill_largest_fraction=mem.prefill_largest_alloc_fraction,
            eager_mib_per_request=mem.eager_decode_mib_per_request,
            eager_largest_fraction=mem.eager_largest_alloc_fraction,
            total_gib=self.total,
            non_torch_gib=self.ctx,
            torch_static_gib=self.static_torch + self.graph,
            private_pool_gib=self.graph,
            decode_base_ms=tim.decode_base_ms,
            decode_per_request_ms=tim.decode_per_request_ms,
            moe_experts=tim.moe_experts,
            moe_top_k=tim.moe_top_k,
            moe_expert_ms=tim.moe_expert_ms,
            eager_multiplier=tim.eager_multiplier,
            eager_extra_ms=tim.eager_extra_ms,
            kv_read_ms_per_ktoken=kv_read,
            attention_window=mdl.sliding_window,
            window_layer_fraction=mdl.window_layer_fraction,
            prefill_base_ms=tim.prefill_base_ms,
            prefill_per_token_ms=tim.prefill_per_token_ms,
            prefill_attn_ms_per_mpair=tim.prefill_attn_ms_per_mpair,
            prefill_graph_max_tokens=ptokens[-1] if ptokens else 0,
            prefill_graph_base_factor=tim.prefill_graph_base_factor,
            torch_compile=launch.enable_torch_compile,
            torch_compile_max_bs=launch.torch_compile_max_bs,
            torch_compile_factor=tim.torch_compile_factor,
            time_factor=self.nf,
            nccl=nccl_cost(profile, launch, self.nccl),
            **_speculative_args(profile, launch),
        )


def plan_startup(
    profile: SimProfile,
    launch: SimLaunch,
    *,
    other_used_gib: float | Sequence[float] = 0.0,
    seed: int | None = None,
    world_other_used_gib: float | None = None,
) -> StartupPlan:
    """Resolve the launch and walk SGLang's start-up memory stages; stop at the first failure.

    ``world_other_used_gib`` (multi-node): the most GiB other processes hold on any node's GPUs, which sizes the
    KV pool on every rank; ``other_used_gib`` is this node's, which decides where this node runs out."""
    walk = _StartupWalk(profile, launch, other_used_gib, seed, world_other_used_gib)
    stages = (walk.init, walk.load_weights, walk.kv_pool, walk.decode_graphs, walk.prefill_graphs, walk.first_forward)
    for stage in stages:
        failure = stage()
        if failure is not None:
            # A first forward that dies does so in a server that started and serves: it keeps its runtime.
            extra = {"runtime": walk.runtime()} if stage == walk.first_forward else {}
            return walk.plan(failure, **extra)
    return walk.plan(runtime=walk.runtime())


def oom_text(detail: OomDetail, *, gpu: int = 0, others: Sequence[tuple[int, float]] = ()) -> str:
    """PyTorch's OutOfMemoryError text for ``detail`` on ``gpu``, after ``others`` (pid, GiB in use)."""
    return texts.torch_oom(
        tried_gib=detail.tried_gib,
        gpu=gpu,
        total_gib=detail.total_gib,
        free_gib=detail.free_gib,
        process_gib=detail.process_gib,
        allocated_gib=detail.allocated_gib,
        private_pool_gib=detail.private_pool_gib,
        reserved_unallocated_gib=detail.reserved_unallocated_gib,
        others=others,
    )


def _oom_line(detail: OomDetail) -> str:
    return f"torch.OutOfMemoryError: {oom_text(detail)}"


# ---------------------------------------------------------------------------------------------------------
# serving
# ---------------------------------------------------------------------------------------------------------


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, math.ceil(q / 100.0 * len(ordered)) - 1))
    return ordered[k]


def run_warmup(spec: RuntimeSpec) -> tuple[BatchEngine, OomDetail | None, float]:
    """Run SGLang's warm-up request through a fresh engine: (engine, OOM if it died, simulated seconds)."""
    eng = BatchEngine(spec, first_forward_done=False)
    eng.add(SimRequest(input_len=approx_tokens(WARMUP_PROMPT), max_new_tokens=WARMUP_MAX_NEW_TOKENS, is_warmup=True))
    t = 0.0
    while eng.has_work():
        batch = eng.next_batch()
        if batch is None:
            break
        if batch.oom is not None:
            return eng, batch.oom, t
        t += batch.duration_s
        eng.commit(batch, t)
    return eng, None, t


def _decode_run(eng: BatchEngine, allowed: bool) -> tuple[int, float, bool] | None:
    """The engine's stretch of decode steps at once (:meth:`BatchEngine.decode_run`) when ``allowed``."""
    return eng.decode_run(1 << 30) if allowed else None


def run_level(
    spec: RuntimeSpec, workload: Workload, concurrency: int, *, first_forward_done: bool = True,
    fast: bool = True,
) -> LevelResult:
    """Closed-loop load at one concurrency level on a server that just became ready.

    ``fast`` runs the stretches of decode steps in which nothing can join, finish or be retracted at once
    (:meth:`BatchEngine.decode_run`: the same step costs, without a batch object per step); without it every
    step is planned and committed as the live server's scheduler does (``runners/simhost/scheduler.py``). Both
    give the same figures (``tests/simhost/test_fast_model.py``)."""
    n_total = workload.requests_for(concurrency)
    eng = BatchEngine(spec, first_forward_done=first_forward_done)
    need = workload.input_len + workload.output_len
    if need > spec.max_total_num_tokens:
        return LevelResult(
            concurrency=concurrency,
            num_requests=n_total,
            ok=False,
            error=f"a request needs {need} tokens; the KV pool holds {spec.max_total_num_tokens}",
        )
    sent = 0
    in_flight = 0
    finished: list[SimRequest] = []
    graph_steps = eager_steps = retracted = 0
    rate = workload.request_rate

    def due(i: int) -> float:
        return i / rate if rate else 0.0

    def send(upto: float, at_least: float) -> None:
        nonlocal sent, in_flight
        while sent < n_total and in_flight < concurrency and due(sent) <= upto:
            eng.add(
                SimRequest(
                    input_len=workload.input_len,
                    max_new_tokens=workload.output_len,
                    arrival_s=max(due(sent), at_least),
                )
            )
            sent += 1
            in_flight += 1

    t = 0.0
    send(0.0, 0.0)
    while True:
        # No arrival can come during a stretch of decode steps while every slot is taken or everything is sent.
        run = _decode_run(eng, fast and not (sent < n_total and in_flight < concurrency))
        if run is not None:
            t += run[1]
            graph_steps, eager_steps = graph_steps + run[0] * run[2], eager_steps + run[0] * (not run[2])
            continue
        batch = eng.next_batch()
        if batch is None:
            if sent < n_total and in_flight < concurrency:
                t = max(t, due(sent))
                send(t, t)
                continue
            break
        if batch.oom is not None:
            return LevelResult(
                concurrency=concurrency,
                num_requests=n_total,
                ok=False,
                completed=len(finished),
                died_phase=batch.phase,
                tried_to_allocate_gib=batch.oom.tried_gib,
                free_at_oom_gib=batch.oom.free_gib,
            )
        end = t + batch.duration_s
        send(end, t)  # arrivals during the batch that found a free slot
        retracted += len(batch.retraction.requests) if batch.retraction is not None else 0
        graphed = [graph for _, _, graph in batch.decode_steps]
        graph_steps, eager_steps = graph_steps + graphed.count(True), eager_steps + graphed.count(False)
        for em in eng.commit(batch, end):
            if em.finished:
                finished.append(em.request)
                in_flight -= 1
        send(end, end)  # arrivals that waited for a slot
        t = end
    return _level_result(concurrency, n_total, finished, t, graph_steps, eager_steps, retracted)


def _level_result(
    concurrency: int,
    n_total: int,
    finished: Sequence[SimRequest],
    t: float,
    graph_steps: int,
    eager_steps: int,
    retracted: int,
) -> LevelResult:
    """The benchmark's figures for a level that ran to the end (``t`` simulated seconds)."""
    ttfts = [(r.first_token_s or 0.0) - r.arrival_s for r in finished]
    tpots = [
        ((r.finish_s or 0.0) - (r.first_token_s or 0.0)) / (r.max_new_tokens - 1)
        for r in finished
        if r.max_new_tokens > 1
    ]
    e2e = [(r.finish_s or 0.0) - r.arrival_s for r in finished]
    duration = t if t > 0 else 1e-9
    mode = "graph" if eager_steps == 0 else ("eager" if graph_steps == 0 else "mixed")
    return LevelResult(
        concurrency=concurrency,
        num_requests=n_total,
        ok=len(finished) == n_total,
        completed=len(finished),
        duration_s=t,
        output_throughput=sum(r.max_new_tokens for r in finished) / duration,
        request_throughput=len(finished) / duration,
        mean_ttft_ms=statistics.fmean(ttfts) * 1000 if ttfts else None,
        median_ttft_ms=statistics.median(ttfts) * 1000 if ttfts else None,
        p99_ttft_ms=_pct(ttfts, 99) * 1000 if ttfts else None,
        mean_tpot_ms=statistics.fmean(tpots) * 1000 if tpots else None,
        median_tpot_ms=statistics.median(tpots) * 1000 if tpots else None,
        mean_e2e_latency_ms=statistics.fmean(e2e) * 1000 if e2e else None,
        decode_mode=mode if (graph_steps or eager_steps) else None,
        retracted=retracted,
    )


# ---------------------------------------------------------------------------------------------------------
# evaluate
# ---------------------------------------------------------------------------------------------------------


def _resolved_summary(plan: StartupPlan) -> dict[str, Any] | None:
    r = plan.resolved
    if r is None:
        return None
    return {
        "mem_fraction_static": r.mem_fraction_static,
        "chunked_prefill_size": r.chunked_prefill_size,
        "max_prefill_tokens": r.max_prefill_tokens,
        "cuda_graph_max_bs": r.cuda_graph_max_bs,
        "disable_cuda_graph": r.disable_cuda_graph,
        "context_len": r.context_len,
        "kv_cache_dtype": r.kv_cache_dtype,
        "kv_bytes_per_token": r.kv_bytes_per_token,
        "page_size": r.page_size,
        "num_continuous_decode_steps": r.num_continuous_decode_steps,
        "prefill_graph_max_tokens": r.prefill_graph_tokens[-1] if r.prefill_graph_tokens else None,
        "tp_size": r.tp_size,
    }


def evaluate(
    profile: SimProfile,
    launch: SimLaunch,
    workload: Workload | None = None,
    *,
    other_used_gib: float | Sequence[float] = 0.0,
    seed: int | None = None,
) -> Outcome:
    """Whether and where the server dies, its memory figures, and the workload's latency per level.

    Each concurrency level is run on a server that has just become ready (fresh KV pool, warm-up
    done), so one dying level does not hide the others. ``seed`` adds the run-to-run noise the
    server would have with ``--sim-seed``; without it the figures are the profile's expected values.
    """
    workload = workload or Workload()
    plan = plan_startup(profile, launch, other_used_gib=other_used_gib, seed=seed)
    startup_s = sum(plan.durations.values())
    nccl = plan.nccl.model_dump(exclude={"warn", "custom_allreduce_disabled_warning"})
    common: dict[str, Any] = {
        "profile": profile.name,
        "version": launch.version,
        "resolved": _resolved_summary(plan),
        "nccl": nccl,
    }
    f = plan.failure
    if f is not None:
        levels = [
            LevelResult(concurrency=c, num_requests=workload.requests_for(c), ok=False, died_phase=f.phase)
            for c in workload.concurrency
        ]
        return Outcome(
            outcome=f.kind,
            phase=f.phase,
            error=f.message.splitlines()[0],
            exit_code=137,
            memory=plan.memory,
            startup_s=startup_s,
            levels=levels,
            **common,
        )
    spec = plan.runtime
    assert spec is not None
    first_done = False
    memory = plan.memory
    if not launch.skip_server_warmup:
        _, died, warm_s = run_warmup(spec)
        startup_s += warm_s
        if died is not None:
            memory = memory.model_copy(
                update={"tried_to_allocate_gib": died.tried_gib, "free_at_oom_gib": died.free_gib}
            )
            levels = [
                LevelResult(concurrency=c, num_requests=workload.requests_for(c), ok=False, died_phase="warmup")
                for c in workload.concurrency
            ]
            return Outcome(
                outcome="oom",
                phase="warmup",
                error=_oom_line(died),
                exit_code=137,
                memory=memory,
                startup_s=startup_s,
                levels=levels,
                **common,
            )
        first_done = True
    levels = [run_level(spec, workload, c, first_forward_done=first_done) for c in workload.concurrency]
    dead = next((lv for lv in levels if lv.died_phase), None)
    if dead is not None:
        memory = memory.model_copy(
            update={
                "tried_to_allocate_gib": dead.tried_to_allocate_gib,
                "free_at_oom_gib": dead.free_at_oom_gib,
            }
        )
        return Outcome(
            outcome="oom",
            phase=dead.died_phase,  # type: ignore[arg-type]
            error=f"torch.OutOfMemoryError at concurrency {dead.concurrency} ({dead.died_phase})",
            exit_code=137,
            memory=memory,
            startup_s=startup_s,
            levels=levels,
            **common,
        )
    return Outcome(outcome="ok", memory=memory, startup_s=startup_s, levels=levels, **common)


def predict_from_argv(
    profile: SimProfile,
    argv: Sequence[str],
    env: Mapping[str, str],
    workload: Workload,
    *,
    version: str = DEFAULT_VERSION,
    seed: int | None = None,
    other_used_gib: float = 0.0,
) -> Outcome:
    """Parse SGLang flags as ``version`` does and evaluate; a refused command line is ``bad_flag``."""
    try:
        launch = SimLaunch.from_argv(argv, env, version)
    except BadFlag as exc:
        return Outcome(
            outcome="bad_flag",
            phase=None,
            profile=profile.name,
            version=version,
            error=exc.text.strip().splitlines()[-1],
            exit_code=exc.exit_code,
        )
    return evaluate(profile, launch, workload, other_used_gib=other_used_gib, seed=seed)


#: SGLang's speculative defaults when only the algorithm is given (srt/server_args.py, EAGLE: 3 steps, topk 1,
#: 4 draft tokens, as ``_handle_speculative_decoding`` fills them at 0.5.10).
_SPEC_DEFAULTS = {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}


def _speculative_args(profile: SimProfile, launch: SimLaunch) -> dict[str, Any]:
    """The runtime's speculative figures for ``launch`` (none without ``--speculative-algorithm``)."""
    if not launch.speculative_algorithm:
        return {}
    got = {k: launch.args.get(k) or v for k, v in _SPEC_DEFAULTS.items()}
    spec = profile.speculative
    return {"spec_steps": int(got["speculative_num_steps"]), "spec_topk": int(got["speculative_eagle_topk"]),
            "spec_draft_tokens": int(got["speculative_num_draft_tokens"]), "spec_acceptance": spec.acceptance,
            "spec_draft_ms": spec.draft_step_ms, "spec_verify_ms_per_token": spec.verify_ms_per_token}


def numerics_of(profile: SimProfile, launch: SimLaunch) -> Numerics:
    """The settings of ``launch`` that change what the model answers (:mod:`runners.simhost.numerics`)."""
    kv = launch.kv_cache_dtype.lower()
    return Numerics(
        spec=profile.numerics,
        ll128_corrupts=launch.tp_size > 1 and nccl_effect(profile, launch).ll128_unsupported,
        fp8_kv=kv.startswith(("fp8", "fp4", "mxfp", "nvfp")),
        speculative=bool(launch.speculative_algorithm),
    )
