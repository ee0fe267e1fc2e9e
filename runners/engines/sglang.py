"""SGLang 0.5.x: launch command per version, log parser, and death classifier.

Every string matched here is quoted in ``shared/reference/sglang-facts.md`` (§1 flags, §2 start-up lines, §3
fatal and OOM texts, §9 decision list); the parser accepts the wording of every release from 0.5.2 to 0.5.23,
with or without the ``[time TPn]`` logger prefix, and tqdm progress fragments separated by ``\\r``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

from runners.engines.base import LaunchLike, LogParser
from runners.engines.common import (
    ANSI,
    ARGPARSE_ERROR,
    PRIORITY,
    SERVING,
    SIZE,
    TORCH_OOM,
    command,
    death_reason,
    last_error,
    number_arg,
    one_line,
    oom_kills,
    rank,
    signal_of,
)
from runners.errors import ConfigError
from runners.telemetry import Failure, FailureKind, Phase, Telemetry, parse_size_gib

__all__ = ["KNOB_FLAGS", "SGLangEngine", "SGLangLogParser", "parse_version"]

# ---- versions and flags ---------------------------------------------------------------------------

_VERSION_RE = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?")

#: First release whose CUDA-graph batch-size flag is ``--cuda-graph-max-bs-decode`` (sglang-facts §1.2).
DECODE_GRAPH_FLAG_SINCE = (0, 5, 15)

KNOB_FLAGS: dict[str, str] = {
    "mem_fraction_static": "--mem-fraction-static",
    "cuda_graph_max_bs": "--cuda-graph-max-bs",
    "num_continuous_decode_steps": "--num-continuous-decode-steps",
    "max_running_requests": "--max-running-requests",
    "chunked_prefill_size": "--chunked-prefill-size",
}
"""servetune knob -> SGLang flag (``cuda_graph_max_bs`` is respelled per version: :func:`knob_flag`)."""

_FLOAT_KNOBS = frozenset({"mem_fraction_static"})


def parse_version(text: str) -> tuple[int, int, int]:
    """``"0.5.10.post1"`` -> ``(0, 5, 10)``; ``"0.5.3rc0"`` -> ``(0, 5, 3)``. Raises ConfigError."""
    match = _VERSION_RE.match(text or "")
    if match is None:
        raise ConfigError(f"cannot read an engine version from {text!r} (expected e.g. 0.5.10)")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def knob_flag(knob: str, version: tuple[int, int, int]) -> str:
    """The SGLang flag for a servetune knob in that version. Raises ConfigError for unknown knobs."""
    if knob not in KNOB_FLAGS:
        raise ConfigError(f"unknown SGLang knob {knob!r}; allowed: {', '.join(sorted(KNOB_FLAGS))}")
    if knob == "cuda_graph_max_bs" and version >= DECODE_GRAPH_FLAG_SINCE:
        return "--cuda-graph-max-bs-decode"
    return KNOB_FLAGS[knob]


# ---- log patterns ---------------------------------------------------------------------------------

_LINE_BREAK = re.compile(r"\r\n?|\n")
_PREFIX = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?((?: [A-Z][A-Z_]*\d+)*)\] ?")
_NUM = r"([0-9]+(?:\.[0-9]+)?)"

_MFS = re.compile(r"\bmem_fraction_static'?\s*[=:]\s*" + _NUM)
_CG_DECODE = re.compile(r"\bcuda_graph_max_bs_decode'?\s*[=:]\s*(\d+)")
_CG_PLAIN = re.compile(r"\bcuda_graph_max_bs'?\s*[=:]\s*(\d+)")
_SA_CHUNKED = re.compile(r"\bchunked_prefill_size'?\s*[=:]\s*(-?\d+)")
_SA_MAXRUN = re.compile(r"\bmax_running_requests'?\s*[=:]\s*(\d+)")

_LOAD_BEGIN = re.compile(r"Load weight begin\..*?avail mem=" + _NUM + " GB")
_LOAD_END = re.compile(r"Load weight end\..*?avail mem=" + _NUM + r" GB, mem usage=" + _NUM + " GB")
_KV = re.compile(
    r"(?:^|\s|: )(?:(\S+) )?KV Cache (is allocated|VA upper bound)\.(?: dtype: [^,]+,)? #tokens: (\d+), "
    r"(?:K size: " + _NUM + r" GB, V size: " + _NUM + r" GB|KV size: " + _NUM + " GB)"
)
_KV_POST = re.compile(
    r"Post-capture KV sizing: KV cache allocated\..*?#tokens: (\d+), KV size: " + _NUM
    + r" GB(?:, avail mem=" + _NUM + " GB)?"
)
_POOL_END = re.compile(r"Memory pool end\. avail mem=" + _NUM + " GB")
_CAPTURE = re.compile(
    r"Capture .*?graph (begin|end)\b.*?(?:mem usage=" + _NUM + r" GB[,.] )?avail mem=" + _NUM + " GB",
    re.IGNORECASE,
)
_CAPTURE_BAR = re.compile(
    r"Capturing (batches|prefill shape|num tokens) \((?:bs|num_tokens)=(\d+) avail_mem=" + _NUM + " GB\\)"
)
_POOL_SUMMARY = re.compile(r"\bmax_total_num_tokens=(\d+)")
_SUMMARY_FIELDS = re.compile(
    r"\b(chunked_prefill_size|max_prefill_tokens|max_running_requests|context_len|available_gpu_mem)="
    r"(-?[0-9]+(?:\.[0-9]+)?)"
)
_READY = "The server is fired up and ready to roll!"
_UVICORN = re.compile(
    r"Started server process \[|Waiting for application startup\.|Application startup complete\."
    r"|Uvicorn running on"
)
_PREFILL_BATCH = re.compile(r"\bPrefill batch\b")
_DECODE_BATCH = re.compile(r"\bDecode batch\b")
_FRAME = re.compile(r'^\s*File ".*", line \d+, in (forward_extend|forward_decode)\b')

# torch caching-allocator text (sglang-facts §3.1), current and old wording.
_TORCH_OOM_OLD = re.compile(
    r"CUDA out of memory\. Tried to allocate " + SIZE + r" \(GPU \d+; " + SIZE
    + r" total capacity; " + SIZE + r" already allocated; " + SIZE + " free"
)

# (pattern, explicit phase or None) -- any of these means the GPU ran out of memory.
_OOM_TEXTS: tuple[tuple[re.Pattern[str], Phase | None], ...] = (
    (re.compile(r"Not enough memory\. Please try to increase --mem-fraction-static"), Phase.KV_POOL),
    (re.compile(r"Loaded weights leave no GPU memory for the KV cache"), Phase.KV_POOL),
    (re.compile(r"Memory pool size is too small|max_running_request is zero"), Phase.KV_POOL),
    (re.compile(r"Prefill out of memory\. Try to lower your batch size"), Phase.PREFILL),
    (re.compile(r"Decode out of memory\. Try to lower your batch size"), Phase.DECODE),
    (re.compile(r"alloc_req_slots runs out of memory"), Phase.PREFILL),
    (re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|Cuda failure 'out of memory'"
                r"|CUBLAS_STATUS_ALLOC_FAILED"), None),
)

_NCCL = re.compile(
    r"NCCL error|ncclInvalidArgument|ncclInvalidUsage|ncclUnhandledCudaError|ncclSystemError"
    r"|ncclInternalError|ncclRemoteError|DistBackendError|unhandled cuda error"
)
_USAGE = re.compile(r"^usage: \S")

# (pattern, phase the server must be in when it appears, or None for "where it is").
_FATAL_TEXTS: tuple[tuple[re.Pattern[str], Phase | None], ...] = (
    (re.compile(r"Capture (?:cuda|draft cuda|prefill CUDA) graph failed:"
                r"|Piecewise CUDA Graph failed with error"), Phase.CUDA_GRAPH),
    (re.compile(r"Initialization failed\. warmup error"), Phase.WARMUP),
    (re.compile(r"Not enough memory\. Please try to increase --mem-fraction-static"), Phase.KV_POOL),
    (re.compile(r"Scheduler hit an exception:|Received sigquit from a child process|SIGQUIT received\."
                r"|Initialization failed\.|scheduler (?:is dead|died during initialization)|watchdog timeout"
                r"|Subprocess \S+ \(pid=\d+\) crashed"), None),
)





class SGLangLogParser:
    """Reads an SGLang 0.5.2-0.5.23 server log line by line (implements :class:`LogParser`).

    Start-up phases only move forward (ranks print the same lines at different times); after the readiness
    line, ``Prefill batch``/``Decode batch`` lines switch between PREFILL and DECODE. Per-rank memory figures
    are taken from the first rank that prints one (TP ranks repeat them). ``fatal`` is set by the first
    fatal line; a later, more specific one (OOM over NCCL/argparse over a generic crash) replaces it.
    """

    def __init__(self) -> None:
        self.telemetry = Telemetry()
        self.phase = Phase.STARTING
        self.ready_line = False
        self.fatal: Failure | None = None
        self._fatal_priority = 0
        self._fatal_phase_explicit = False
        self._rank_key: str | None = None
        self._last_batch: Phase | None = None
        self._frame_kind: Phase | None = None
        self._kv: dict[str, tuple[int, float]] = {}
        self._kv_post = False
        self._graph_gib: dict[str, float] = {}

    # ---- public ----

    def feed(self, line: str) -> None:
        for fragment in _LINE_BREAK.split(line):
            fragment = ANSI.sub("", fragment)
            if fragment.strip():
                self._feed_one(fragment)

    # ---- internals ----

    def _advance(self, phase: Phase) -> None:
        if (self.phase in SERVING and phase in SERVING) or rank(phase) > rank(self.phase):
            self.phase = phase

    def _own_rank(self, key: str) -> bool:
        """True for figures from the rank whose figures we keep (the first prefixed rank seen)."""
        if not key:
            return True
        if self._rank_key is None:
            self._rank_key = key
        return key == self._rank_key

    def _feed_one(self, raw: str) -> None:
        prefix = _PREFIX.match(raw)
        key = prefix.group(1).strip() if prefix else ""
        text = raw[prefix.end():] if prefix else raw
        tele = self.telemetry

        if "server_args=" in text:
            self._server_args(text)
            return
        if _READY in text:
            self.ready_line = True
            self._advance(Phase.READY)
            return

        m = _LOAD_BEGIN.search(text)
        if m:
            self._advance(Phase.LOAD_WEIGHTS)
            if self._own_rank(key):
                tele.avail_before_weights_gib = float(m.group(1))
            return
        m = _LOAD_END.search(text)
        if m:
            self._advance(Phase.KV_POOL)
            if self._own_rank(key):
                tele.avail_after_weights_gib = float(m.group(1))
                tele.weights_gib = float(m.group(2))
            return
        if text.startswith("Load weight end."):
            self._advance(Phase.KV_POOL)
            return
        m = _KV_POST.search(text)
        if m:
            if self._own_rank(key):
                self._kv_post = True
                tele.kv_tokens, tele.kv_gib = int(m.group(1)), float(m.group(2))
                if m.group(3):
                    tele.avail_after_kv_gib = float(m.group(3))
            return
        m = _KV.search(text)
        if m:
            self._advance(Phase.KV_POOL)
            if self._own_rank(key) and not self._kv_post:
                label = m.group(1) or ""
                size = float(m.group(4)) + float(m.group(5)) if m.group(4) else float(m.group(6))
                self._kv[label] = (int(m.group(3)), size)
                tele.kv_tokens = self._kv[""][0] if "" in self._kv else next(iter(self._kv.values()))[0]
                tele.kv_gib = round(sum(size for _, size in self._kv.values()), 4)
            return
        m = _POOL_END.search(text)
        if m:
            self._advance(Phase.KV_POOL)
            if self._own_rank(key):
                tele.avail_after_kv_gib = float(m.group(1))
            return
        m = _CAPTURE.search(text)
        if m and "failed" not in text:
            self._advance(Phase.CUDA_GRAPH)
            if m.group(1).lower() == "end" and self._own_rank(key):
                what = text[: m.start(1)]
                if m.group(2):
                    self._graph_gib[what] = float(m.group(2))
                    tele.graph_gib = round(sum(self._graph_gib.values()), 4)
                tele.free_after_capture_gib = float(m.group(3))
            return
        m = _CAPTURE_BAR.search(text)
        if m:
            self._advance(Phase.CUDA_GRAPH)
            what = "capture_last_bs" if m.group(1) == "batches" else "capture_last_tokens"
            tele.extra[what] = int(m.group(2))
            tele.extra["capture_last_avail_gib"] = float(m.group(3))
            return
        m = _POOL_SUMMARY.search(text)
        if m and "available_" in text:
            self._advance(Phase.WARMUP)
            tele.max_total_num_tokens = int(m.group(1))
            for name, value in _SUMMARY_FIELDS.findall(text):
                if name == "available_gpu_mem":
                    tele.extra["available_gpu_mem_gib"] = float(value)
                elif name == "max_prefill_tokens":
                    tele.extra["max_prefill_tokens"] = int(value)
                else:
                    setattr(tele, name, int(value))
            return
        if _UVICORN.search(text):
            self._advance(Phase.WARMUP)
            return
        if _PREFILL_BATCH.search(text):
            self._last_batch = Phase.PREFILL
            if self.phase in SERVING:
                self.phase = Phase.PREFILL
            return
        if _DECODE_BATCH.search(text):
            self._last_batch = Phase.DECODE
            if self.phase in SERVING:
                self.phase = Phase.DECODE
            return
        if "Traceback (most recent call last)" in text:
            self._frame_kind = None
        m = _FRAME.match(text)
        if m:
            self._frame_kind = Phase.PREFILL if m.group(1) == "forward_extend" else Phase.DECODE
            return
        self._fatal_evidence(text)

    def _server_args(self, text: str) -> None:
        tele = self.telemetry
        m = _MFS.search(text)
        if m:
            tele.mem_fraction_static = float(m.group(1))
        m = _CG_DECODE.search(text) or _CG_PLAIN.search(text)
        if m:
            tele.cuda_graph_max_bs = int(m.group(1))
        m = _SA_CHUNKED.search(text)
        if m:
            tele.chunked_prefill_size = int(m.group(1))
        m = _SA_MAXRUN.search(text)
        if m:
            tele.max_running_requests = int(m.group(1))

    def _oom_phase(self, explicit: Phase | None) -> Phase:
        if self.phase in SERVING:
            if explicit in (Phase.PREFILL, Phase.DECODE):
                return explicit
            return self._frame_kind or self._last_batch or self.phase
        if explicit is not None and explicit not in (Phase.PREFILL, Phase.DECODE):
            return explicit
        return self.phase

    def _fatal_evidence(self, text: str) -> None:
        # Hints that pin the phase (capture failed, warm-up error, KV pool) refine an OOM already recorded.
        hint: Phase | None = None
        generic = False
        for pattern, phase in _FATAL_TEXTS:
            if pattern.search(text):
                hint, generic = phase, True
                break
        oom_phase: Phase | None = None
        is_oom = False
        for pattern, phase in _OOM_TEXTS:
            if pattern.search(text):
                is_oom, oom_phase = True, phase
                break
        if is_oom:
            explicit = oom_phase or hint
            if self._refine(explicit):
                return
            phase = self._oom_phase(explicit)
            self._oom_figures(text)
            self._set_fatal(FailureKind.OOM, phase, self._oom_reason(text, phase),
                            explicit=explicit is not None)
            return
        where = hint if hint is not None and self.phase not in SERVING else self.phase
        if _NCCL.search(text):
            self._set_fatal(FailureKind.NCCL_ERROR, where,
                            f"NCCL failure in {where.value}: {one_line(text)}")
            return
        if generic:
            if self._refine(hint):
                return
            self._set_fatal(FailureKind.CRASH, where, f"server crashed in {where.value}: {one_line(text)}",
                            explicit=hint is not None)
            return
        m = ARGPARSE_ERROR.search(text)
        if m:
            self._set_fatal(FailureKind.BAD_FLAG, Phase.STARTING,
                            f"SGLang rejected a flag: {one_line(m.group(1))}")
            return
        if _USAGE.match(text):
            # The usage line comes before the argparse error: weak evidence the error line replaces.
            self._set_fatal(FailureKind.BAD_FLAG, Phase.STARTING,
                            f"SGLang printed its usage: {one_line(text)}", priority=1)

    def _refine(self, hint: Phase | None) -> bool:
        """Pin the phase of an OOM already recorded when a later line names it (e.g. capture failed)."""
        fatal = self.fatal
        if (hint is None or fatal is None or fatal.kind is not FailureKind.OOM or self._fatal_phase_explicit
                or self.phase in SERVING or hint in (Phase.PREFILL, Phase.DECODE)):
            return False
        if hint != fatal.phase:
            self.fatal = replace(fatal, phase=hint, reason=fatal.reason.replace(
                f" in {fatal.phase.value if fatal.phase else ''}:", f" in {hint.value}:", 1))
            self.telemetry.oom_phase = hint.value
        self._fatal_phase_explicit = True
        return True

    def _set_fatal(self, kind: FailureKind, phase: Phase, reason: str, *, explicit: bool = False,
                   priority: int | None = None) -> None:
        prio = PRIORITY[kind] if priority is None else priority
        if self.fatal is not None and prio <= self._fatal_priority:
            return
        self.fatal = Failure(kind, phase, reason)
        self._fatal_priority = prio
        self._fatal_phase_explicit = explicit
        if kind is FailureKind.OOM:
            self.telemetry.oom_phase = phase.value

    def _oom_figures(self, text: str) -> None:
        tele = self.telemetry
        m = TORCH_OOM.search(text)
        if m:
            tried, total, free = m.groups()
        else:
            old = _TORCH_OOM_OLD.search(text)
            if old is None:
                return
            tried, total, _, free = old.groups()
        if tele.tried_to_allocate_gib is None:
            tele.tried_to_allocate_gib = round(parse_size_gib(tried), 4)
            tele.free_at_oom_gib = round(parse_size_gib(free), 4)
        if tele.gpu_total_gib is None:
            tele.gpu_total_gib = round(parse_size_gib(total), 4)

    def _oom_reason(self, text: str, phase: Phase) -> str:
        tele = self.telemetry
        if tele.tried_to_allocate_gib is not None and tele.free_at_oom_gib is not None:
            return (f"CUDA out of memory in {phase.value}: tried to allocate "
                    f"{tele.tried_to_allocate_gib:.2f} GiB with {tele.free_at_oom_gib:.2f} GiB free")
        return f"out of memory in {phase.value}: {one_line(text)}"


class SimulatedLogParser(SGLangLogParser):
    """The simulated host prints SGLang's lines; its telemetry is marked simulated."""

    def __init__(self) -> None:
        super().__init__()
        self.telemetry.simulated = True


