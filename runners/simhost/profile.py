"""Simulated-host profiles: one YAML file describes a GPU host, a model on it, and how it behaves.

A profile is the only input of the simulator besides the launch flags. Every figure it holds is a
calibration constant, not a measurement; the shipped profiles in ``profiles/`` are calibrated on the
incidents in ``docs/sources/seeds`` or on public figures (model configs, GPU data sheets, published
throughput), as each file's ``calibration`` note says.

Schema (all sizes in GiB unless the name says MiB or bytes, all durations in simulated seconds or ms)::

    name: str                          # short id, shown in logs and /get_server_info
    description: str                   # free text
    calibration: str                   # free text: where the figures come from

    host:
      gpu_name: str                    # as nvidia-smi prints it
      gpu_count: int
      memory_total_mib: int            # nvidia-smi memory.total; torch's "total capacity" too
      interconnect: pcie | nvlink
      smi_baseline_used_mib: int = 4   # memory.used with no process (driver), per GPU
      driver_version: str = "580.95.05"

    model:
      name: str                        # e.g. deepseek-ai/DeepSeek-V4-Flash
      architecture: str                # class name in "Load weight end. type=..."
      dtype: str = bfloat16            # "dtype=torch.<dtype>" in the 0.5.2-era log line
      attention: mla | mha             # mla: one latent KV per token on every rank; mha: K and V split by TP
      context_length: int              # the model's default context length
      reference_tp: int                # the TP size the per-GPU figures below were taken at
      weights_gib_per_gpu: float       # at reference_tp; or give weights_gib_total (split by TP)
      weights_gib_total: float
      replicated_weights_gib: float = 0   # part of the weights every rank holds (embeddings, ...)
      weight_shard_gib: float = 2.0    # largest single tensor copied while loading (the OOM allocation)
      kv_bytes_per_token: int          # per GPU, at reference_tp and kv_cache_dtype_default
      kv_cache_dtype_default: str = bfloat16   # what --kv-cache-dtype auto means for this model
      default_max_running_requests: int | None  # model-specific override SGLang applies when the
                                                # flag is absent (e.g. 256 for DeepSeek-V4)
      piecewise_cuda_graph: bool = false        # whether SGLang's default-on prefill CUDA graphs
                                                # (0.5.10+) apply to this model (SGLang turns them
                                                # off for some architectures)
      kv_pool: standard | deepseek_v4 = standard   # deepseek_v4 logs "Initialize DeepSeekV4TokenToKVPool"
                                                   # instead of "KV Cache is allocated"
      num_layers: int = 0              # transformer layers (all-reduces per token: 2 per layer)
      hidden_size: int = 0             # all-reduce message = tokens x hidden_size x 2 bytes
      sliding_window: int | None       # sliding-window layers attend to at most this many tokens
      window_layer_fraction: float = 0 # share of layers that are sliding-window

    memory:
      cuda_context_gib: float          # per process and GPU, before anything else
      nccl_base_gib: float             # NCCL buffers with TP>1 ...
      nccl_per_peer_gib: float         # ... plus this per other rank
      misc_static_gib: float           # buffers allocated with the memory pool besides the KV cache
                                       # (the req_to_token table is computed: rows x (context+4) x 4 B)
      graph_pool_base_gib: float       # CUDA-graph private pool: base + per_bs * max captured bs
      graph_pool_per_bs_gib: float     #   (allocated in one piece when the largest graph is captured)
      graph_pool_per_graph_gib: float  #   + this for every further captured batch size
      graph_workspace_gib: float       # contiguous workspace held while capturing, released after
      prefill_activation_mib_per_token: float   # transient per token of a prefill (chunked) batch
      prefill_largest_alloc_fraction: float     # share of it that is one allocation (the OOM size)
      eager_decode_mib_per_request: float       # transient per request of a decode batch run eagerly
                                                # (larger than the largest captured graph)
      eager_largest_alloc_fraction: float
      warmup_transient_gib: float      # kept after the first forward (sampler/logits buffers)
      fragmentation_gib: float         # allowance: the largest contiguous block is free - this
      prefill_graph_base_gib: float = 0      # prefill CUDA graphs (0.5.10+ default): private pool
      prefill_graph_mib_per_token: float = 0 #   base + per_token x largest captured token count

    timing:
      dist_init_s: float               # torch.distributed + NCCL init
      weight_load_s: float             # loading all weights
      kv_alloc_s: float = 1.0
      capture_base_s: float            # CUDA-graph capture: base + per graph
      capture_per_graph_s: float
      torch_compile_capture_factor: float = 3.0   # capture takes this much longer with torch.compile
      server_start_s: float = 2.0      # tokenizer manager, detokenizer, HTTP server
      warmup_s: float = 3.0            # first-forward overheads of the warm-up request (JIT, ...)
      decode_base_ms: float            # graph-mode decode step: base + per_request * padded batch size
      decode_per_request_ms: float     #   (+ KV read + NCCL effect, below)
      hbm_gb_s: float = 0              # GPU memory bandwidth; a decode step reads every running
      attention_efficiency: float = 0.6  # request's KV at hbm_gb_s x this (MLA kernels are
                                       # compute-heavier: lower); 0 bandwidth = no context term
      eager_multiplier: float          # eager step = graph step(N) * multiplier + extra
      eager_extra_ms: float
      prefill_base_ms: float           # prefill batch: base + per_token * tokens
      prefill_per_token_ms: float      #   + attn x n(prefix + n/2) / 1e6 per request chunk
      prefill_attn_ms_per_mpair: float = 0
      prefill_graph_base_factor: float = 0.7   # prefill batches a prefill graph covers pay this share
                                               # of prefill_base_ms (launch overhead saved)
      torch_compile_factor: float = 0.95   # step-time factor for batches <= --torch-compile-max-bs
      noise_pct: float = 2.0           # run-to-run noise (one factor per run, seedable), percent
      nccl:                            # all-reduce cost by message size (runners/simhost/nccl.py); the
                                       # decode/prefill figures above are at NCCL's own choice
        link_gb_s: float | None        # ring bus bandwidth; default 20 (PCIe) / 350 (NVLink)
        hop_latency_scale: float | None  # x NCCL's hop latencies; default 3 (PCIe) / 1 (NVLink)
        custom_ar_max_mib: float = 8   # SGLang's custom all-reduce carries messages up to this
        p2p_disable_factor: float      # NCCL_P2P_DISABLE=1 / NCCL_P2P_LEVEL=LOC (through host memory)
        shm_disable_factor: float      # ... and NCCL_SHM_DISABLE=1 too (sockets)
        inter_node_gb_s: float = 50    # between nodes, per GPU (--nnodes > 1: every all-reduce crosses it,
        inter_node_latency_scale: float = 5  #   custom all-reduce is off across nodes)

    numerics:                          # what settings do to the answers (the correctness gate's truth)
      ll128_pcie_corrupt_fraction: float = 0.25   # answers corrupted by NCCL_PROTO forcing LL128 on PCIe
      fp8_kv_logprob_shift: float = 0.04          # mean |logprob| change per token with an FP8 KV cache
      fp8_kv_divergent_fraction: float = 0.05     # greedy answers an FP8 KV cache changes
      speculative_logprob_noise: float = 0.002    # speculative decoding keeps the tokens

    speculative:                       # --speculative-algorithm EAGLE & co (runners/simhost/engine.py)
      acceptance: float = 0.72         # chance one drafted token is accepted (topk 1)
      draft_step_ms: float = 0.6       # one draft forward
      verify_ms_per_token: float = 0.05   # per extra verified token and running request
      draft_weights_gib: float = 1.0   # draft weights per GPU

    power:                             # nvidia-smi power.draw per GPU: idle_w + (max_w - idle_w) x util
      idle_w: float = 60
      max_w: float = 560

Durations are simulated; the server divides them by its ``--sim-speed``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from runners.errors import validation_line

__all__ = [
    "HostSpec",
    "MemorySpec",
    "ModelSpec",
    "NcclTiming",
    "NumericsSpec",
    "PowerSpec",
    "ProfileError",
    "SimProfile",
    "SpeculativeSpec",
    "TimingSpec",
    "checkpoint_json",
    "load_profile",
    "shipped_profile",
    "shipped_profiles",
]

PROFILES_DIR = Path(__file__).with_name("profiles")


class ProfileError(ValueError):
    """A profile file is missing, is not YAML, or does not match the schema."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class HostSpec(_Frozen):
    gpu_name: str
    gpu_count: int = Field(ge=1, le=64)
    memory_total_mib: int = Field(gt=0)
    interconnect: Literal["pcie", "nvlink"]
    smi_baseline_used_mib: int = Field(default=4, ge=0)
    driver_version: str = "580.95.05"
    nccl_version: str = Field(default="2.27.3", pattern=r"^\d+\.\d+(\.\d+)?$")
    """The NCCL the host's torch loads: the NCCL rules the simulated host follows (and its preflight reports)."""

    @property
    def nccl(self) -> tuple[int, int, int]:
        major, minor, *rest = (int(p) for p in self.nccl_version.split("."))
        return major, minor, rest[0] if rest else 0

    @property
    def memory_total_gib(self) -> float:
        return self.memory_total_mib / 1024.0


