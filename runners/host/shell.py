"""The command line of a host, which every other part of :mod:`runners.host` goes through: a transport, the
environment exported before each command, where runs live, and the shipped scripts run with quoted values."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping

from runners.errors import CommandTimeout
from runners.host.shipped import command as script_command
from runners.transport import CommandResult, LineStream, Transport, command_timeout

DEFAULT_HOST_DIR = "/var/tmp/servetune"
"""Where controllers keep their leases and the claim of a host's GPUs (:mod:`runners.host.leases`): one folder
per machine for every Unix user and runs root, made shared (mode 1777) by the first controller there."""

_ENV_REF = re.compile(r"\$(?:([A-Za-z_][A-Za-z0-9_]*)|\{([A-Za-z_][A-Za-z0-9_]*)\})")


def plain_name(part: str) -> str:
    """``part`` as one safe path component: letters, digits, ``-``, ``_`` and ``.``; anything else becomes ``_``."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in part) or "_"


def env_value(value: str) -> str:
    """A host env value as shell text: ``$NAME`` and ``${NAME}`` expand (``PATH=/x:$PATH``); everything else,
    ``$(...)``, backquotes, ``$1`` and ``${X:-...}`` included, is quoted literally, so nothing runs."""
    parts: list[str] = []
    pos = 0
    for ref in _ENV_REF.finditer(value):
        if ref.start() > pos:
            parts.append(shlex.quote(value[pos:ref.start()]))
        parts.append('"${' + (ref.group(1) or ref.group(2)) + '}"')
        pos = ref.end()
    if pos < len(value) or not parts:
        parts.append(shlex.quote(value[pos:]))
    return "".join(parts)


class Shell:
    """Runs commands and shipped scripts on one host with its environment (``env``, e.g. PATH for a simulated
    host's nvidia-smi) exported first; ``runs_root`` is where run directories live, ``host_dir`` where the
    leases and the claim of the host's GPUs live (:mod:`runners.host.leases`), whatever the runs root."""

    def __init__(self, transport: Transport, *, runs_root: str, env: Mapping[str, str] | None = None,
                 host_dir: str = DEFAULT_HOST_DIR) -> None:
        self.transport = transport
        self.name = transport.name
        self.runs_root = runs_root.rstrip("/")
        self.env = dict(env or {})
        self.host_dir = host_dir.rstrip("/") or "/"
        #: The GPU set's folder under ``host_dir`` per environment (a simulated host's GPUs are its PATH).
        self.gpu_dirs: dict[tuple[tuple[str, str], ...], str] = {}
        #: Lease files already reported as ignored (each is said once per host object).
        self.reported: set[str] = set()

    def _prefix(self) -> str:
        return "".join(f"export {k}={env_value(v)}; " for k, v in self.env.items())

    def run(self, command: str, *, timeout: float = 30.0) -> CommandResult:
        try:
            return self.transport.run(self._prefix() + command, timeout=timeout)
        except CommandTimeout:  # said without the environment exported before the command
            raise command_timeout(self.name, timeout, command) from None

    def stream(self, command: str) -> LineStream:
        return self.transport.stream(self._prefix() + command)

    def run_script(self, name: str, *args: str | int, timeout: float = 30.0) -> CommandResult:
        """Run shipped script ``name`` (:mod:`runners.host.shipped`) with ``args`` as its parameters. A timeout
        names the script, never its text."""
        try:
            return self.run(script_command(name, *args), timeout=timeout)
        except CommandTimeout:
            raise CommandTimeout(f"the host script {name} did not finish within {timeout:g}s on {self.name}",
                                 host=self.name) from None

    def stream_script(self, name: str, *args: str | int) -> LineStream:
        """Stream the stdout lines of shipped script ``name`` run with ``args``."""
        return self.stream(script_command(name, *args))

    def put(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        self.transport.put(path, data, mode=mode)

    def shell_path(self, path: str) -> str:
        """A host path for shell use: ``~`` expanded by the shell, the rest quoted."""
        if path.startswith("~/"):
            return '"$HOME"/' + shlex.quote(path[2:])
        return shlex.quote(path)

    def resolve(self, path: str) -> str:
        """Absolute form of a host path (``~`` expanded on the host)."""
        if not path.startswith("~"):
            return path
        res = self.run(f"echo {self.shell_path(path)}", timeout=15)
        return res.stdout.strip()