# ---- engine -------------------------------------------------------------------------------------------


class SGLangEngine:
    """The SGLang engine (:class:`~runners.engines.base.Engine`): ``python -m sglang.launch_server``."""

    name: str = "sglang"
    bench_api: str = "sglang"
    health_path: str = "/health"
    needs_ready_line: bool = True
    scratch_vars: tuple[str, ...] = ("TMPDIR",)
    """Per-trial scratch only; shared compile caches (Triton, FlashInfer, torch.compile) stay shared."""
    module: ClassVar[str] = "sglang.launch_server"

    def version_command(self, python: str) -> str:
        return f'{shlex.quote(python)} -c "import sglang; print(sglang.__version__)"'

    def _leading_args(self, launch: LaunchLike, version: str) -> list[str]:
        """Arguments between the module and the standard flags (none for SGLang)."""
        return []

    def argv(self, launch: LaunchLike, version: str) -> list[str]:
        parsed = parse_version(version)
        flags: list[str] = []
        for knob, value in launch.knobs.items():
            flag = knob_flag(knob, parsed)
            if value is None:
                continue
            flags += [flag, number_arg(knob, value, is_float=knob in _FLOAT_KNOBS)]
        return command(launch, self.module, "--model-path", flags, self._leading_args(launch, version))

    def environment(self, launch: LaunchLike, version: str) -> dict[str, str]:
        return dict(launch.env)

    def parser(self) -> SGLangLogParser:
        return SGLangLogParser()

    def classify(self, parser: LogParser, exit_code: int | None, log_tail: str,
                 evidence: Mapping[str, Any] | None = None) -> Failure:
        """Why the server died: parser evidence, then the log tail re-read, then the exit code.

        Figures found only in ``log_tail`` (OOM sizes, ``oom_phase``) are copied into ``parser.telemetry``
        where it has none. ``evidence`` may carry ``oom_kill`` (host OOM killer count or flag).
        """
        fatal = parser.fatal
        if log_tail:
            rescan = self.parser()
            rescan.phase = parser.phase
            rescan._last_batch = getattr(parser, "_last_batch", None)
            for line in log_tail.splitlines():
                rescan.feed(line)
            found = rescan.fatal
            if found is not None and (fatal is None or PRIORITY[found.kind] > PRIORITY.get(fatal.kind, 0)):
                fatal = found
                for key in ("tried_to_allocate_gib", "free_at_oom_gib", "gpu_total_gib", "oom_phase"):
                    if getattr(parser.telemetry, key) is None:
                        setattr(parser.telemetry, key, getattr(rescan.telemetry, key))
        phase = parser.phase
        signal = signal_of(exit_code) if exit_code is not None else None
        host_oom = signal == 9 and oom_kills(evidence) > 0
        error = last_error(log_tail, lambda line: _PREFIX.sub("", line))
        if fatal is not None and not (host_oom and fatal.kind is FailureKind.CRASH):
            if fatal.kind is FailureKind.CRASH and error and fatal.phase is not None:
                # "Scheduler hit an exception: Traceback ..." says little; the exception line says why.
                fatal = replace(fatal, reason=f"server crashed in {fatal.phase.value}: {error}")
            return replace(fatal, exit_code=exit_code)
        if host_oom:
            if parser.telemetry.oom_phase is None:
                parser.telemetry.oom_phase = phase.value
            return Failure(FailureKind.OOM, phase,
                           f"killed by the host OOM killer (host RAM) in {phase.value}", exit_code)
        if signal == 9:
            return Failure(FailureKind.CRASH, phase,
                           f"killed by SIGKILL (exit {exit_code}) in {phase.value} with no error in the log; "
                           f"possibly the host OOM killer (check dmesg)", exit_code)
        return Failure(FailureKind.CRASH, phase, death_reason(exit_code, phase, error), exit_code)
