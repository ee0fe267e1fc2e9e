"""Diagnose a server log file the way a trial would record it (``servetune diagnose LOG``).

Given the text of an SGLang or vLLM server log, as people paste it, :func:`diagnose` returns a
:class:`Diagnosis`: the outcome (``ok``, a :class:`~runners.telemetry.FailureKind` value, or ``unknown`` when
the log shows neither readiness nor a death), the phase, a one-line reason, the memory figures and which
limit bound. The verdict comes from the engines' own parsers and classifiers
(:meth:`~runners.engines.base.Engine.parser`, :meth:`~runners.engines.base.Engine.classify`), used only through
their public surface: lines are fed one by one, then ``phase``, ``ready_line``, ``fatal`` and ``telemetry`` are
read. Everything that makes a pasted log unlike a file servetune wrote itself is this module's job:

* colour codes (also with the escape character lost: ``[0;32m``, or kept as HTML ``<font>`` tags), carriage-return
  progress bars, the indentation a whole paste shares;
* outer prefixes added by the tool that showed the log (``docker compose``'s ``name-1  | ``, Docker Desktop's own
  time, CI timestamps ``[2025-03-10T15:07:20Z]``, ``kubectl --timestamps``, journald in any locale, FastChat's
  ``| ERROR | stderr |``, a markdown quote ``> ``), and vLLM worker prefixes with a rank
  (``(VllmWorker rank=1 pid=7)``, ``(VllmWorker TP1 pid=7)``), rewritten into the form the parser reads;
* hard-wrapped lines (a paste re-flowed at a fixed width): joined back;
* several start-ups in one file: split into attempts; the last one is diagnosed and the result says so;
* a head cut off mid-run (no start-up lines, but serving lines): read as a server that was already serving.

Nothing here imports the search layer; the CLI (``search/cli.py``) only parses options and renders.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runners.engines import get_engine
from runners.engines.base import Engine, LogParser, MemoryFamily
from runners.engines.common import parse_version
from runners.engines.sglang import knob_flag as sglang_knob_flag
from runners.engines.vllm import knob_flag as vllm_knob_flag
from runners.errors import ConfigError
from runners.telemetry import Failure, FailureKind, Phase, allocation_text

__all__ = [
    "DIAGNOSIS_KEYS",
    "ENGINES",
    "MEMORY_KEYS",
    "OUTCOME_OK",
    "OUTCOME_UNKNOWN",
    "Diagnosis",
    "diagnose",
    "diagnose_file",
    "normalise",
    "render_text",
    "split_attempts",
]

ENGINES = ("sglang", "vllm")
DEFAULT_ENGINE = "sglang"
OUTCOME_OK = "ok"
OUTCOME_UNKNOWN = "unknown"
"""The log shows neither readiness nor a death (cut short, still starting, or stopped from outside)."""

DIAGNOSIS_KEYS = (
    "engine", "engine_source", "version", "version_source", "simulated", "attempts", "attempt_first_line",
    "outcome", "phase", "reason", "ready", "bound", "bound_detail", "memory", "notes", "telemetry",
)
"""The keys of :meth:`Diagnosis.to_dict` (and of ``servetune diagnose --json``), always all present, in order."""

MEMORY_KEYS = (
    "gpu_total_gib", "mem_fraction_static", "gpu_memory_utilization", "weights_gib", "kv_tokens", "kv_gib",
    "graph_gib", "cuda_graph_max_bs", "free_after_capture_gib", "max_total_num_tokens", "max_running_requests",
    "context_len", "tried_to_allocate_gib", "free_at_oom_gib", "kv_requested_gib", "kv_available_gib",
)
"""The keys of ``memory`` in :meth:`Diagnosis.to_dict`: always all present, None when the log does not say.
GiB unless the name says otherwise (``kv_tokens`` and the token/request counts are counts)."""


@dataclass(frozen=True)
class Diagnosis:
    """The verdict on one log file. ``outcome`` is ``ok``, ``unknown`` or a FailureKind value."""

    engine: str
    engine_source: str
    """``log`` (read from the text), ``option`` (``--engine``) or ``default``."""
    version: str | None
    version_source: str
    """``log``, ``option`` or ``default`` (then ``version`` is None: the parser reads every release's wording)."""
    simulated: bool
    attempts: int
    attempt_first_line: int
    """1-based line (of the file) where the diagnosed attempt starts."""
    outcome: str
    phase: str | None
    reason: str
    ready: bool
    bound: str | None
    bound_detail: str
    memory: dict[str, Any]
    notes: tuple[str, ...] = ()
    telemetry: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict with exactly :data:`DIAGNOSIS_KEYS` (``memory`` with :data:`MEMORY_KEYS`)."""
        data = {
            "engine": self.engine, "engine_source": self.engine_source,
            "version": self.version, "version_source": self.version_source,
            "simulated": self.simulated, "attempts": self.attempts,
            "attempt_first_line": self.attempt_first_line,
            "outcome": self.outcome, "phase": self.phase, "reason": self.reason, "ready": self.ready,
            "bound": self.bound, "bound_detail": self.bound_detail,
            "memory": {key: self.memory.get(key) for key in MEMORY_KEYS},
            "notes": list(self.notes), "telemetry": dict(self.telemetry),
        }
        assert tuple(data) == DIAGNOSIS_KEYS
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False, default=str)


# ---- normalisation ------------------------------------------------------------------------------------

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_ANSI = re.compile(r"(?:\x1b|\^\[|\\x1b|\\033|\\e)\[[0-9;?]*[A-Za-z]|\[(?:\d{1,3};)*(?:0|1|[349]\d)m")
"""Colour codes, also when a copy lost the escape character (``[0;32m``: only SGR colour/reset codes then)."""
_HTML_TAGS = re.compile(r"</?(?:font|b|span|strong|code|pre)\b[^>]*>", re.IGNORECASE)
"""Colour kept as HTML by a terminal-to-HTML copy (``<font color="#2AA1B3"><b>(APIServer pid=1)</b></font>``)."""
_OUTER_PREFIXES = (
    # a markdown quote ("> line"), as a log pasted into a reply is often quoted
    re.compile(r"^> ?"),
    # FastChat's worker log around an engine's stderr: "2024-04-27 10:13:05 | ERROR | stderr | "
    re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)? \| \w+ \| [\w.-]+ \| ?"),
    # CI (Buildkite) timestamps, sometimes followed by a table gutter: "[2025-03-10T15:07:20Z]   | "
    re.compile(r"^\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z?\]\s*(?:\|\s?)?"),
    # kubectl logs --timestamps: "2026-01-05T06:12:41.123456789Z "
    re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d) "),
    # journald: "Dec 01 02:03:04 host python3[123]: ", also with a localised month ("авг 18 14:15:04 ...")
    re.compile(r"^[^\W\d_]{3,4}\.? [ \d]\d \d\d:\d\d:\d\d \S+ [\w.@-]+(?:\[\d+\])?: "),
    # Docker Desktop's own time before the container's line: "2025-02-04 21:21:33 [2025-02-04 05:21:33] ..."
    re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?(?: |$)(?=\[\d{4}-|\S*$|$)"),
    # docker compose: "vllm-1  | ", "sglang_1 | "
    re.compile(r"^[\w.-]+[-_]\d+\s+\| ?"),
    # a table gutter left by a copy from a CI page: "  | "
    re.compile(r"^\s{0,3}\| "),
)
_VLLM_RANKED_PROC = re.compile(r"^\(([\w:.-]+) (?:rank=|TP)(\d+) (pid=\d+)\)")
_VLLM_RAY_PROC = re.compile(r"^\(([\w:.-]+) (pid=\d+), ip=[\w.:-]+\)")
_VLLM_CUT_PROC = re.compile(r"^([A-Z][\w:.-]+ pid=\d+(?:, ip=[\w.:-]+)?\))")
"""A head cut one character into the first line: ``RayWorkerWrapper pid=7) INFO ...``."""
_SGLANG_TIME_ONLY = re.compile(r"^\[(\d\d:\d\d:\d\d(?:[.,]\d+)?(?: [A-Z][A-Z_]*\d+)*)\]")
"""Old SGLang releases (and some pastes) print ``[23:17:01 TP7]`` without the date."""


def _strip_outer(line: str) -> str:
    """``line`` without the prefixes a viewer added (docker compose, CI, journald, kubectl)."""
    for pattern in _OUTER_PREFIXES:
        match = pattern.match(line)
        if match:
            line = line[match.end():]
    return line


def _engine_prefix(line: str) -> str:
    """Engine prefixes the parsers do not read, rewritten into ones they do (the rank kept, so figures are
    still taken from one rank when ranks interleave)."""
    line = _VLLM_CUT_PROC.sub(r"(\1", line)
    line = _VLLM_RANKED_PROC.sub(r"(\1_TP\2 \3)", line)
    line = _VLLM_RAY_PROC.sub(r"(\1 \2)", line)
    return _SGLANG_TIME_ONLY.sub(r"[0000-01-01 \1]", line)


_RECORD_START = re.compile(
    r"^(?:\[\d{4}-\d\d-\d\d[ T]"           # SGLang "[time TPn]" logger prefix
    r"|\([\w:.-]+(?: pid=\d+)?\)"          # vLLM "(EngineCore pid=1)"
    r"|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)[ :]"
    r"|\s"                                 # traceback bodies, indented continuation
    r"|Traceback |During handling|The above exception"
    r"|[\w.]*(?:Error|Exception|Warning|Interrupt|Exit)\b"
    r"|\S+:\d+:\d+ \[\d+\] NCCL "           # NCCL "host:pid:tid [rank] NCCL WARN"
    r"|usage: |Possible solutions:|\d+\. |Capturing |Loading |\$ |#|\+|Killed\b|EXIT="
    r")"
)
_WRAP_MAX = 240
_WRAP_SLACK = 25


def _unwrap(lines: list[str]) -> tuple[list[str], list[int], int | None]:
    """Join hard-wrapped lines back. Returns (lines, first original line number of each, wrap width or None).

    A paste re-flowed at width W has no line longer than W and many lines close to W; a line that follows such
    a long line and does not look like the start of a record continues it. A line of exactly W characters was
    cut mid-word (a terminal wrap), so it is joined without a space; a shorter one was wrapped at a space.
    """
    numbers = list(range(1, len(lines) + 1))
    if not lines:
        return lines, numbers, None
    width = max(len(line) for line in lines)
    long_lines = sum(1 for line in lines if len(line) >= width - _WRAP_SLACK)
    if width > _WRAP_MAX or width < 60 or long_lines < 3:
        return lines, numbers, None
    out: list[str] = []
    out_numbers: list[int] = []
    previous_len = 0
    for number, line in zip(numbers, lines, strict=True):
        if out and previous_len >= width - _WRAP_SLACK and line and not _RECORD_START.match(line):
            joiner = "" if previous_len == width else " "
            out[-1] = out[-1] + joiner + line
        else:
            out.append(line)
            out_numbers.append(number)
        previous_len = len(line)
    joined = len(lines) - len(out)
    return out, out_numbers, width if joined else None


def _dedent(lines: list[str]) -> list[str]:
    """``lines`` without the indentation every non-empty line shares (a paste indented as a list item)."""
    widths = [len(line) - len(line.lstrip(" ")) for line in lines if line.strip()]
    common = min(widths, default=0)
    return [line[common:] for line in lines] if common else lines


def normalise(text: str) -> tuple[list[str], list[int], list[str]]:
    """The log's records as the engines' parsers expect them, with the original (1-based) line number of each,
    and notes on what was undone (wrapping, prefixes)."""
    raw = _dedent([_HTML_TAGS.sub("", _ANSI.sub("", line)).rstrip() for line in _LINE_BREAK.split(text)])
    outer = [_strip_outer(line) for line in raw]
    notes: list[str] = []
    if sum(1 for a, b in zip(raw, outer, strict=True) if a != b) > 2:
        notes.append("outer line prefixes (container/CI/journal timestamps) were removed")
    stripped = [_engine_prefix(line).rstrip() for line in outer]
    lines, numbers, width = _unwrap(stripped)
    if width is not None:
        notes.append(f"hard-wrapped at {width} columns: {len(stripped) - len(lines)} line(s) joined back")
    kept = [(line, number) for line, number in zip(lines, numbers, strict=True) if line.strip()]
    return [line for line, _ in kept], [number for _, number in kept], notes


# ---- engine and version --------------------------------------------------------------------------------

_ENGINE_MARKS: dict[str, re.Pattern[str]] = {
    "sglang": re.compile(
        r"server_args=|^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?(?: [A-Z][A-Z_]*\d+)*\]|\bsglang\b"
        r"|Load weight (?:begin|end)\.|fired up and ready to roll|Scheduler hit an exception"
        r"|KV Cache is allocated|servetune simulated host"
    ),
    "vllm": re.compile(
        r"^\([\w:.-]+ pid=\d+\)|^(?:DEBUG|INFO|WARNING|ERROR) \d\d-\d\d \d\d:\d\d:\d\d \[|\bvllm\b|\bvLLM\b"
        r"|EngineCore|KV cache size: [\d,]+ tokens|api_server\.py|--gpu-memory-utilization|--max-num-seqs"
        r"|^(?:DEBUG|INFO|WARNING|ERROR) \d\d-\d\d \d\d:\d\d:\d\d [\w.]+:\d+\]"
    ),
}
_VERSION_MARKS: dict[str, tuple[re.Pattern[str], ...]] = {
    "sglang": (
        re.compile(r"\bsglang(?:==|\s*:\s*|\s+version\s+|:v|-)v?(\d+\.\d+\.\d+(?:[.\w+]*)?)", re.IGNORECASE),
    ),
    "vllm": (
        re.compile(r"vLLM API server version (v?\d+\.\d+\.\d+\S*)"),
        re.compile(r"Initializing a V\d LLM engine \(v(\d+\.\d+\.\d+\S*)\)"),
        re.compile(r"[█▀▄]\s+version (\d+\.\d+\.\d+\S*)"),  # the 0.19+ banner
        re.compile(r"\bvllm(?:-cpu)?(?:==|\s*:\s*|\s+version\s+|-openai:v)v?(\d+\.\d+\.\d+\S*)", re.IGNORECASE),
    ),
}
_SIMULATED = "servetune simulated host: figures are simulated"
VLLM_CUDA_GRAPH_SIZES_SINCE = (0, 10, 2)
"""The first vLLM release read with a capture-size flag (``--cuda-graph-sizes``, ``config/scheduler.py@v0.10.2``,
engine-audit.md item 17); earlier releases are not assumed to have one."""


def _detect_engine(lines: Sequence[str]) -> str | None:
    scores = {name: sum(1 for line in lines if mark.search(line)) for name, mark in _ENGINE_MARKS.items()}
    best = max(scores, key=lambda name: scores[name])
    if scores[best] == 0 or list(scores.values()).count(scores[best]) > 1:
        return None
    return best


def _detect_version(engine: str, lines: Sequence[str]) -> str | None:
    for pattern in _VERSION_MARKS[engine]:
        for line in lines:
            match = pattern.search(line)
            if match:
                return match.group(1).lstrip("v").rstrip(".,;)")
    return None


# ---- attempts -------------------------------------------------------------------------------------------

_START_MARKS: dict[str, re.Pattern[str]] = {
    "sglang": re.compile(
        r"server_args=|servetune simulated host: figures|'python -m sglang\.launch_server' is still supported"
        r"|^(?:\$\s*)?(?:python3? -m sglang\.launch_server|sglang serve)\s"
    ),
    "vllm": re.compile(
        r"vLLM API server version|non-default args:|^(?:\$\s*)?(?:vllm serve|python3? -m vllm\.entrypoints\S*)\s"
    ),
}
_SERVING_MARKS: dict[str, re.Pattern[str]] = {
    "sglang": re.compile(r"\b(?:Prefill|Decode) batch\b|\"POST /(?:generate|v1/\S+) HTTP/1\.1\" 200"
                         r"|Decode out of memory happened\.|KV cache pool is full\. Retract requests\."),
    "vllm": re.compile(r"Avg prompt throughput:|\"POST /v1/\S+ HTTP/1\.1\" 200"),
}
_READY_TEXT = {"sglang": "The server is fired up and ready to roll!", "vllm": "Application startup complete."}


def _progressed(parser: LogParser) -> bool:
    return parser.phase is not Phase.STARTING or parser.fatal is not None or parser.ready_line


def split_attempts(engine: Engine, lines: Sequence[str]) -> list[tuple[int, int]]:
    """``(start, end)`` index ranges of the start-ups in ``lines``: a start-up marker (``server_args=``, the
    launch command, vLLM's version banner) begins a new attempt once the current one has got anywhere."""
    mark = _START_MARKS.get(engine.name, _START_MARKS[DEFAULT_ENGINE])
    ranges: list[tuple[int, int]] = []
    start = 0
    probe = engine.parser()
    for index, line in enumerate(lines):
        if index > start and mark.search(line) and _progressed(probe):
            ranges.append((start, index))
            start = index
            probe = engine.parser()
        probe.feed(line)
    ranges.append((start, len(lines)))
    return ranges


# ---- verdict ----------------------------------------------------------------------------------------------

_DEATH = re.compile(
    r"kill_process_tree called: .*include_parent=True|^Killed\b|EXIT=(\d+)|(?i:exit(?:ed with)? code):? (-?\d+)"
    r"|Rank \d+ scheduler (?:is dead|died)"
)


_STOPPED = re.compile(r"Finished server process \[|Application shutdown complete\.|exited with code 0\b")
_MFS_IN_REASON = re.compile(r"mem_fraction_static=([0-9]+(?:\.[0-9]+)?)")


def _exit_code(lines: Sequence[str]) -> int | None:
    for line in reversed(lines):
        match = _DEATH.search(line)
        if match:
            for group in match.groups():
                if group is not None:
                    return int(group)
            return None
    return None


def _gib(value: Any) -> str:
    return f"{value:.2f} GiB" if isinstance(value, int | float) else "?"


def _graph_knob(engine: Engine, version: str | None, seen: str | None = None) -> str:
    """The flag that caps CUDA-graph capture in this engine release: the release's spelling, else the one its
    server_args implies (``seen``), else every spelling with the releases that use it."""
    if engine.memory_family == "vllm":
        if version is None:
            return ("the capture sizes (--max-cudagraph-capture-size from vLLM 0.11.1, --cuda-graph-sizes in "
                    "0.10.2-0.11.0, --max-num-seqs before)")
        parsed = parse_version(version)
        if parsed < VLLM_CUDA_GRAPH_SIZES_SINCE:
            # No capture-size flag read in these releases (engine-audit: 0.10.2 is the first audited with one);
            # the captured batch sizes stop at --max-num-seqs.
            return "--max-num-seqs (the captured batch sizes stop there) or --enforce-eager"
        return vllm_knob_flag("cuda_graph_sizes", parsed)
    if version is None:
        return seen or "--cuda-graph-max-bs (--cuda-graph-max-bs-decode from SGLang 0.5.14)"
    return sglang_knob_flag("cuda_graph_max_bs", parse_version(version))


def _bound(engine: Engine, failure: Failure | None, memory: dict[str, Any],
           version: str | None = None, graph_flag: str | None = None) -> tuple[str | None, str]:
    """Which limit bound, as a short name and a sentence: what ran out and which knob moves it (spelled as the
    engine release spells it; what the log does not say is left out, never printed as "?")."""
    if failure is None or failure.kind is not FailureKind.OOM:
        return None, ""
    phase = failure.phase
    reason = failure.reason
    tried, free = memory.get("tried_to_allocate_gib"), memory.get("free_at_oom_gib")
    if isinstance(tried, int | float) and isinstance(free, int | float):
        asked = allocation_text(tried, free, verb="asked")
    elif tried is not None:
        asked = f"asked {_gib(tried)}"
    else:
        asked = "ran out"
    if "OOM killer" in reason or "DefaultCPUAllocator" in reason:
        return "host_memory", "the host's RAM (kernel OOM killer or a CPU allocation): lower the KV cache or free RAM"
    return _BOUNDS[engine.memory_family or "sglang"](phase, reason, memory, asked,
                                                     _graph_knob(engine, version, graph_flag))


def _bound_vllm(phase: Phase | None, reason: str, memory: dict[str, Any], asked: str,
                graph_knob: str) -> tuple[str, str]:
    if "max model len" in reason or "max_model_len" in reason:
        needed, available = memory.get("kv_requested_gib"), memory.get("kv_available_gib")
        figures = (f" needs {_gib(needed)} of KV cache, {_gib(available)} available"
                   if needed is not None and available is not None else " does not fit the KV cache")
        return "max_model_len", (f"one request of max_model_len{figures}: lower --max-model-len or raise "
                                 "--gpu-memory-utilization")
    if "requested but only" in reason:
        return "kv_cache_space", ("the KV cache asked for is larger than the memory available: lower "
                                  "VLLM_CPU_KVCACHE_SPACE / --kv-cache-memory-bytes")
    if "utilization" in reason or "cache blocks" in reason or "GPU blocks" in reason or "negative" in reason:
        return "gpu_memory_utilization", ("--gpu-memory-utilization leaves no room for the KV cache (or asks "
                                          "for more than is free): raise it, or free the GPU")
    if phase is Phase.LOAD_WEIGHTS:
        return "weights", "the weights do not fit: more GPUs (tensor parallel) or a smaller/quantised model"
    if phase is Phase.CUDA_GRAPH:
        return "graph_headroom", (f"CUDA-graph capture {asked} after the KV cache took its share: lower "
                                  f"--gpu-memory-utilization or {graph_knob}")
    return "activation_headroom", f"a forward pass {asked} outside the KV budget: lower --gpu-memory-utilization"


def _bound_sglang(phase: Phase | None, reason: str, memory: dict[str, Any], asked: str,
                  graph_knob: str) -> tuple[str, str]:
    if phase is Phase.KV_POOL:
        mfs, weights = memory.get("mem_fraction_static"), memory.get("weights_gib")
        budget = f"mem_fraction_static={mfs}" if mfs is not None else "the static budget (--mem-fraction-static)"
        behind = f" after {_gib(weights)} of weights" if weights is not None else " after the weights"
        return "mem_fraction_static", (f"{budget} leaves no room for a KV pool{behind}: raise "
                                       "--mem-fraction-static (or add GPUs)")
    if "Try to lower your batch size" in reason or "alloc_req_slots" in reason:
        tokens = memory.get("kv_tokens") or memory.get("max_total_num_tokens")
        pool = f"the KV pool ({tokens:,} tokens)" if tokens else "the KV pool"
        return "kv_pool", (f"{pool} is full for this batch: lower --max-running-requests / "
                           "--chunked-prefill-size, or raise --mem-fraction-static")
    if phase is Phase.LOAD_WEIGHTS:
        return "weights", "the weights do not fit: more GPUs (tensor parallel) or a smaller/quantised model"
    if phase is Phase.CUDA_GRAPH:
        return "graph_headroom", (f"CUDA-graph capture after the KV pool {asked}: lower --mem-fraction-static "
                                  f"or {graph_knob}")
    after = memory.get("free_after_capture_gib")
    where = f" ({_gib(after)} free after capture)" if after is not None else ""
    return "activation_headroom", (f"a {phase.value if phase else 'forward'} pass {asked}{where}: the memory "
                                   "outside the static pool is too small; lower --mem-fraction-static "
                                   f"(or --chunked-prefill-size / {graph_knob})")


_BOUNDS: dict[MemoryFamily, Callable[[Phase | None, str, dict[str, Any], str, str], tuple[str, str]]] = {
    "sglang": _bound_sglang,
    "vllm": _bound_vllm,
}
"""The explanation of an OOM per memory model (:attr:`~runners.engines.base.Engine.memory_family`)."""


def _memory(parser: LogParser) -> dict[str, Any]:
    tele = parser.telemetry.to_dict()
    memory = {key: tele.get(key) for key in MEMORY_KEYS}
    if memory["gpu_memory_utilization"] is None and isinstance(tele.get("memory_utilization"), int | float):
        memory["gpu_memory_utilization"] = tele["memory_utilization"]
    return memory


def diagnose(text: str, *, engine: str | None = None, version: str | None = None,
             exit_code: int | None = None) -> Diagnosis:
    """The verdict on a server log's text. ``engine``/``version`` are used where the log does not say
    (the log wins; a disagreement is noted); ``exit_code`` is how the server ended, when known.

    Raises ConfigError for an unknown engine name.
    """
    if engine is not None and engine not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r}; allowed: {', '.join(ENGINES)}")
    lines, numbers, notes = normalise(text)
    if not lines:
        raise ConfigError("the log is empty")
    name, engine_source = _which_engine(lines, engine, notes)
    eng = get_engine(name)
    the_version, version_source = _which_version(name, lines, version, notes)

    ranges = split_attempts(eng, lines)
    start, end = ranges[-1]
    attempt = lines[start:end]
    if len(ranges) > 1:
        notes.append(f"{len(ranges)} attempts in this file; verdict is for the last "
                     f"(from line {numbers[start]})")
    parser = _read(eng, name, attempt, notes)
    failure, outcome, phase, reason = _verdict(eng, parser, attempt, exit_code)
    memory = _memory(parser)
    if memory["mem_fraction_static"] is None and failure is not None:
        # SGLang's KV-pool error names the value ("Current value: mem_fraction_static=0.3").
        match = _MFS_IN_REASON.search(failure.reason)
        if match:
            memory["mem_fraction_static"] = float(match.group(1))
    graph_flag = parser.telemetry.extra.get("graph_flag")
    bound, detail = _bound(eng, failure, memory, the_version, graph_flag if isinstance(graph_flag, str) else None)
    simulated = any(_SIMULATED in line for line in attempt[:20]) or parser.telemetry.simulated
    return Diagnosis(
        engine=name, engine_source=engine_source, version=the_version, version_source=version_source,
        simulated=simulated, attempts=len(ranges), attempt_first_line=numbers[start],
        outcome=outcome, phase=phase.value if phase is not None else None, reason=reason,
        ready=parser.ready_line, bound=bound, bound_detail=detail, memory=memory, notes=tuple(notes),
        telemetry=parser.telemetry.to_dict(),
    )


def _which_engine(lines: list[str], engine: str | None, notes: list[str]) -> tuple[str, str]:
    """(engine name, where it came from: log, option or default)."""
    detected = _detect_engine(lines)
    if detected is not None:
        if engine is not None and engine != detected:
            notes.append(f"--engine {engine} given, but the log is {detected}'s: read as {detected}")
        return detected, "log"
    if engine is not None:
        return engine, "option"
    notes.append(f"the log does not say which engine wrote it: read as {DEFAULT_ENGINE} (use --engine)")
    return DEFAULT_ENGINE, "default"


def _which_version(name: str, lines: list[str], version: str | None, notes: list[str]) -> tuple[str | None, str]:
    """(engine version or None, where it came from: log, option or default)."""
    found_version = _detect_version(name, lines)
    if found_version is not None:
        if version is not None and version.lstrip("v") != found_version:
            notes.append(f"--version {version} given, but the log says {found_version}")
        return found_version, "log"
    if version is not None:
        return version.lstrip("v"), "option"
    return None, "default"


def _read(eng: Engine, name: str, attempt: list[str], notes: list[str]) -> LogParser:
    """The engine's parser after the attempt's lines (told "serving" first when the head was cut mid-run)."""
    parser = eng.parser()
    for line in attempt:
        parser.feed(line)
    head_cut = (parser.phase is Phase.STARTING and not parser.ready_line
                and not any(_START_MARKS[name].search(line) for line in attempt)
                and any(_SERVING_MARKS[name].search(line) for line in attempt))
    if head_cut:
        # The head was cut off mid-run: say "serving" to the parser before the lines it reads.
        parser = eng.parser()
        parser.feed(_READY_TEXT[name])
        for line in attempt:
            parser.feed(line)
        notes.append("the log starts mid-run (no start-up lines): read as a server that was already serving")
    return parser


def _verdict(eng: Engine, parser: LogParser, attempt: list[str],
             exit_code: int | None) -> tuple[Failure | None, str, Phase | None, str]:
    """(failure if the server died, outcome, phase, reason)."""
    tail = "\n".join(attempt[-400:])
    code = exit_code if exit_code is not None else _exit_code(attempt)
    # "exited with code 0" after a clean stop is no death; a death marker without a code still is one.
    died = (parser.fatal is not None or (code is not None and code != 0)
            or (code is None and any(_DEATH.search(line) for line in attempt[-50:])))
    failure: Failure | None = None
    if died:
        failure = eng.classify(parser, code, tail)
        outcome, phase, reason = failure.kind.value, failure.phase, failure.reason
    elif parser.ready_line:
        outcome, phase = OUTCOME_OK, parser.phase
        stopped = any(_STOPPED.search(line) for line in attempt[-20:])
        reason = (f"ready; stopped cleanly (last phase {phase.value})" if stopped
                  else f"ready; still {phase.value} when the log ends")
    else:
        outcome, phase = OUTCOME_UNKNOWN, parser.phase
        reason = (f"the log ends in {phase.value} with no error and no readiness line "
                  "(cut short, still starting, or stopped from outside)")
    return failure, outcome, phase, reason


def diagnose_file(path: Path, **options: Any) -> Diagnosis:
    """:func:`diagnose` on a file (any bytes; undecodable ones replaced). Raises ConfigError when unreadable."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    return diagnose(data.decode("utf-8", errors="replace"), **options)


# ---- rendering ----------------------------------------------------------------------------------------------

_MEMORY_LABELS = (
    ("gpu_total_gib", "GPU total"), ("weights_gib", "weights"), ("kv_gib", "KV pool"),
    ("graph_gib", "CUDA graphs"), ("free_after_capture_gib", "free after capture"),
    ("tried_to_allocate_gib", "OOM tried to allocate"), ("free_at_oom_gib", "free at OOM"),
    ("kv_requested_gib", "KV needed"), ("kv_available_gib", "KV available"),
)


def _memory_lines(memory: dict[str, Any]) -> Iterable[str]:
    for key, label in _MEMORY_LABELS:
        value = memory.get(key)
        if value is None:
            continue
        text = _gib(value)
        if key == "kv_gib" and memory.get("kv_tokens") is not None:
            text += f" ({memory['kv_tokens']:,} tokens)"
        yield f"{label}: {text}"
    for key, label in (("mem_fraction_static", "mem_fraction_static"),
                       ("gpu_memory_utilization", "gpu_memory_utilization"),
                       ("cuda_graph_max_bs", "cuda_graph_max_bs"),
                       ("max_running_requests", "max_running_requests"), ("context_len", "context_len")):
        if memory.get(key) is not None:
            yield f"{label}: {memory[key]}"


def render_text(diagnosis: Diagnosis, source: str = "") -> str:
    """The human-readable verdict: one ``label  value`` line each, memory figures seen, then notes."""
    d = diagnosis
    engine = (f"{d.engine} {d.version}" if d.version
              else f"{d.engine}, version not in the log (every release's wording is read)")
    if d.engine_source != "log":
        engine += " [engine from --engine]" if d.engine_source == "option" else " [engine not in the log: default]"
    if d.version_source == "option":
        engine += " [version from --version]"
    if d.simulated:
        engine += " (servetune's simulated host)"
    rows = [("log", source)] if source else []
    rows += [("engine", engine), ("outcome", d.outcome), ("phase", d.phase or "-"), ("reason", d.reason)]
    if d.bound:
        rows.append(("bound", f"{d.bound}: {d.bound_detail}"))
    memory = list(_memory_lines(d.memory))
    rows.append(("memory", memory[0] if memory else "no figures in the log"))
    rows += [("", line) for line in memory[1:]]
    rows += [("note", note) for note in d.notes]
    return "\n".join(f"{label:<8} {value}".rstrip() for label, value in rows) + "\n"