class ModelSpec(_Frozen):
    name: str
    architecture: str
    dtype: str = "bfloat16"
    attention: Literal["mla", "mha"]
    context_length: int = Field(gt=0)
    reference_tp: int = Field(default=1, ge=1)
    weights_gib_per_gpu: float | None = Field(default=None, gt=0)
    weights_gib_total: float | None = Field(default=None, gt=0)
    replicated_weights_gib: float = Field(default=0.0, ge=0)
    weight_shard_gib: float = Field(default=2.0, gt=0)
    kv_bytes_per_token: int = Field(gt=0)
    kv_cache_dtype_default: str = "bfloat16"
    default_max_running_requests: int | None = Field(default=None, gt=0)
    piecewise_cuda_graph: bool = False
    kv_pool: Literal["standard", "deepseek_v4"] = "standard"
    num_layers: int = Field(default=0, ge=0)
    hidden_size: int = Field(default=0, ge=0)
    sliding_window: int | None = Field(default=None, gt=0)
    window_layer_fraction: float = Field(default=0.0, ge=0, le=1)

    @model_validator(mode="after")
    def _one_weight_figure(self) -> ModelSpec:
        if (self.weights_gib_per_gpu is None) == (self.weights_gib_total is None):
            raise ValueError("give exactly one of weights_gib_per_gpu and weights_gib_total")
        return self

    def weights_total(self) -> float:
        """Total weights over all ranks at the reference TP, replicated part counted once."""
        if self.weights_gib_total is not None:
            return self.weights_gib_total
        assert self.weights_gib_per_gpu is not None
        sharded = self.weights_gib_per_gpu - self.replicated_weights_gib
        return sharded * self.reference_tp + self.replicated_weights_gib

    def weights_per_gpu(self, tp: int) -> float:
        """Weights one rank holds at TP ``tp``."""
        if self.weights_gib_per_gpu is not None and tp == self.reference_tp:
            return self.weights_gib_per_gpu
        sharded = self.weights_total() - self.replicated_weights_gib
        return sharded / tp + self.replicated_weights_gib

    def kv_bytes(self, tp: int, dtype_bytes_ratio: float) -> float:
        """KV-cache bytes per token on one rank, for TP ``tp`` and a dtype size ratio to the default."""
        per = float(self.kv_bytes_per_token) * dtype_bytes_ratio
        if self.attention == "mha":
            per = per * self.reference_tp / tp
        return per


