"""SGLang 0.5.x: launch command per version, log parser, and death classifier.

Every string matched here is quoted in ``docs/sources/sglang-facts.md`` (§1 flags, §2 start-up lines, §3
fatal and OOM texts, §9 decision list); the parser accepts the wording of every release from 0.5.2 to 0.5.23,
with or without the ``[time TPn]`` logger prefix, and tqdm progress fragments separated by ``\\r``.
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
    ARGPARSE_ERROR,
    DIST_INIT_TIMEOUT,
    NCCL_ERROR,
    PRIORITY,
    SERVING,
    Line,
    LogParserBase,
    Rules,
    Version,
    command,
    death_reason,
    dist_init_addr,
    last_error,
    nccl_warned,
    number_arg,
    one_line,
    oom_figures,
    oom_kills,
    parse_version,
    signal_of,
    torch_nccl_command,
    tp_from_args,
)
from runners.engines.flags import FlagTable, flag_args, flag_table
from runners.errors import ConfigError
from runners.telemetry import Failure, FailureKind, Phase

__all__ = ["KNOB_FLAGS", "SGLangEngine", "SGLangLogParser", "inert_knobs", "knob_flag"]

# ---- versions and flags ---------------------------------------------------------------------------

#: First release with ``--cuda-graph-max-bs-decode`` (engine-audit #6: ``srt/server_args.py:1939@v0.5.14``);
#: the old ``--cuda-graph-max-bs`` is a deprecated alias 0.5.14-0.5.19 and gone from 0.5.20.
DECODE_GRAPH_FLAG_SINCE: Version = (0, 5, 14)

KNOB_FLAGS: dict[str, str] = {
    "mem_fraction_static": "--mem-fraction-static",
    "cuda_graph_max_bs": "--cuda-graph-max-bs",
    "num_continuous_decode_steps": "--num-continuous-decode-steps",
    "max_running_requests": "--max-running-requests",
    "chunked_prefill_size": "--chunked-prefill-size",
}
"""servetune knob -> SGLang flag (``cuda_graph_max_bs`` is respelled per version: :func:`knob_flag`)."""

ENV_KNOBS: dict[str, str] = {}
"""Knobs that are environment variables rather than flags (none: NCCL variables travel as ``nccl.NAME``)."""

_FLOAT_KNOBS = frozenset({"mem_fraction_static"})

#: Releases read (engine-audit): a knob's liveness is known for these, and assumed to hold after the last.
_INERT: tuple[tuple[str, Version, Version, str], ...] = (
    ("num_continuous_decode_steps", (0, 5, 2), (9, 9, 9),
     "the flag is defined but nothing reads it in SGLang 0.5.2-0.5.23 (srt/server_args.py:357@v0.5.2, "
     "srt/arg_groups/fields/schedule.py:200@v0.5.23)"),
    ("nccl.NCCL_CUMEM_ENABLE", (0, 0, 0), (0, 5, 4),
     "SGLang before 0.5.5 overwrites NCCL_CUMEM_ENABLE at launch (srt/entrypoints/engine.py:652@v0.5.2)"),
    ("nccl.NCCL_NVLS_ENABLE", (0, 0, 0), (0, 5, 4),
     "SGLang before 0.5.5 overwrites NCCL_NVLS_ENABLE from --enable-nccl-nvls "
     "(srt/entrypoints/engine.py:654@v0.5.2)"),
)


def inert_knobs(version: str | None) -> dict[str, str]:
    """Knobs (``nccl.NAME`` for NCCL variables) that have no effect in this SGLang version -> why; with no
    version, those inert in every release read (0.5.2-0.5.23)."""
    if version is None:
        return {knob: why for knob, low, high, why in _INERT if low <= (0, 5, 2) and high >= (0, 5, 23)}
    v = parse_version(version)
    return {knob: why for knob, low, high, why in _INERT if low <= v <= high}


def knob_flag(knob: str, version: Version) -> str:
    """The SGLang flag for a servetune knob in that version. Raises ConfigError for unknown knobs."""
    if knob not in KNOB_FLAGS:
        raise ConfigError(f"unknown SGLang knob {knob!r}; allowed: {', '.join(sorted(KNOB_FLAGS))}")
    if knob == "cuda_graph_max_bs" and version >= DECODE_GRAPH_FLAG_SINCE:
        return "--cuda-graph-max-bs-decode"
    return KNOB_FLAGS[knob]


# ---- log patterns ---------------------------------------------------------------------------------

_PREFIX = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?((?: [A-Z][A-Z_]*\d+)*)\] ?")
_NUM = r"([0-9]+(?:\.[0-9]+)?)"

_MFS = re.compile(r"\bmem_fraction_static'?\s*[=:]\s*" + _NUM)
_CG_DECODE = re.compile(r"\bcuda_graph_max_bs_decode'?\s*[=:]\s*(\d+)")
_CG_PLAIN = re.compile(r"\bcuda_graph_max_bs'?\s*[=:]\s*(\d+)")
# From 0.5.14 a defaulted cuda_graph_max_bs(_decode) logs None; the value is in cuda_graph_config.decode.max_bs
# (0.5.14: ``cuda_graph_config=CudaGraphConfig(decode=PhaseConfig(backend='full', max_bs=256, ...``; 0.5.23's
# resolved dict: ``'cuda_graph_config': {'decode': {'backend': 'full', 'max_bs': 256, ...``).
_CG_CONFIG = re.compile(
    r"\bcuda_graph_config'?\s*[=:]\s*(?:CudaGraphConfig\()?\{?\s*'?decode'?\s*[=:]\s*(?:PhaseConfig\()?\{?"
    r"[^)}]*?\bmax_bs'?\s*[=:]\s*(\d+)"
)
_SA_CHUNKED = re.compile(r"\bchunked_prefill_size'?\s*[=:]\s*(-?\d+)")
_SA_MAXRUN = re.compile(r"\bmax_running_requests'?\s*[=:]\s*(\d+)")

_LOAD_BEGIN = re.compile(r"Load weight begin\..*?avail mem=" + _NUM + " GB")
_LOAD_END = re.compile(r"Load weight end\.(?:.*?avail mem=" + _NUM + r" GB, mem usage=" + _NUM + " GB)?")
_KV = re.compile(
    r"(?:^|\s|: )(?:(\S+) )?KV Cache (is allocated|VA upper bound)\.(?: dtype: [^,]+,)?(?: #tokens: (\d+),)? "
    r"(?:K size: " + _NUM + r" GB, V size: " + _NUM + r" GB|KV size: " + _NUM + " GB)"
)
_KV_POST = re.compile(
    r"Post-capture KV sizing: KV cache allocated\..*?#tokens: (\d+), KV size: " + _NUM
    + r" GB(?:, avail mem=" + _NUM + " GB)?"
)
_SWA_TOTAL = re.compile(r"SWAKVPool mem usage: " + _NUM + r" GB, swa size: (\d+), full size: (\d+)")
_DSV4_POOL = re.compile(r"Initialize DeepSeekV4TokenToKVPool with ")
_DSV4_FIELDS = re.compile(r"\b(max_num_reqs|swa_size|c4_size|c4_logical_size|c128_size|c4_state_pool_size"
                          r"|c128_state_pool_size)=(\d+)")
_POOL_END = re.compile(r"Memory pool end\. avail mem=" + _NUM + " GB")
_CAPTURE = re.compile(
    r"Capture .*?graph (begin|end)\b.*?(?:mem usage=" + _NUM + r" GB[,.] )?avail mem=" + _NUM + " GB",
    re.IGNORECASE,
)
_CAPTURE_BS = re.compile(r"\bbs=\[([\d, ]*)\]")
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
_BATCH = re.compile(r"\b(Prefill|Decode) batch\b")
# The scheduler retracting requests when the KV pool is full: a warning while serving, never a death
# ("Decode out of memory happened. #retracted_reqs" up to 0.4.3, "KV cache pool is full. Retract requests." after).
_RETRACT = re.compile(r"Decode out of memory happened\.|KV cache pool is full\. Retract requests\.")
# A negative profiled pool (ROCm 0.4.8: "max_total_tokens=131072 is larger than the profiled value -561981"):
# the weights left no room for the KV pool.
_NEGATIVE_POOL = re.compile(r"larger than the profiled value (-\d+)")
# The health check a rank >= 1 of a multi-node server serves once its schedulers are up
# (``launch_dummy_health_check_server``, srt/utils/common.py): 0.5.2-0.5.4 "Starting dummy health check server at",
# 0.5.5+ "Dummy health check server started in background thread at" (sglang#12297).
_DUMMY_HEALTH = re.compile(r"Starting dummy health check server at |Dummy health check server (?:started|scheduled)")
_LOAD_SHARDS = re.compile(r"Loading (?:safetensors|pt) checkpoint shards|(?i:multi-thread loading shards)")

# (pattern, explicit phase or None) -- any of these means the GPU ran out of memory.
_OOM_TEXTS: tuple[tuple[re.Pattern[str], Phase | None], ...] = (
    (re.compile(r"Not enough memory\. Please try to increase --mem-fraction-static"), Phase.KV_POOL),
    (re.compile(r"Loaded weights leave no GPU memory for the KV cache"), Phase.KV_POOL),
    (re.compile(r"Memory pool size is too small|max_running_request is zero"), Phase.KV_POOL),
    (re.compile(r"Prefill out of memory\. Try to lower your batch size"), Phase.PREFILL),
    (re.compile(r"Decode out of memory\. Try to lower your batch size"), Phase.DECODE),
    (re.compile(r"alloc_req_slots runs out of memory"), Phase.PREFILL),
    # The KV allocator (srt/mem_cache/allocation.py:163@v0.5.23, srt/mem_cache/common.py:217@v0.5.10): the
    # phase is where the server is (a prefill or decode batch).
    (re.compile(r"(?<![A-Za-z])Out of memory\. Try to lower your batch size"), None),
    (re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|Cuda failure 'out of memory'"
                r"|CUBLAS_STATUS_ALLOC_FAILED"), None),
)

_USAGE = re.compile(r"^usage: \S")
_ALLOCATOR_OOM = re.compile(r"(?i:cuda out of memory|outofmemoryerror|cuda error: out of memory)")

# (pattern, phase the server must be in when it appears, or None for "where it is").
_FATAL_TEXTS: tuple[tuple[re.Pattern[str], Phase | None], ...] = (
    # "Capture cuda graph failed:" up to 0.5.13, "Capture draft cuda / prefill CUDA / frozen-KV MTP cuda graph
    # failed:" later: read without regard to case.
    (re.compile(r"(?i:capture (?:[\w-]+ )*cuda graph failed:|piecewise cuda graph failed with error)"),
     Phase.CUDA_GRAPH),
    (re.compile(r"Initialization failed\. warmup error"), Phase.WARMUP),
    (re.compile(r"Not enough memory\. Please try to increase --mem-fraction-static"), Phase.KV_POOL),
    (re.compile(r"Scheduler hit an exception:|Received sigquit from a child proces|SIGQUIT received\."
                r"|Initialization failed\.|scheduler (?:is dead|died during initialization)|watchdog timeout"
                r"|Subprocess \S+ \(pid=\d+\) crashed"), None),
)





def _first(table: tuple[tuple[re.Pattern[str], Phase | None], ...], text: str) -> tuple[bool, Phase | None]:
    """Whether a pattern of ``table`` matches ``text``, and the phase that first match names."""
    for pattern, phase in table:
        if pattern.search(text):
            return True, phase
    return False, None


class SGLangLogParser(LogParserBase):
    """Reads an SGLang 0.5.2-0.5.23 server log line by line (implements :class:`LogParser`).

    Start-up phases only move forward (ranks print the same lines at different times); after the readiness
    line, ``Prefill batch``/``Decode batch`` lines switch between PREFILL and DECODE. Per-rank memory figures
    are taken from the first rank that prints one (TP ranks repeat them). ``fatal`` is set by the first
    fatal line; a later, more specific one (OOM over NCCL/argparse over a generic crash) replaces it.
    Each line goes through :attr:`RULES`, a table of (pattern, handler); what no rule takes is fatal evidence.
    """

    def __init__(self) -> None:
        super().__init__()
        self._rank_key: str | None = None
        self._last_batch: Phase | None = None
        self._kv: dict[str, tuple[int | None, float]] = {}
        self._kv_unlabeled = 0
        self._kv_post = False
        self._dsv4 = False
        self._graph_gib: dict[str, float] = {}

    # ---- internals ----

    def split(self, raw: str) -> Line:
        prefix = _PREFIX.match(raw)
        if prefix is None:
            return Line(raw)
        return Line(raw[prefix.end():], prefix.group(1).strip())

    def _own_rank(self, key: str) -> bool:
        """True for figures from the rank whose figures we keep (the first prefixed rank seen)."""
        if not key:
            return True
        if self._rank_key is None:
            self._rank_key = key
        return key == self._rank_key

    # ---- rules: one handler per kind of line ----

    def _on_server_args(self, m: re.Match[str], line: Line) -> None:
        self._server_args(line.text)

    def _on_ready(self, m: re.Match[str], line: Line) -> None:
        self.ready_line = True
        self.advance(Phase.READY)

    def _on_load_begin(self, m: re.Match[str], line: Line) -> None:
        self.advance(Phase.LOAD_WEIGHTS)
        if self._own_rank(line.key):
            self.telemetry.avail_before_weights_gib = float(m.group(1))

    def _on_load_end(self, m: re.Match[str], line: Line) -> None:
        self.advance(Phase.KV_POOL)
        if m.group(1) is not None and self._own_rank(line.key):
            self.telemetry.avail_after_weights_gib = float(m.group(1))
            self.telemetry.weights_gib = float(m.group(2))

    def _on_kv_post(self, m: re.Match[str], line: Line) -> None:
        if self._own_rank(line.key):
            tele = self.telemetry
            self._kv_post = True
            tele.kv_tokens, tele.kv_gib = int(m.group(1)), float(m.group(2))
            if m.group(3):
                tele.avail_after_kv_gib = float(m.group(3))

    def _on_kv(self, m: re.Match[str], line: Line) -> None:
        self.advance(Phase.KV_POOL)
        if not self._own_rank(line.key) or self._kv_post:
            return
        label = m.group(1) or ""
        size = float(m.group(4)) + float(m.group(5)) if m.group(4) else float(m.group(6))
        if not label:
            # 0.5.5-0.5.16 sliding-window models print two unlabeled lines (the SWA pool, then the full
            # one): the KV total is their sum, the token count the full pool's (the last line).
            self._kv_unlabeled += 1
            label = "" if self._kv_unlabeled == 1 else f"#{self._kv_unlabeled}"
        self._kv[label] = (int(m.group(3)) if m.group(3) else None, size)  # 0.4.x: no token count
        tele = self.telemetry
        tele.kv_tokens = self._kv_tokens()
        tele.kv_gib = round(sum(size for _, size in self._kv.values()), 4)

    def _kv_tokens(self) -> int | None:
        unlabeled = [k for k in self._kv if k == "" or k.startswith("#")]
        if unlabeled:
            return self._kv[unlabeled[-1]][0]
        return self._kv["Full"][0] if "Full" in self._kv else next(iter(self._kv.values()))[0]

    def _on_swa_total(self, m: re.Match[str], line: Line) -> None:
        # SWAKVPool mem usage: X GB, swa size: S, full size: F (0.5.5-0.5.16): the pool's own total.
        if self._own_rank(line.key) and not self._kv_post:
            tele = self.telemetry
            tele.kv_gib = round(float(m.group(1)), 4)
            tele.kv_tokens = int(m.group(3))
            tele.extra["swa_tokens"] = int(m.group(2))

    def _on_dsv4_pool(self, m: re.Match[str], line: Line) -> None:
        # The DeepSeek-V4 pool logs sizes in tokens only; kv_gib comes from the pool-end figure (below).
        self.advance(Phase.KV_POOL)
        if self._own_rank(line.key):
            self._dsv4 = True
            for name, value in _DSV4_FIELDS.findall(line.text):
                self.telemetry.extra[f"dsv4_{name}"] = int(value)

    def _on_pool_end(self, m: re.Match[str], line: Line) -> None:
        self.advance(Phase.KV_POOL)
        if self._own_rank(line.key):
            tele = self.telemetry
            tele.avail_after_kv_gib = float(m.group(1))
            if (self._dsv4 and tele.kv_gib is None and tele.avail_after_weights_gib is not None):
                tele.kv_gib = round(tele.avail_after_weights_gib - tele.avail_after_kv_gib, 4)
                tele.extra["kv_gib_from"] = "avail mem before and after the pool"

    def _on_capture(self, m: re.Match[str], line: Line) -> bool:
        if "failed" in line.text:
            return False
        self.advance(Phase.CUDA_GRAPH)
        captured = _CAPTURE_BS.search(line.text)
        if captured and "decode" in line.text[: m.start(1)] and captured.group(1).strip():
            # The decode batch sizes captured: on the begin line 0.5.14-0.5.21, on the end line from 0.5.22.
            self.telemetry.extra["capture_max_bs"] = max(int(b) for b in captured.group(1).split(","))
        if m.group(1).lower() == "end" and self._own_rank(line.key):
            tele = self.telemetry
            what = line.text[: m.start(1)]
            if m.group(2):
                self._graph_gib[what] = float(m.group(2))
                tele.graph_gib = round(sum(self._graph_gib.values()), 4)
            tele.free_after_capture_gib = float(m.group(3))
        return True

    def _on_capture_bar(self, m: re.Match[str], line: Line) -> None:
        self.advance(Phase.CUDA_GRAPH)
        what = "capture_last_bs" if m.group(1) == "batches" else "capture_last_tokens"
        self.telemetry.extra[what] = int(m.group(2))
        self.telemetry.extra["capture_last_avail_gib"] = float(m.group(3))

    def _on_pool_summary(self, m: re.Match[str], line: Line) -> bool:
        # The scheduler's summary ("max_total_num_tokens=..., ..., available_gpu_mem=" from 0.4.4; up to then it
        # ends at context_len=): not server_args' max_total_tokens.
        if "available_" not in line.text and "context_len=" not in line.text:
            return False
        tele = self.telemetry
        self.advance(Phase.WARMUP)
        tele.max_total_num_tokens = int(m.group(1))
        for name, value in _SUMMARY_FIELDS.findall(line.text):
            if name == "available_gpu_mem":
                tele.extra["available_gpu_mem_gib"] = float(value)
            elif name == "max_prefill_tokens":
                tele.extra["max_prefill_tokens"] = int(value)
            else:
                setattr(tele, name, int(value))
        return True

    def _on_uvicorn(self, m: re.Match[str], line: Line) -> None:
        self.advance(Phase.WARMUP)

    def _on_batch(self, m: re.Match[str], line: Line) -> None:
        self._last_batch = Phase.PREFILL if m.group(1) == "Prefill" else Phase.DECODE
        if self.phase in SERVING:
            self.phase = self._last_batch

    def _on_retract(self, m: re.Match[str], line: Line) -> None:
        # Retraction happens only in a decode step of a serving server (a head-cut paste starts here).
        self.telemetry.extra["retractions"] = self.telemetry.extra.get("retractions", 0) + 1
        if self.phase in SERVING:
            self.phase = Phase.DECODE

    def _on_negative_pool(self, m: re.Match[str], line: Line) -> None:
        self.advance(Phase.KV_POOL)
        self.telemetry.extra["profiled_max_total_tokens"] = int(m.group(1))
        self.set_fatal(FailureKind.OOM, Phase.KV_POOL,
                       f"out of memory in kv_pool: the profiled KV pool is negative ({m.group(1)} tokens): the "
                       "static budget leaves nothing for the KV pool after the weights", explicit=True)

    def _on_load_shards(self, m: re.Match[str], line: Line) -> None:
        self.advance(Phase.LOAD_WEIGHTS)

    def _on_dummy_health(self, m: re.Match[str], line: Line) -> None:
        # A rank >= 1 of a server spanning nodes has started and serves its part (it prints no ready line and
        # no batch lines: the head's scheduler does).
        self.advance(Phase.SERVING)

    RULES: ClassVar[Rules] = (
        (re.compile(r"server_args="), _on_server_args),
        (re.compile(re.escape(_READY)), _on_ready),
        (_LOAD_BEGIN, _on_load_begin),
        (_LOAD_END, _on_load_end),
        (_KV_POST, _on_kv_post),
        (_KV, _on_kv),
        (_SWA_TOTAL, _on_swa_total),
        (_DSV4_POOL, _on_dsv4_pool),
        (_POOL_END, _on_pool_end),
        (_CAPTURE, _on_capture),
        (_CAPTURE_BAR, _on_capture_bar),
        (_POOL_SUMMARY, _on_pool_summary),
        (_UVICORN, _on_uvicorn),
        (_BATCH, _on_batch),
        (_RETRACT, _on_retract),
        (_NEGATIVE_POOL, _on_negative_pool),
        (_LOAD_SHARDS, _on_load_shards),
        (_DUMMY_HEALTH, _on_dummy_health),
    )

    def _server_args(self, text: str) -> None:
        tele = self.telemetry
        m = _MFS.search(text)
        if m:
            tele.mem_fraction_static = float(m.group(1))
        m = _CG_DECODE.search(text) or _CG_PLAIN.search(text) or _CG_CONFIG.search(text)
        if m:
            tele.cuda_graph_max_bs = int(m.group(1))
        # Which field the release's server_args has tells its flag spelling when the log names no version.
        if re.search(r"\bcuda_graph_max_bs_decode\b", text):
            tele.extra["graph_flag"] = "--cuda-graph-max-bs-decode"
        elif re.search(r"\bcuda_graph_max_bs\b", text):
            tele.extra["graph_flag"] = "--cuda-graph-max-bs"
        m = _SA_CHUNKED.search(text)
        if m:
            tele.chunked_prefill_size = int(m.group(1))
        m = _SA_MAXRUN.search(text)
        if m:
            tele.max_running_requests = int(m.group(1))

    def _oom_phase(self, explicit: Phase | None) -> tuple[Phase, bool]:
        """Where an OOM happened and whether the text said so: the phase the line names wins (a pasted tail has
        no start-up lines, so the parser's own state is the weakest evidence); while serving, traceback frames
        or the last batch line tell prefill from decode."""
        if explicit is None and self.phase in SERVING:
            named = self.frames_phase()
            return (named if named in (Phase.PREFILL, Phase.DECODE) else self._last_batch or self.phase), False
        return self.death_phase(explicit)

    def fatal_evidence(self, text: str) -> None:
        # Hints that pin the phase (capture failed, warm-up error, KV pool) refine an OOM already recorded.
        generic, hint = _first(_FATAL_TEXTS, text)
        is_oom, oom_phase = _first(_OOM_TEXTS, text)
        if is_oom:
            self._on_oom(text, oom_phase or hint)
            return
        where, explicit = self.death_phase(hint if self.phase not in SERVING else None)
        if m := DIST_INIT_TIMEOUT.search(text):
            self.set_fatal(FailureKind.DIST_INIT_TIMEOUT, Phase.STARTING,
                           f"hung at init past --dist-timeout: {one_line(text[m.start():])}", explicit=True)
        elif NCCL_ERROR.search(text):
            self.set_fatal(FailureKind.NCCL_ERROR, where, f"NCCL failure in {where.value}: {one_line(text)}",
                           explicit=explicit)
        elif generic:
            if not self._refine(hint):
                self.set_fatal(FailureKind.CRASH, where, f"server crashed in {where.value}: {one_line(text)}",
                               explicit=explicit)
        elif m := ARGPARSE_ERROR.search(text):
            self.set_fatal(FailureKind.BAD_FLAG, Phase.STARTING, f"SGLang rejected a flag: {one_line(m.group(1))}")
        elif _USAGE.match(text):
            # The usage line comes before the argparse error: weak evidence the error line replaces.
            self.set_fatal(FailureKind.BAD_FLAG, Phase.STARTING, f"SGLang printed its usage: {one_line(text)}",
                           priority=1)

    def _on_oom(self, text: str, explicit: Phase | None) -> None:
        if self._refine(explicit):
            return
        phase, named = self._oom_phase(explicit)
        figures = oom_figures(text)
        torch_oom = bool(figures) or bool(_ALLOCATOR_OOM.search(text))
        if torch_oom:
            self._fill_oom_figures(figures)
        reason = self.oom_reason(phase) if torch_oom else f"out of memory in {phase.value}: {one_line(text)}"
        self.set_fatal(FailureKind.OOM, phase, reason, explicit=named, from_figures=torch_oom)

    def _refine(self, hint: Phase | None) -> bool:
        """Pin the phase of an OOM already recorded when a later line names it (e.g. capture failed)."""
        fatal = self.fatal
        if (hint is None or fatal is None or fatal.kind is not FailureKind.OOM or self._fatal_phase_explicit
                or self.phase in SERVING or hint in (Phase.PREFILL, Phase.DECODE)):
            return False
        if hint != fatal.phase:
            self.repin(hint)
        self._fatal_phase_explicit = True
        return True


class SimulatedLogParser(SGLangLogParser):
    """The simulated host prints SGLang's lines; its telemetry is marked simulated."""

    simulated: ClassVar[bool] = True


# ---- engine -------------------------------------------------------------------------------------------


class SGLangEngine:
    """The SGLang engine (:class:`~runners.engines.base.Engine`): ``python -m sglang.launch_server``."""

    name: str = "sglang"
    bench_api: BenchApi = "sglang"
    simulated: bool = False
    memory_family: MemoryFamily | None = "sglang"
    tp_flags: ClassVar[tuple[str, ...]] = ("--tp-size", "--tensor-parallel-size", "--tp")
    """``--tensor-parallel-size`` with its alias ``--tp-size`` (sglang-facts §1, 0.5.23 server_args.py), and
    ``--tp``, which SGLang's parser takes as an abbreviation of ``--tp-size`` (its ``allow_abbrev`` is on)."""
    health_path: str = "/health"
    needs_ready_line: bool = True
    scratch_vars: tuple[str, ...] = ("TMPDIR",)
    """Per-trial scratch only; shared compile caches (Triton, FlashInfer, torch.compile) stay shared."""
    info_paths: tuple[str, ...] = ("/server_info", "/get_server_info")
    """``/server_info`` first: from 0.5.9 each ``/get_server_info`` call logs a deprecation warning
    (engine-audit #15); releases without ``/server_info`` answer 404 and the old path is asked next."""
    knob_flags: ClassVar[Mapping[str, str]] = KNOB_FLAGS
    env_knobs: ClassVar[Mapping[str, str]] = ENV_KNOBS
    owned_flags: ClassVar[frozenset[str]] = frozenset(
        {"--host", "--port", "--model-path", "--model", "--tensor-parallel-size", "--tp-size", "--tp",
         "--nnodes", "--node-rank", "--dist-init-addr", "--base-gpu-id"})
    module: ClassVar[str] = "sglang.launch_server"

    def tp_flag(self, args: Sequence[str]) -> int | None:
        return tp_from_args(args, self.tp_flags)

    def tp_size(self, args: Sequence[str]) -> int:
        return self.tp_flag(args) or 1

    def knob_flag(self, knob: str, version: str) -> str:
        return knob_flag(knob, parse_version(version))

    def inert_knobs(self, version: str | None) -> dict[str, str]:
        return inert_knobs(version)

    def version_command(self, python: str) -> str:
        return f'{shlex.quote(python)} -c "import sglang; print(sglang.__version__)"'

    def nccl_version_command(self, python: str) -> str:
        return torch_nccl_command(python)

    def checkpoint_command(self, python: str, model_path: str) -> str:
        return checkpoint_command(python, model_path)

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
        for flag, value in launch.flags.items():
            flags += flag_args(flag, value)
        return command(launch, self.module, "--model-path", flags, self._leading_args(launch, version))

    def rank_argv(self, launch: LaunchLike, version: str, *, nnodes: int, rank: int, head: str,
                  dist_port: int) -> list[str]:
        """``--nnodes``, ``--node-rank`` and ``--dist-init-addr head:port`` after the one-node command (every
        release 0.5.2-0.5.23 has them: ``srt/server_args.py``); ``--tp`` stays the total over the nodes."""
        return [*self.argv(launch, version), "--nnodes", str(nnodes), "--node-rank", str(rank),
                "--dist-init-addr", dist_init_addr(head, dist_port)]

    def flag_table(self, version: str | None) -> FlagTable | None:
        return flag_table("sglang", version)

    def environment(self, launch: LaunchLike, version: str) -> dict[str, str]:
        return dict(launch.env)

    def parser(self) -> SGLangLogParser:
        return SGLangLogParser()

    def _rescan(self, parser: LogParser, log_tail: str) -> Failure | None:
        """The parser's fatal line, or a more specific one found by re-reading ``log_tail`` (whose OOM figures
        are then copied where the parser has none)."""
        fatal = parser.fatal
        if not log_tail:
            return fatal
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
        return fatal

    def classify(self, parser: LogParser, exit_code: int | None, log_tail: str,
                 evidence: Mapping[str, Any] | None = None) -> Failure:
        """Why the server died: parser evidence, then the log tail re-read, then the exit code.

        Figures found only in ``log_tail`` (OOM sizes, ``oom_phase``) are copied into ``parser.telemetry``
        where it has none. ``evidence`` may carry ``oom_kill`` (host OOM killer count or flag).
        """
        fatal = self._rescan(parser, log_tail)
        phase = parser.phase
        signal = signal_of(exit_code) if exit_code is not None else None
        host_oom = signal == 9 and oom_kills(evidence) > 0
        error = last_error(log_tail, lambda line: _PREFIX.sub("", line))
        if fatal is not None and not (host_oom and fatal.kind is FailureKind.CRASH):
            if fatal.kind is FailureKind.CRASH and error and fatal.phase is not None:
                # "Scheduler hit an exception: Traceback ..." says little; the exception line says why.
                fatal = replace(fatal, reason=f"server crashed in {fatal.phase.value}: {error}")
            return nccl_warned(replace(fatal, exit_code=exit_code), parser)
        if host_oom:
            if parser.telemetry.oom_phase is None:
                parser.telemetry.oom_phase = phase.value
            return Failure(FailureKind.OOM, phase,
                           f"killed by the host OOM killer (host RAM) in {phase.value}", exit_code)
        if signal == 9:
            return Failure(FailureKind.CRASH, phase,
                           f"killed by SIGKILL (exit {exit_code}) in {phase.value} with no error in the log; "
                           f"possibly the host OOM killer (check dmesg)", exit_code)
        return nccl_warned(Failure(FailureKind.CRASH, phase, death_reason(exit_code, phase, error), exit_code),
                           parser)
