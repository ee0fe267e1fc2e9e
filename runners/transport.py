"""The seam between servetune and a host: run a shell command, stream one, put a file.

Everything servetune does on a GPU host (preflight, starting a detached server, following its log,
signalling its process group, nvidia-smi) is written once in :mod:`runners.host` on top of this small
protocol. :class:`LocalTransport` runs commands on this machine; ``runners.ssh.SSHTransport`` runs them
on a remote host through paramiko. Both run the same shell text, so the local runner is the SSH runner
minus the network.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from runners.errors import CommandTimeout, HostMisconfigured


def command_timeout(host: str, timeout: float, command: str) -> CommandTimeout:
    """The error every transport raises when ``command`` outlives its ``timeout`` on ``host``: one line, with
    the command's first line cut to 120 characters (a script's text is never dumped)."""
    lines = command.strip().splitlines() or [""]
    shown = lines[0][:120] + (" ..." if len(lines) > 1 or len(lines[0]) > 120 else "")
    return CommandTimeout(f"command timed out after {timeout:g}s on {host}: {shlex.quote(shown)}", host=host)


@dataclass(frozen=True)
class CommandResult:
    """Exit status and output of one command."""

    rc: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.rc == 0


@runtime_checkable
class LineStream(Protocol):
    """Lines of a long-running command's stdout, live. Iterating ends when the command ends or
    :meth:`close` is called; :attr:`exit_code` is then known (None if it was closed or lost)."""

    exit_code: int | None

    def __iter__(self) -> Iterator[str]: ...

    def close(self) -> None: ...


@runtime_checkable
class Transport(Protocol):
    """How servetune reaches one host. Implementations map their own errors into :mod:`runners.errors`."""

    name: str

    def run(self, command: str, *, timeout: float = 30.0, stdin: bytes | None = None) -> CommandResult:
        """Run ``command`` with ``bash -c`` on the host; raise CommandTimeout/HostUnreachable on trouble."""
        ...

    def stream(self, command: str) -> LineStream:
        """Start ``command`` and yield its stdout lines as they come."""
        ...

    def put(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        """Write ``data`` to ``path`` on the host (parent directories must exist)."""
        ...

    def close(self) -> None: ...


class _PopenStream:
    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self._proc = proc
        self.exit_code: int | None = None
        self._closed = False

    def __iter__(self) -> Iterator[str]:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            yield line.rstrip("\n")
        self._proc.wait()
        self._proc.stdout.close()
        if not self._closed:
            self.exit_code = self._proc.returncode

    def close(self) -> None:
        self._closed = True
        if self._proc.poll() is None:
            # The stream command runs in its own process group: stop exactly that group.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


class LocalTransport:
    """Runs commands on this machine with bash, each in its own session and process group."""

    def __init__(self, name: str = "local") -> None:
        self.name = name

    def run(self, command: str, *, timeout: float = 30.0, stdin: bytes | None = None) -> CommandResult:
        proc = subprocess.Popen(
            ["bash", "-c", command],
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise command_timeout(self.name, timeout, command) from None
        return CommandResult(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))

    def stream(self, command: str) -> LineStream:
        proc = subprocess.Popen(
            ["bash", "-c", command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,
        )
        return _PopenStream(proc)

    def put(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        """Write ``data`` to ``path`` atomically. A file system that refuses (full, read-only, no permission)
        raises HostMisconfigured, one line naming the file: waiting will not fix it, a person must."""
        path = os.path.expanduser(path)
        tmp = f"{path}.tmp{os.getpid()}"
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise HostMisconfigured(f"{self.name}: cannot write {path}: {exc.strerror or exc}; fix: free space "
                                    "there or point runs_root elsewhere", host=self.name, fault="runs_root") from None

    def close(self) -> None:
        pass