class MemorySpec(_Frozen):
    cuda_context_gib: float = Field(ge=0)
    nccl_base_gib: float = Field(ge=0)
    nccl_per_peer_gib: float = Field(ge=0)
    misc_static_gib: float = Field(default=0.0, ge=0)
    graph_pool_base_gib: float = Field(ge=0)
    graph_pool_per_bs_gib: float = Field(ge=0)
    graph_pool_per_graph_gib: float = Field(ge=0)
    graph_workspace_gib: float = Field(ge=0)
    prefill_activation_mib_per_token: float = Field(ge=0)
    prefill_largest_alloc_fraction: float = Field(default=0.5, gt=0, le=1)
    eager_decode_mib_per_request: float = Field(ge=0)
    eager_largest_alloc_fraction: float = Field(default=0.5, gt=0, le=1)
    warmup_transient_gib: float = Field(default=0.0, ge=0)
    fragmentation_gib: float = Field(default=0.0, ge=0)
    prefill_graph_base_gib: float = Field(default=0.0, ge=0)
    prefill_graph_mib_per_token: float = Field(default=0.0, ge=0)


class NcclTiming(_Frozen):
    link_gb_s: float | None = Field(default=None, gt=0)
    hop_latency_scale: float | None = Field(default=None, gt=0)
    custom_ar_max_mib: float = Field(default=8.0, ge=0)
    p2p_disable_factor: float = Field(default=1.5, gt=0)
    shm_disable_factor: float = Field(default=3.0, gt=0)
    inter_node_gb_s: float = Field(default=50.0, gt=0)
    """Bus bandwidth between nodes per GPU (a 400 Gb/s NIC per GPU: 50 GB/s); a server spanning nodes sends every
    all-reduce through it."""
    inter_node_latency_scale: float = Field(default=5.0, gt=0)
    """x NCCL's hop latencies for a hop between nodes."""


