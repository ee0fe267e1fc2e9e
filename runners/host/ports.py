"""The server's port on a host: a free loopback port for each launch (this machine only), and who listens on
a port now (free, a member of our server's process group, or a foreign program), from ``/proc/net/tcp``."""

from __future__ import annotations

import shlex
import socket
from typing import Literal

from runners.errors import ConfigError, HostBusy, HostMisconfigured
from runners.host.runs import RunRef
from runners.host.shell import Shell
from runners.transport import LocalTransport

#: ``Host.server_port`` for "a free loopback port for each launch" (this machine only).
ANY_FREE_PORT = 0

Holder = Literal["free", "ours", "foreign", "unknown"]
_HOLDERS: tuple[Holder, ...] = ("free", "ours", "foreign", "unknown")


def launch_port(shell: Shell, server_port: int | None) -> int | None:
    """The port the next server binds: None (the space's), ``server_port``, or for :data:`ANY_FREE_PORT` a free
    one just picked (a port taken between the pick and the bind is ``port_in_use``)."""
    if server_port != ANY_FREE_PORT:
        return server_port
    if not isinstance(shell.transport, LocalTransport):
        raise ConfigError(f"{shell.name}: server_port 0 (any free port) works only on this machine")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def holder(shell: Shell, port: int, ref: RunRef | None = None, *, timeout: float = 15.0) -> Holder:
    """Who listens on ``port`` on the host: ``free``, ``ours`` (a member of ``ref``'s process group),
    ``foreign``, or ``unknown`` (no /proc/net/tcp to read)."""
    res = shell.run_script("port_holder.sh", int(port), ref.pgid if ref else 0, timeout=timeout)
    out = res.stdout.strip().splitlines()
    return next((h for h in _HOLDERS if out and out[-1] == h), "unknown")


def require_free(shell: Shell, port: int) -> None:
    """HostBusy when another program listens on ``port`` (checked before every launch)."""
    if holder(shell, port) == "foreign":
        raise HostBusy(f"port {port} on {shell.name} is held by another program; the trial waits for it",
                       host=shell.name)


def free_port_on(shell: Shell, python: str, address: str, *, timeout: float = 20.0) -> int:
    """A port nothing listens on at ``address`` on the host right now (bound there, then released), asked of
    the host's ``python``: the dist-init port of a server spanning nodes is picked free on its head."""
    code = "import socket,sys; s=socket.socket(); s.bind((sys.argv[1], 0)); print(s.getsockname()[1])"
    res = shell.run(f"{shlex.quote(python)} -c {shlex.quote(code)} {shlex.quote(address)}", timeout=timeout)
    out = res.stdout.strip().splitlines()
    if res.rc != 0 or not out or not out[-1].isdigit():
        raise HostMisconfigured(f"{shell.name}: cannot pick a free port on {address} "
                                f"({(res.stderr.strip().splitlines() or ['no output'])[-1]})", host=shell.name)
    return int(out[-1])
