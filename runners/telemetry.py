"""What a trial's server did, as values: phases, failure kinds, memory telemetry.

A server that dies is data, not an exception. :class:`Failure` says how it died; :class:`Telemetry`
holds every memory figure read from its log and from nvidia-smi, and serialises to a plain dict so the
search layer can store it as Optuna user attrs and MLflow params/metrics. :class:`MemoryFigures` is the one
schema of those figures (names, types, labels).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from runners.errors import HostBusy, HostMisconfigured, RunnerError


class Phase(StrEnum):
    """Where a server is in its life (and so where it died)."""

    STARTING = "starting"
    LOAD_WEIGHTS = "load_weights"
    KV_POOL = "kv_pool"
    CUDA_GRAPH = "cuda_graph"
    WARMUP = "warmup"
    READY = "ready"
    PREFILL = "prefill"
    DECODE = "decode"
    SERVING = "serving"


class FailureKind(StrEnum):
    """Why a trial did not produce a value.

    Config-caused kinds become PRUNED trials (the sampler should learn from them); the others are
    infrastructure trouble and become FAIL (the sampler must learn nothing from them). Whether a kind is
    the configuration's fault is said once, in :data:`CONFIG_CAUSED`.
    """

    OOM = "oom"
    NCCL_ERROR = "nccl_error"
    BAD_FLAG = "bad_flag"
    CRASH = "crash"
    STARTUP_TIMEOUT = "startup_timeout"
    BENCHMARK_TIMEOUT = "benchmark_timeout"
    HOST_UNREACHABLE = "host_unreachable"
    HOST_BUSY = "host_busy"
    HOST_CONFIG = "host_config"
    PORT_IN_USE = "port_in_use"
    STOPPED_FROM_OUTSIDE = "stopped_from_outside"
    SCHEDULER = "scheduler"
    """The cluster's scheduler ended the job (a node failed, preemption, the time limit, a cancel servetune did
    not send), or the job waited in the queue past its limit."""
    INTERRUPTED = "interrupted"
    INFRA = "infra"
    DIST_INIT_TIMEOUT = "dist_init_timeout"
    """A server spanning nodes hung at init past its ``--dist-timeout``: a rank never reached the head's
    rendezvous (the head's ``DistStoreError: Timed out ... waiting for clients``, or a rank's ``DistNetworkError:
    The client socket has timed out``). The nodes or the network, never an OOM."""
    PREDICTED_OOM = "predicted_oom"
    """Not launched: the study's memory model says the configuration dies of OOM (a prediction, never a
    measured OOM)."""
    CONSTRAINT = "constraint"
    """Not launched: the configuration breaks one of the space's constraints between knobs."""
    IMPLAUSIBLE_FIGURE = "implausible_figure"
    """The server's own figures contradict what was asked (it reported more tokens than a request asked for,
    beyond the tokenizer's slack): its throughput cannot be believed, so nothing is learnt from it."""

    @property
    def config_caused(self) -> bool:
        return CONFIG_CAUSED[self]


#: Did the configuration cause it? True: PRUNED (the sampler learns); False: FAIL (retried, nothing learnt).
#: Every kind is listed, so a new kind must say which it is.
CONFIG_CAUSED: dict[FailureKind, bool] = {
    FailureKind.OOM: True,
    FailureKind.NCCL_ERROR: True,
    FailureKind.BAD_FLAG: True,
    FailureKind.CRASH: True,
    FailureKind.STARTUP_TIMEOUT: False,  # a slow host or a hung download, not a bad setting by itself
    FailureKind.BENCHMARK_TIMEOUT: False,
    FailureKind.HOST_UNREACHABLE: False,
    FailureKind.HOST_BUSY: False,  # a foreign process or another controller holds the GPUs or the port
    FailureKind.HOST_CONFIG: False,  # the host's set-up (no nvidia-smi, no SFTP, no engine)
    FailureKind.PORT_IN_USE: False,  # the server could not bind: someone else holds the port
    FailureKind.STOPPED_FROM_OUTSIDE: False,  # a signal servetune did not send, or an unasked exit 0
    FailureKind.SCHEDULER: False,  # Slurm's own faults: node failure, preemption, time limit, outside cancel
    FailureKind.INTERRUPTED: False,
    FailureKind.INFRA: False,
    FailureKind.DIST_INIT_TIMEOUT: False,  # a node that never joined: the hosts or the network, not the knobs
    FailureKind.CONSTRAINT: True,  # PRUNED without a launch: the sampler learns to stay inside the constraint
    FailureKind.PREDICTED_OOM: True,  # PRUNED without a launch: the sampler learns the region is infeasible
    FailureKind.IMPLAUSIBLE_FIGURE: False,  # a server that lies about its tokens: never a figure, never a lesson
}
assert set(CONFIG_CAUSED) == set(FailureKind), "every FailureKind says whether the configuration caused it"


def kind_of_error(exc: RunnerError) -> FailureKind:
    """The failure kind a trial gets when ``exc`` stops it before or outside the server's own life."""
    if isinstance(exc, HostBusy):
        return FailureKind.HOST_BUSY
    if isinstance(exc, HostMisconfigured):
        return FailureKind.HOST_CONFIG
    return FailureKind.HOST_UNREACHABLE