class TimingSpec(_Frozen):
    dist_init_s: float = Field(ge=0)
    weight_load_s: float = Field(ge=0)
    kv_alloc_s: float = Field(default=1.0, ge=0)
    capture_base_s: float = Field(ge=0)
    capture_per_graph_s: float = Field(ge=0)
    torch_compile_capture_factor: float = Field(default=3.0, ge=1)
    server_start_s: float = Field(default=2.0, ge=0)
    warmup_s: float = Field(default=3.0, ge=0)
    decode_base_ms: float = Field(gt=0)
    decode_per_request_ms: float = Field(ge=0)
    moe_experts: int = Field(default=0, ge=0)
    """Routed experts per MoE layer (0: no MoE term). A decode step reads the weights of every expert its batch
    activates, ``E x (1 - (1 - k/E)^bs)`` of them, each costing ``moe_expert_ms``: decode time grows fast at small
    batches and saturates once every expert is active."""
    moe_top_k: int = Field(default=0, ge=0)
    moe_expert_ms: float = Field(default=0.0, ge=0)
    hbm_gb_s: float = Field(default=0.0, ge=0)
    attention_efficiency: float = Field(default=0.6, gt=0, le=1)
    eager_multiplier: float = Field(default=1.0, ge=1)
    eager_extra_ms: float = Field(default=0.0, ge=0)
    prefill_base_ms: float = Field(ge=0)
    prefill_per_token_ms: float = Field(ge=0)
    prefill_attn_ms_per_mpair: float = Field(default=0.0, ge=0)
    prefill_graph_base_factor: float = Field(default=0.7, gt=0, le=1)
    torch_compile_factor: float = Field(default=0.95, gt=0)
    noise_pct: float = Field(default=2.0, ge=0, le=50)
    nccl: NcclTiming


class NumericsSpec(_Frozen):
    """How settings change what the simulated model answers (the correctness gate's ground truth)."""

    ll128_pcie_corrupt_fraction: float = Field(default=0.25, ge=0, le=1)
    """Share of answers that ``NCCL_PROTO`` forcing LL128 on PCIe with TP > 1 corrupts (NCCL's env.rst warns that
    LL128 where unsupported "can lead to data corruption")."""
    fp8_kv_logprob_shift: float = Field(default=0.04, ge=0)
    """Mean absolute logprob change (nats) an FP8 KV cache gives every generated token."""
    fp8_kv_divergent_fraction: float = Field(default=0.05, ge=0, le=1)
    """Share of greedy answers an FP8 KV cache changes (from a token whose top-2 margin it overturns)."""
    speculative_logprob_noise: float = Field(default=0.002, ge=0)
    """Logprob noise of speculative decoding (greedy verification keeps the tokens)."""


