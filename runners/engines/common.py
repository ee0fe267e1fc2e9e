"""Pieces every engine shares: version parsing, the log-parser base (feed, phase advance, fatal evidence, rule
tables), phase order, fatal priorities, exit signals, flag values and host OOM evidence."""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from runners.engines.base import LaunchLike
from runners.errors import ConfigError
from runners.telemetry import Failure, FailureKind, Phase, Telemetry, allocation_text, parse_size_gib

Version = tuple[int, int, int]
_VERSION_RE = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str) -> Version:
    """``"0.5.10.post1"`` -> ``(0, 5, 10)``; ``"0.5.3rc0"`` -> ``(0, 5, 3)``. Raises ConfigError."""
    match = _VERSION_RE.match(text or "")
    if match is None:
        raise ConfigError(f"cannot read an engine version from {text!r} (expected e.g. 0.5.10)")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)

STARTUP_ORDER = (
    Phase.STARTING, Phase.LOAD_WEIGHTS, Phase.KV_POOL, Phase.CUDA_GRAPH, Phase.WARMUP, Phase.READY,
)
SERVING = frozenset({Phase.READY, Phase.PREFILL, Phase.DECODE, Phase.SERVING})
PRIORITY = {FailureKind.CRASH: 1, FailureKind.BAD_FLAG: 2, FailureKind.NCCL_ERROR: 2, FailureKind.DIST_INIT_TIMEOUT: 2,
            FailureKind.OOM: 3}
"""When several fatal lines appear, the more specific kind wins (an OOM over a generic crash)."""

DIST_INIT_TIMEOUT = re.compile(
    # torch's TCP store (torch/csrc/distributed/c10d/TCPStore.cpp, socket.cpp): the head waiting for ranks that
    # never joined, a rank that cannot reach the head, a rank whose wait for the others ran out.
    r"DistStoreError: Timed out after \d+ seconds waiting for clients\. \d+/\d+ clients joined"
    r"|DistNetworkError: The client socket has timed out after \d+ms while trying to connect to"
    r"|DistStoreError: wait timeout after \d+ms"
)
"""A rendezvous of a multi-node server that ran out of time (``--dist-timeout``)."""
NCCL_ERROR = re.compile(
    r"NCCL error|ncclInvalidArgument|ncclInvalidUsage|ncclUnhandledCudaError|ncclSystemError"
    r"|ncclInternalError|ncclRemoteError|DistBackendError|unhandled cuda error"
    # A forced algorithm or protocol that leaves a collective without a path (enqueue.cc): NCCL 2.24-2.29 print
    # "Error : no algorithm/protocol available for function X", 2.30 "No algorithm/protocol available for
    # function X" (capital N, no "Error :"), 2.31 "No algorithm/protocol nor symKernelId available for function X".
    r"|(?i:no algorithm/protocol (?:nor symKernelId )?available)"
)
"""An NCCL failure in any engine's log (torch's ``NCCL error ...`` and NCCL's own result names)."""
NCCL_WARN = re.compile(r"^\S*:\d+:\d+ \[\d+\] (?:\S+ )?NCCL WARN (.*)")
"""NCCL's own warning line (``host:pid:tid [rank] NCCL WARN ...``): evidence of an NCCL fault when the server
died without a better reason, never a death by itself (NCCL also warns about things it recovers from)."""

ARGPARSE_ERROR = re.compile(
    r"\berror: ((?:ambiguous option|unrecognized arguments|argument |the following arguments are required"
    r"|invalid choice|expected one argument).*)"
)
SIZE = r"([0-9]+(?:\.[0-9]+)? (?:bytes|KiB|MiB|GiB|TiB))"
"""A torch ``format_size`` figure, e.g. ``3.94 GiB`` (see :func:`runners.telemetry.parse_size_gib`)."""
TORCH_OOM = re.compile(
    r"CUDA out of memory\. Tried to allocate " + SIZE
    + r"\. GPU \d+ has a total capac\w* of " + SIZE + r" of which " + SIZE + " is free"
)
"""PyTorch's caching-allocator OOM text (sglang-facts §3.1): tried, total capacity, free."""
_SIZE_WS = r"([0-9]+(?:\.[0-9]+)?\s+(?:bytes|KiB|MiB|GiB|TiB))"
# The pieces of the allocator's sentences, each readable alone (a paste may cut or re-flow the sentence, or pad
# it with runs of spaces where a terminal wrapped it): torch >= 2.1, torch < 2.1, and c10's per-rank warning
# "memory allocation failed with OOM on device N while trying to allocate B bytes (free: F, total: T)".
OOM_PIECES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("tried", re.compile(r"Tried\s+to\s+allocate\s+" + _SIZE_WS)),
    ("total", re.compile(r"total\s+capac\w*\s+of\s+" + _SIZE_WS)),
    ("free", re.compile(r"of\s+which\s+" + _SIZE_WS + r"\s+is\s+free")),
    ("total", re.compile(_SIZE_WS + r"\s+total\s+capacity")),
    ("free", re.compile(_SIZE_WS + r"\s+free;")),
    ("tried", re.compile(r"while\s+trying\s+to\s+allocate\s+(\d+)\s+bytes")),
    ("free", re.compile(r"while\s+trying\s+to\s+allocate\s+\d+\s+bytes\s+\(free:\s+(\d+)")),
    ("total", re.compile(r"while\s+trying\s+to\s+allocate\s+\d+\s+bytes\s+\(free:\s+\d+,\s+total:\s+(\d+)")),
)