@dataclass(frozen=True)
class Failure:
    """How a server or trial failed: kind, phase, one-line reason, and the exit code when known."""

    kind: FailureKind
    phase: Phase | None = None
    reason: str = ""
    exit_code: int | None = None


def _figure(label: str, *, setting: bool = False) -> Any:
    """A memory figure's field: ``label`` is what outputs call it (with its unit); ``setting``: a setting as the
    engine resolved it, or a constant of the host and model (MLflow logs those as params, the rest as metrics)."""
    return Field(default=None, description=label, json_schema_extra={"setting": setting})


class MemoryFigures(BaseModel):
    """The memory figures of one server run, in the order a server allocates memory (GiB unless the name says
    otherwise; None = not seen): the one schema of them. :class:`Telemetry` (what a run fills) and the search's
    ``MemoryFacts`` (what a trial stores) are these fields; each figure's label and whether it is a setting are
    said here once (:meth:`labels`, :meth:`settings`)."""

    model_config = ConfigDict(extra="ignore")

    gpu_total_gib: float | None = _figure("GPU total (GiB)", setting=True)
    mem_fraction_static: float | None = _figure("mem_fraction_static (as run)", setting=True)
    """As the engine resolved it (the searched value, or the engine's default)."""
    cuda_graph_max_bs: int | None = _figure("cuda_graph_max_bs (as run)", setting=True)
    avail_before_weights_gib: float | None = _figure("available before weights (GiB)", setting=True)
    weights_gib: float | None = _figure("weights (GiB)", setting=True)
    avail_after_weights_gib: float | None = _figure("available after weights (GiB)")
    kv_tokens: int | None = _figure("KV cache tokens")
    kv_gib: float | None = _figure("KV cache (GiB)")
    avail_after_kv_gib: float | None = _figure("available after KV pool (GiB)")
    graph_gib: float | None = _figure("CUDA graphs (GiB)")
    free_after_capture_gib: float | None = _figure("free after CUDA graph capture (GiB)")
    max_total_num_tokens: int | None = _figure("max_total_num_tokens")
    max_running_requests: int | None = _figure("max_running_requests", setting=True)
    chunked_prefill_size: int | None = _figure("chunked_prefill_size", setting=True)
    context_len: int | None = _figure("context_len", setting=True)
    oom_phase: str | None = _figure("OOM phase")
    tried_to_allocate_gib: float | None = _figure("OOM: tried to allocate (GiB)")
    free_at_oom_gib: float | None = _figure("OOM: free at the time (GiB)")
    smi_peak_used_mib: float | None = _figure("nvidia-smi peak used (GiB)")
    """Shown in GiB by the outputs."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The figures' names, in allocation order."""
        return tuple(MemoryFigures.model_fields)

    @classmethod
    def labels(cls) -> dict[str, str]:
        """Each figure's label (with its unit), in allocation order."""
        return {name: f.description or name for name, f in MemoryFigures.model_fields.items()}

    @classmethod
    def settings(cls) -> tuple[str, ...]:
        """The figures that are settings as the engine resolved them, or constants of the host and model."""
        return tuple(name for name, f in MemoryFigures.model_fields.items()
                     if isinstance(f.json_schema_extra, dict) and f.json_schema_extra.get("setting"))


class Telemetry(MemoryFigures):
    """Memory figures of one server run (:class:`MemoryFigures`), filled line by line by an engine's log parser
    while the server runs, then by nvidia-smi samples; an engine's own figures beyond them go in ``extra``."""

    model_config = ConfigDict(extra="forbid")

    simulated: bool = False
    extra: dict[str, Any] = Field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Only the figures that were seen (None dropped), ``extra`` flattened in."""
        data = self.model_dump(warnings=False)  # a parser's int in a float figure is kept as it is
        extra = data.pop("extra")
        out = {k: v for k, v in data.items() if v is not None}
        out.update({k: v for k, v in extra.items() if v is not None})
        return out

    def merge(self, other: dict[str, Any]) -> None:
        for key, value in other.items():
            if value is None:
                continue
            if key in type(self).model_fields and key != "extra":
                setattr(self, key, value)
            else:
                self.extra[key] = value


def allocation_text(tried_gib: float, free_gib: float, verb: str = "tried to allocate") -> str:
    """``tried to allocate X GiB with Y GiB free``; when ``Y >= X`` the allocator failed for want of one free
    block that large, and the text says so (PyTorch's "of which Y is free" counts every free byte, in pieces)."""
    text = f"{verb} {tried_gib:.2f} GiB with {free_gib:.2f} GiB free"
    if free_gib >= tried_gib:
        text += ", but the largest free block is smaller (fragmentation)"
    return text


def parse_size_gib(text: str) -> float:
    """``'3.94 GiB'`` / ``'158.62 MiB'`` / ``'512 bytes'`` (torch ``format_size``) to GiB."""
    number, _, unit = text.strip().partition(" ")
    value = float(number)
    scale = {"bytes": 1 / 2**30, "KiB": 1 / 2**20, "MiB": 1 / 2**10, "GiB": 1.0, "TiB": 1024.0}
    try:
        return value * scale[unit.strip()]
    except KeyError as exc:
        raise ValueError(f"unknown size unit in {text!r}") from exc