class SpeculativeSpec(_Frozen):
    """Speculative decoding (EAGLE-style) on the simulated host: what a draft model costs and how much it wins."""

    acceptance: float = Field(default=0.72, gt=0, lt=1)
    """Chance that the target accepts one drafted token (one chain, ``--speculative-eagle-topk 1``)."""
    draft_step_ms: float = Field(default=0.6, ge=0)
    """One draft forward (per ``--speculative-num-steps``)."""
    verify_ms_per_token: float = Field(default=0.05, ge=0)
    """What each extra verified token adds per running request to the target's step (compute-bound at large
    batches: speculation pays at small ones)."""
    draft_weights_gib: float = Field(default=1.0, ge=0)
    """The draft model's weights on each GPU (loaded after the target's: less room for the KV pool)."""


class PowerSpec(_Frozen):
    """What the simulated ``nvidia-smi`` reports as ``power.draw`` per GPU: idle, rising with utilisation."""

    idle_w: float = Field(default=60.0, ge=0)
    max_w: float = Field(default=560.0, gt=0)


class SimProfile(_Frozen):
    name: str
    description: str = ""
    calibration: str = ""
    host: HostSpec
    model: ModelSpec
    memory: MemorySpec
    timing: TimingSpec
    numerics: NumericsSpec = Field(default_factory=NumericsSpec)
    power: PowerSpec = Field(default_factory=PowerSpec)
    speculative: SpeculativeSpec = Field(default_factory=SpeculativeSpec)

    @property
    def calibration_line(self) -> str:
        """What the profile is calibrated to, in one line: the first clause of its ``calibration`` note (up to
        the first ``;``), so a reader of absolute figures knows which incident or public figures set them."""
        text = " ".join(self.calibration.split())
        first = text.split(";", 1)[0].rstrip(". ")
        return f"{self.name}: {first}" if first else self.name


def checkpoint_json(profile: SimProfile) -> dict[str, object]:
    """The checkpoint the simulated host serves for its model path: a ``config.json`` with the figures the
    profile's memory arithmetic uses (layers; KV heads and head size that give its KV bytes per token, or MLA's
    latent for ``attention: mla``) and the weights' size at the reference TP (every rank's share)."""
    m = profile.model
    layers = m.num_layers or 32
    # config.json states the model's KV heads, not the KV dtype an engine picks: a reader counts 2 bytes a value
    # (a profile whose default KV cache is fp8 holds half of that).
    dtype_bytes = 2
    total_kv = float(m.kv_bytes_per_token) * (m.reference_tp if m.attention == "mha" else 1) * (
        2 if m.kv_cache_dtype_default.startswith("fp8") else 1)
    config: dict[str, object] = {"architectures": [m.architecture], "num_hidden_layers": layers,
                                 "max_position_embeddings": m.context_length, "torch_dtype": m.dtype}
    if m.hidden_size:
        config["hidden_size"] = m.hidden_size
    if m.attention == "mha":
        head_dim = 128
        config |= {"head_dim": head_dim,
                   "num_key_value_heads": max(1, round(total_kv / (2 * layers * head_dim * dtype_bytes)))}
    else:
        config |= {"kv_lora_rank": max(1, round(total_kv / (layers * dtype_bytes))), "qk_rope_head_dim": 0}
    weights = m.weights_per_gpu(m.reference_tp) * m.reference_tp
    return {"config": config, "weights_bytes": int(weights * (1 << 30))}


def load_profile(path: str | Path) -> SimProfile:
    """Read and validate one profile file; raise :class:`ProfileError` with a one-line reason."""
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProfileError(f"cannot read profile {p}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ProfileError(f"profile {p} is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ProfileError(f"profile {p} must be a mapping at the top level")
    try:
        return SimProfile.model_validate(raw)
    except ValidationError as exc:
        where, msg = validation_line(exc)
        raise ProfileError(f"profile {p}: {where}: {msg} ({exc.error_count()} error(s))") from exc


def shipped_profiles() -> list[Path]:
    """The profile files that ship with the package."""
    return sorted(PROFILES_DIR.glob("*.yaml"))


def shipped_profile(name: str) -> Path:
    """Path of a shipped profile by file stem (``dsv4-flash-tp4-rtxpro6000``)."""
    path = PROFILES_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ProfileError(f"no shipped profile named {name!r}")
    return path