def oom_figures(text: str) -> dict[str, float]:
    """GiB figures (``tried``, ``free``, ``total``) from whatever pieces of an allocator OOM sentence ``text`` holds."""
    found: dict[str, float] = {}
    for key, pattern in OOM_PIECES:
        if key in found:
            continue
        m = pattern.search(text)
        if m:
            size = " ".join(m.group(1).split())
            found[key] = round(parse_size_gib(size if " " in size else f"{size} bytes"), 6)
    return found


_SOURCE_LINE = re.compile(r"^\s*(?:raise\s|return\s|if\s|elif\s|assert\s)|\bf[\"'].*\{|^\s*[\"'].*[\"'],?\)?$")


def is_source_line(text: str) -> bool:
    """True for a traceback's quoted source line (``raise RuntimeError(f"NCCL error: {error_str}")``, a string
    continuation), which names an error without being it: the exception line below it is the reason."""
    return bool(_SOURCE_LINE.search(text))


# Functions whose traceback frames say where a server was (innermost start-up frame wins, then serving frames).
FRAME = re.compile(r'^\s*File "[^"]*", line \d+, in (\w+)')
FRAME_PHASES: dict[str, Phase] = {
    # SGLang (srt/model_executor/model_runner.py, cuda_graph_runner.py, managers/scheduler.py)
    "init_torch_distributed": Phase.STARTING, "initialize_model_parallel": Phase.STARTING,
    "load_model": Phase.LOAD_WEIGHTS, "load_weights": Phase.LOAD_WEIGHTS, "weight_loader": Phase.LOAD_WEIGHTS,
    "create_weights": Phase.LOAD_WEIGHTS, "load_weights_and_postprocess": Phase.LOAD_WEIGHTS,
    "init_memory_pool": Phase.KV_POOL, "profile_max_num_token": Phase.KV_POOL,
    "init_cuda_graphs": Phase.CUDA_GRAPH, "capture_one_batch_size": Phase.CUDA_GRAPH,
    "forward_extend": Phase.PREFILL, "forward_decode": Phase.DECODE,
    # vLLM (worker/model_runner.py, v1/worker/gpu_worker.py, gpu_model_runner.py, engine/*)
    "init_worker_distributed_environment": Phase.STARTING, "ncclCommInitRank": Phase.STARTING,
    "profile_run": Phase.KV_POOL, "determine_available_memory": Phase.KV_POOL,
    "determine_num_available_blocks": Phase.KV_POOL, "check_enough_kv_cache_memory": Phase.KV_POOL,
    "initialize_kv_cache": Phase.KV_POOL, "_init_cache": Phase.KV_POOL,
    "capture_model": Phase.CUDA_GRAPH, "_dummy_sampler_run": Phase.WARMUP,
    "run_engine_loop": Phase.SERVING, "engine_step": Phase.SERVING, "execute_model": Phase.SERVING,
}
PY_EXCEPTION = re.compile(r"^\s*(?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt)\b:? ?.*")
SIGNALS = {9: "SIGKILL", 15: "SIGTERM", 6: "SIGABRT", 11: "SIGSEGV", 2: "SIGINT", 3: "SIGQUIT"}
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
"""Terminal colour and cursor codes, removed from log lines before they are matched."""


def rank(phase: Phase) -> int:
    """Start-up phases in order; every serving phase ranks after them."""
    return len(STARTUP_ORDER) if phase in SERVING else STARTUP_ORDER.index(phase)


