"""servetune's one exception tree.

Every error servetune raises on purpose is a :class:`ServetuneError`. Foreign errors (paramiko, socket,
SQLAlchemy, MLflow, pydantic) are mapped into this tree at the one boundary that talks to them, so callers
catch servetune's errors only::

    ServetuneError
    ├── ConfigError              bad space file, bad value, bad CLI input (user can fix it)
    ├── StudyError               unknown study, unreachable or broken storage
    └── RunnerError              infrastructure trouble: a trial that hits one is FAIL, never PRUNED
        ├── HostUnreachable      connect refused/timed out, DNS, SSH transport dropped
        │   └── CommandTimeout   a command on the host did not finish in time
        ├── AuthError            key rejected, no usable key
        ├── HostBusy             a foreign process holds GPU memory or the port, or another live
        │                        controller holds the host (its lease)
        ├── HostMisconfigured    the host's set-up is wrong and waiting will not fix it (no nvidia-smi, no
        │   │                    SFTP subsystem, model path missing, too few GPUs): the host is dropped
        │   ├── EngineMissing    the engine (or python) is not installed on the host
        │   └── HostKeyError     unknown or changed host key (refused unless explicitly accepted): a
        │                        person must check the host, retrying cannot help
        └── NotOurProcess        refusing to signal a process group servetune did not start

Outcomes of a *trial* (OOM, NCCL error, rejected flag) are values (:mod:`runners.telemetry`), not
exceptions: a crashed server is data.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ServetuneError(Exception):
    """Root of servetune's errors. ``str(err)`` is one line a user can act on."""


class ConfigError(ServetuneError):
    """Input is wrong: names what is wrong and what is allowed."""


class StudyError(ServetuneError):
    """The study or its storage cannot be used."""


class RunnerError(ServetuneError):
    """Infrastructure trouble on the way to, or on, a host."""

    def __init__(self, message: str, *, host: str | None = None) -> None:
        super().__init__(message)
        self.host = host


class HostUnreachable(RunnerError):
    """The host cannot be reached or the connection dropped."""


class CommandTimeout(HostUnreachable):
    """A command on the host did not finish within its timeout."""


class AuthError(RunnerError):
    """Authentication to the host failed."""


class HostBusy(RunnerError):
    """The host is taken: a process servetune did not start holds GPU memory or the server's port, or
    another live controller holds the host."""


class HostMisconfigured(RunnerError):
    """The host's set-up is wrong in a way waiting will not fix. ``str(err)`` names the host, the fault
    and the fix; ``fault`` is a short tag (``no_nvidia_smi``, ``no_sftp``, ...)."""

    def __init__(self, message: str, *, host: str | None = None, fault: str = "host_config") -> None:
        super().__init__(message, host=host)
        self.fault = fault


class EngineMissing(HostMisconfigured):
    """The serving engine or its python is missing on the host."""

    def __init__(self, message: str, *, host: str | None = None, fault: str = "engine_missing") -> None:
        super().__init__(message, host=host, fault=fault)


class HostKeyError(HostMisconfigured):
    """The host's key is unknown or has changed: permanent (never retried as transient), the host dropped."""

    def __init__(self, message: str, *, host: str | None = None, fault: str = "host_key") -> None:
        super().__init__(message, host=host, fault=fault)


class NotOurProcess(RunnerError):
    """A process group failed the ownership check; servetune will not signal it."""


# ---- one line of an error ----------------------------------------------------------------------------


def first_line(error: object) -> str:
    """The first line of ``str(error)`` (stripped), or the error's type name when that is empty."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def validation_line(exc: object) -> tuple[str, str]:
    """``(where, message)`` of a pydantic ``ValidationError``'s first error: the dotted location of the
    value (empty at the top level) and pydantic's message without its ``Value error, `` prefix."""
    errors = exc.errors() if hasattr(exc, "errors") else []
    if not errors:
        return "", first_line(exc)
    first = errors[0]
    where = ".".join(str(part) for part in first.get("loc", ()))
    return where, str(first.get("msg", "")).removeprefix("Value error, ")


def did_you_mean(word: str, allowed: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the allowed name closest to a misspelt ``word``, or ``""`` when none is
    close (``difflib``'s ratio of 0.6 or more); appended to an "unknown key" line."""
    close = difflib.get_close_matches(word, [str(a) for a in allowed], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
