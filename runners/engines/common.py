"""Pieces every engine shares: version parsing, the log-parser base (feed, phase advance, fatal evidence, rule
tables), phase order, fatal priorities, exit signals, flag values and host OOM evidence."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from runners.engines.base import LaunchLike
from runners.errors import ConfigError
from runners.telemetry import Failure, FailureKind, Phase, Telemetry

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
PRIORITY = {FailureKind.CRASH: 1, FailureKind.BAD_FLAG: 2, FailureKind.NCCL_ERROR: 2, FailureKind.OOM: 3}
"""When several fatal lines appear, the more specific kind wins (an OOM over a generic crash)."""

NCCL_ERROR = re.compile(
    r"NCCL error|ncclInvalidArgument|ncclInvalidUsage|ncclUnhandledCudaError|ncclSystemError"
    r"|ncclInternalError|ncclRemoteError|DistBackendError|unhandled cuda error"
    # NCCL >= 2.24 with a forced algorithm or protocol that has no path for a collective (enqueue.cc).
    r"|no algorithm/protocol available for function"
)
"""An NCCL failure in any engine's log (torch's ``NCCL error ...`` and NCCL's own result names)."""

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
    times). ``fatal`` keeps the first fatal line unless a more specific kind (:data:`PRIORITY`) follows.
    """

    RULES: ClassVar[Rules] = ()
    simulated: ClassVar[bool] = False

    def __init__(self) -> None:
        self.telemetry = Telemetry(simulated=self.simulated)
        self.phase = Phase.STARTING
        self.ready_line = False
        self.fatal: Failure | None = None
        self._fatal_priority = 0

    def feed(self, line: str) -> None:
        for fragment in _LINE_BREAK.split(line):
            fragment = ANSI.sub("", fragment)
            if fragment.strip():
                self._feed_one(self.split(fragment))

    def split(self, raw: str) -> Line:
        """The line without the engine's log prefix (none by default)."""
        return Line(raw.rstrip())

    def _feed_one(self, line: Line) -> None:
        for pattern, handler in self.RULES:
            m = pattern.search(line.text)
            if m is not None and handler(self, m, line) is not False:
                return
        self.fatal_evidence(line.text)

    def fatal_evidence(self, text: str) -> None:
        """Record what ``text`` says about a death (nothing by default)."""

    def advance(self, phase: Phase) -> None:
        """Move to ``phase`` if it comes later in start-up; serving phases switch freely among themselves."""
        if (self.phase in SERVING and phase in SERVING) or rank(phase) > rank(self.phase):
            self.phase = phase

    def set_fatal(self, kind: FailureKind, phase: Phase, reason: str, *, priority: int | None = None) -> bool:
        """Record a fatal line unless one of the same or a higher priority is already recorded."""
        prio = PRIORITY[kind] if priority is None else priority
        if self.fatal is not None and prio <= self._fatal_priority:
            return False
        self.fatal = Failure(kind, phase, reason)
        self._fatal_priority = prio
        if kind is FailureKind.OOM:
            self.telemetry.oom_phase = phase.value
        return True