def one_line(text: str, limit: int = 240) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def dist_init_addr(head: str, port: int) -> str:
    """``head:port`` as the engines parse a rendezvous address (an IPv6 address in brackets)."""
    try:
        if ipaddress.ip_address(head).version == 6:
            return f"[{head}]:{port}"
    except ValueError:
        pass
    return f"{head}:{port}"


def flag_name(arg: str) -> str:
    return arg.split("=", 1)[0]


def tp_from_args(args: Sequence[str], flags: Sequence[str]) -> int | None:
    """The tensor parallel size ``args`` give with the first of ``flags`` that carries a number (``--flag N``
    or ``--flag=N``); None when none does."""
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in flags:
            text = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            if text.isdigit():
                return int(text)
    return None


def flag_value(args: Sequence[str], *names: str) -> str | None:
    """The value the first of ``names`` is given in ``args`` (``--flag value`` or ``--flag=value``)."""
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in names:
            return value if eq else (args[i + 1] if i + 1 < len(args) else None)
    return None


def number_arg(knob: str, value: Any, *, is_float: bool) -> str:
    """A knob value as its flag's argument (or environment value): a float short and exact (4 decimals)
    when ``is_float``, else an integer (a whole float such as ``64.0`` is accepted). Raises ConfigError."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"knob {knob!r} needs {'a number' if is_float else 'an integer'}, got {value!r}")
    if is_float:
        return repr(round(float(value), 4))
    if isinstance(value, float):
        if not value.is_integer():
            raise ConfigError(f"knob {knob!r} needs an integer, got {value!r}")
        value = int(value)
    return str(value)


def oom_kills(evidence: Mapping[str, Any] | None) -> int:
    """How many OOM kills the host evidence reports (cgroup ``oom_kill`` or a kernel-log count)."""
    if not evidence:
        return 0
    total = 0
    for key in ("oom_kill", "kernel_oom_kill"):
        value = evidence.get(key)
        if isinstance(value, int | float):  # bool is an int: True counts one kill
            total += int(value)
    return total


def signal_of(exit_code: int) -> int | None:
    """The signal behind an exit code: -N from Python's subprocess, 128+N from a shell."""
    if exit_code < 0:
        return -exit_code
    if 128 < exit_code < 160:
        return exit_code - 128
    return None


def last_error(log_tail: str, strip: Callable[[str], str]) -> str:
    """The last Python exception line of a log (``strip`` removes the engine's line prefix)."""
    for line in reversed(log_tail.splitlines()):
        line = strip(line.strip())
        if line and PY_EXCEPTION.match(line) and not line.startswith("During handling"):
            return one_line(line, 200)
    return ""


def nccl_warned(failure: Failure, parser: Any) -> Failure:
    """``failure`` as an NCCL failure when it is a crash without a better reason and NCCL warned before it
    (``NCCL WARN`` lines, :data:`NCCL_WARN`); the first warning is the reason (later ones are its echoes)."""
    warnings = getattr(parser, "nccl_warnings", None)
    if failure.kind is not FailureKind.CRASH or not warnings:
        return failure
    where = failure.phase.value if failure.phase is not None else "an unknown phase"
    return Failure(FailureKind.NCCL_ERROR, failure.phase, f"NCCL failure in {where}: NCCL WARN {warnings[0]}",
                   failure.exit_code)


def death_reason(exit_code: int | None, phase: Phase, error: str) -> str:
    """One line for a death with no better evidence: how it ended, where, and the last exception."""
    signal = signal_of(exit_code) if exit_code is not None else None
    if exit_code is None:
        what = "server died (exit code unknown)"
    elif signal is not None:
        what = f"server killed by {SIGNALS.get(signal, f'signal {signal}')} (exit {exit_code})"
    else:
        what = f"server exited with code {exit_code}"
    return f"{what} in {phase.value}" + (f": {error}" if error else "")


def command(launch: LaunchLike, module: str, model_flag: str, flags: Sequence[str],
            leading: Sequence[str] = ()) -> list[str]:
    """``python -m module [leading] <model> --host --port [searched flags] [fixed args]``.

    A fixed arg that repeats a searched flag is refused: the engine would take whichever comes last.
    """
    fixed = tuple(launch.fixed_args)
    searched = {a for a in flags if a.startswith("--")}
    clash = sorted(searched & {flag_name(a) for a in fixed})
    if clash:
        raise ConfigError(f"fixed args repeat searched flag(s) {', '.join(clash)}; remove them from fixed_args")
    return [
        launch.python, "-m", module, *leading,
        model_flag, launch.model_path,
        "--host", launch.host,
        "--port", str(launch.port),
        *flags,
        *fixed,
    ]


# ---- the log-parser base ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    """One log line as a rule sees it: ``text`` without the engine's prefix, ``key`` the rank that printed it
    (``""`` when the line carries none)."""

    text: str
    key: str = ""


Handler = Callable[[Any, "re.Match[str]", Line], "bool | None"]
"""A rule's action: ``handler(parser, match, line)``; returning False passes the line on to the next rule."""
Rules = tuple[tuple["re.Pattern[str]", Handler], ...]

_LINE_BREAK = re.compile(r"\r\n?|\n")


class LogParserBase:
    """Feeds lines through a table of ``(pattern, handler)`` rules (implements
    :class:`~runners.engines.base.LogParser`).

    ``feed`` splits tqdm's ``\\r`` fragments, drops colour codes, lets :meth:`split` take off the engine's
    prefix, then runs the first rule whose pattern matches; a line no rule takes goes to
    :meth:`fatal_evidence`. Start-up phases only move forward (ranks print the same lines at different
    times). ``fatal`` keeps the first fatal line unless a more specific kind (:data:`PRIORITY`) follows, or the
    first came from a traceback's source line and the exception itself follows.

    What every engine's paste shares is read here: traceback frames (:data:`FRAME_PHASES`) name the phase of a
    death whose text does not (the innermost start-up frame, else the innermost serving frame), and the pieces of
    the allocator's OOM sentences fill the OOM figures wherever they stand (:func:`oom_figures`).
    """

    RULES: ClassVar[Rules] = ()
    simulated: ClassVar[bool] = False

    def __init__(self) -> None:
        self.telemetry = Telemetry(simulated=self.simulated)
        self.phase = Phase.STARTING
        self.ready_line = False
        self.fatal: Failure | None = None
        self.nccl_warnings: list[str] = []
        """NCCL's own ``NCCL WARN`` lines (evidence for a death without a better reason, see NCCL_WARN)."""
        self._fatal_priority = 0
        self._fatal_phase_explicit = False
        self._fatal_from_source = False
        self._line_is_source = False
        self._frames: list[Phase] = []
        self._pending_oom: dict[str, float] = {}
        self._oom_reason_from_figures = False

    def feed(self, line: str) -> None:
        for fragment in _LINE_BREAK.split(line):
            fragment = ANSI.sub("", fragment)
            if fragment.strip():
                self._feed_one(self.split(fragment))

    def split(self, raw: str) -> Line:
        """The line without the engine's log prefix (none by default)."""
        return Line(raw.rstrip())

    def _feed_one(self, line: Line) -> None:
        text = line.text
        frame = FRAME.match(text)
        if frame is not None:
            self._on_frame(frame.group(1))
            return
        if "Traceback (most recent call last)" in text:
            self._frames = []
        if (warn := NCCL_WARN.match(text)) and len(self.nccl_warnings) < 100:  # a flood of them stays bounded
            self.nccl_warnings.append(one_line(warn.group(1), 200))
        self._line_is_source = is_source_line(text)
        self._oom_pieces(text)
        for pattern, handler in self.RULES:
            m = pattern.search(text)
            if m is not None and handler(self, m, line) is not False:
                return
        self.fatal_evidence(text)

    def fatal_evidence(self, text: str) -> None:
        """Record what ``text`` says about a death (nothing by default)."""

    def advance(self, phase: Phase) -> None:
        """Move to ``phase`` if it comes later in start-up; serving phases switch freely among themselves."""
        if (self.phase in SERVING and phase in SERVING) or rank(phase) > rank(self.phase):
            self.phase = phase

    # ---- traceback frames ----

    def frames_phase(self) -> Phase | None:
        """The phase the current traceback's frames name: the innermost start-up frame, else serving frame."""
        startup = [phase for phase in self._frames if phase not in SERVING]
        if startup:
            return startup[-1]
        return self._frames[-1] if self._frames else None

    def _on_frame(self, function: str) -> None:
        phase = FRAME_PHASES.get(function)
        if phase is None:
            return
        self._frames.append(phase)
        fatal = self.fatal
        named = self.frames_phase()
        # Frames printed after the exception (vLLM <= 0.6 logs the exception, then its traceback) pin its phase.
        if (fatal is not None and named is not None and not self._fatal_phase_explicit
                and fatal.kind in (FailureKind.OOM, FailureKind.CRASH, FailureKind.NCCL_ERROR)
                and named != fatal.phase):
            self.repin(named)

    def repin(self, phase: Phase) -> None:
        """Move the recorded death to ``phase`` (its reason says where it happened, so that changes too)."""
        fatal = self.fatal
        assert fatal is not None
        old = f" in {fatal.phase.value}" if fatal.phase is not None else ""
        reason = fatal.reason.replace(old, f" in {phase.value}", 1) if old else fatal.reason
        self.fatal = Failure(fatal.kind, phase, reason, fatal.exit_code)
        if fatal.kind is FailureKind.OOM:
            self.telemetry.oom_phase = phase.value

    # ---- OOM figures from any piece of the allocator's sentences ----

    def _oom_pieces(self, text: str) -> None:
        found = oom_figures(text)
        if not found:
            return
        if self.fatal is None or self.fatal.kind is not FailureKind.OOM:
            for key, value in found.items():
                self._pending_oom.setdefault(key, value)
            return
        self._fill_oom_figures(found)

    def _fill_oom_figures(self, found: Mapping[str, float]) -> None:
        tele = self.telemetry
        changed = False
        for key, attr in (("tried", "tried_to_allocate_gib"), ("free", "free_at_oom_gib"),
                          ("total", "gpu_total_gib")):
            if key in found and getattr(tele, attr) is None:
                setattr(tele, attr, found[key])
                changed = changed or key != "total"
        if changed and self._oom_reason_from_figures and self.fatal is not None and self.fatal.phase is not None:
            self.fatal = Failure(self.fatal.kind, self.fatal.phase, self.oom_reason(self.fatal.phase),
                                 self.fatal.exit_code)

    def oom_reason(self, phase: Phase) -> str:
        """The one-line reason of an allocator OOM in ``phase``, with the figures known so far."""
        tele = self.telemetry
        tried, free = tele.tried_to_allocate_gib, tele.free_at_oom_gib
        if tried is not None and free is not None:
            return f"CUDA out of memory in {phase.value}: {allocation_text(tried, free)}"
        if tried is not None:
            return (f"CUDA out of memory in {phase.value}: tried to allocate {tried:.2f} GiB "
                    "(free memory not in the log)")
        return f"CUDA out of memory in {phase.value} (sizes not in the log)"

    # ---- the fatal line ----

    def set_fatal(self, kind: FailureKind, phase: Phase, reason: str, *, priority: int | None = None,
                  explicit: bool = False, from_figures: bool = False) -> bool:
        """Record a fatal line unless one of the same or a higher priority is already recorded (one quoted from a
        traceback's source line gives way to the exception line of the same kind). ``explicit``: the line named
        its phase itself, so frames do not move it; ``from_figures``: the reason is :meth:`oom_reason`'s and is
        rebuilt as figures arrive."""
        prio = PRIORITY[kind] if priority is None else priority
        if self.fatal is not None:
            upgrade = self._fatal_from_source and not self._line_is_source and prio == self._fatal_priority
            if prio <= self._fatal_priority and not upgrade:
                return False
        self.fatal = Failure(kind, phase, reason)
        self._fatal_priority = prio
        self._fatal_phase_explicit = explicit
        self._fatal_from_source = self._line_is_source
        self._oom_reason_from_figures = from_figures
        if kind is FailureKind.OOM:
            self.telemetry.oom_phase = phase.value
            if self._pending_oom:
                self._fill_oom_figures(self._pending_oom)
        return True

    def death_phase(self, explicit: Phase | None = None) -> tuple[Phase, bool]:
        """Where a death recorded now happened, and whether the text named it: the phase the line states wins,
        then the traceback's frames, then the parser's own state."""
        if explicit is not None:
            return explicit, True
        named = self.frames_phase()
        if named is not None:
            return named, False
        return self.phase, False


#: Prints torch's NCCL version as ``2.27.3`` (torch < 2.1 returns one integer: 2708 or 21903), or nothing.
_TORCH_NCCL = ("import torch\n"
               "try:\n    v = torch.cuda.nccl.version()\nexcept Exception:\n    raise SystemExit(0)\n"
               "if isinstance(v, int):\n"
               "    v = (v // 10000, v // 100 % 100, v % 100) if v >= 10000 else (v // 1000, v // 100 % 10, v % 100)\n"
               "print('.'.join(str(x) for x in v))")


def torch_nccl_command(python: str) -> str:
    """The shell command that prints the NCCL version ``python``'s torch loads (empty without one)."""
    return f"{shlex.quote(python)} -c {shlex.quote(_TORCH_NCCL)}"
