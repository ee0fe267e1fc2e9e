"""A :class:`~runners.transport.Transport` to a remote host over SSH, on paramiko.

What it promises:

* **Keys only.** Authentication tries, in order, an explicit key file, the ``IdentityFile`` entries of the
  user's ``~/.ssh/config``, the keys of the ssh-agent (unless ``IdentitiesOnly yes``) and, when no key file
  is named anywhere, ``~/.ssh/id_{ed25519,ecdsa,rsa}``. ``User``, ``Port``, ``HostName``, ``IdentityFile``
  and ``ProxyJump`` (a ``direct-tcpip`` channel through each jump host) are read from the config.
* **Host keys are checked**, against ``~/.ssh/known_hosts`` or a given file. An unknown key is refused
  with a message saying how to accept it, unless ``accept_new_host_key=True``, which appends it to the
  file. A changed key is always refused.
* **One error boundary**: :func:`ssh_errors` is where paramiko and socket errors become
  :mod:`runners.errors` (``NoValidConnectionsError`` is a ``socket.error``, not an ``SSHException``).
* **Lazy reconnect**: every call first checks the connection; a dead one is reopened once, and if that
  fails the call raises :class:`~runners.errors.HostUnreachable`.
* ``run`` kills the remote command when its timeout passes (a remote ``timeout -s KILL`` backstop,
  since closing a channel does not kill what runs in it); ``stream`` uses a pty so that closing it
  hangs up the remote command; ``put`` writes through SFTP to a temporary name and renames it.
"""

from __future__ import annotations

import getpass
import os
import select
import shlex
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from types import TracebackType

import paramiko
from paramiko.hostkeys import HostKeyEntry
from paramiko.ssh_exception import (
    AuthenticationException,
    BadAuthenticationType,
    BadHostKeyException,
    NoValidConnectionsError,
    SSHException,
)

from runners.errors import AuthError, ConfigError, HostKeyError, HostMisconfigured, HostUnreachable, RunnerError
from runners.transport import CommandResult, LineStream, command_timeout

__all__ = ["DEFAULT_KNOWN_HOSTS", "DEFAULT_SSH_CONFIG", "SSHTransport", "ssh_errors"]

DEFAULT_SSH_CONFIG = "~/.ssh/config"
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
_DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
_MAX_JUMPS = 8
# Seconds the remote backstop waits past a command's own timeout before it SIGKILLs the command's group.
_BACKSTOP_S = 1.0


@contextmanager
def ssh_errors(host: str, action: str = "connect", *, target: str | None = None) -> Iterator[None]:
    """Map paramiko and socket errors raised inside the block into :mod:`runners.errors`.

    ``host`` is the servetune host the error belongs to; ``target`` the server the message names (a jump
    host, or ``user@address:port``), by default ``host``.
    """
    where = target or host
    try:
        yield
    except RunnerError:
        raise
    except BadHostKeyException as exc:
        raise HostKeyError(
            f"host key for {where} has changed (server offers {exc.key.get_name()} {exc.key.fingerprint}, "
            f"known_hosts has {exc.expected_key.fingerprint}); refusing to connect",
            host=host,
        ) from exc
    except AuthenticationException as exc:
        raise AuthError(f"authentication to {where} failed: {exc}", host=host) from exc
    except TimeoutError as exc:  # socket.timeout
        raise HostUnreachable(f"{where}: timed out ({action})", host=host) from exc
    except NoValidConnectionsError as exc:
        raise HostUnreachable(f"{where}: connection refused or unreachable ({action})", host=host) from exc
    except ConnectionRefusedError as exc:
        raise HostUnreachable(f"{where}: connection refused ({action})", host=host) from exc
    except (EOFError, SSHException, OSError) as exc:
        detail = str(exc) or type(exc).__name__
        raise HostUnreachable(f"{where}: {action} failed: {detail}", host=host) from exc


@dataclass(frozen=True)
class _Endpoint:
    """One SSH server to reach, after ``~/.ssh/config`` has been applied."""

    alias: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    proxy_jump: tuple[str, ...]
    identities_only: bool = False

    @property
    def known_hosts_name(self) -> str:
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    def __str__(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"


@dataclass
class _Connection:
    transport: paramiko.Transport
    jumps: list[paramiko.Transport] = field(default_factory=list)
    sftp: paramiko.SFTPClient | None = None

    def close(self) -> None:
        if self.sftp is not None:
            with suppress(OSError, EOFError, SSHException):
                self.sftp.close()
        for t in [self.transport, *reversed(self.jumps)]:
            t.close()


def _split_user_host_port(text: str) -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` (``[v6]:port`` allowed) -> parts; used for ProxyJump hops."""
    user, _, rest = text.rpartition("@")
    port: int | None = None
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        if tail.startswith(":") and tail[1:].isdigit():
            port = int(tail[1:])
    else:
        host, sep, p = rest.partition(":")
        if sep and p.isdigit():
            port = int(p)
    return (user or None), host, port


class SSHTransport:
    """Runs commands on one host over SSH (paramiko); see the module docstring for what it promises.

    ``address`` is a host name, an address or a ``~/.ssh/config`` alias; ``port``, ``user`` and
    ``key_file`` override the config. ``ssh_config=None`` ignores the config file.
    """

    def __init__(
        self,
        address: str,
        *,
        name: str | None = None,
        port: int | None = None,
        user: str | None = None,
        key_file: str | None = None,
        known_hosts: str | None = None,
        ssh_config: str | None = DEFAULT_SSH_CONFIG,
        accept_new_host_key: bool = False,
        use_agent: bool = True,
        connect_timeout: float = 10.0,
        keepalive: int = 15,
    ) -> None:
        self.address = address
        self.name = name or address
        self.port = port
        self.user = user
        self.key_file = key_file
        self.known_hosts = os.path.expanduser(known_hosts or DEFAULT_KNOWN_HOSTS)
        self.accept_new_host_key = accept_new_host_key
        self.use_agent = use_agent
        self.connect_timeout = connect_timeout
        self.keepalive = keepalive
        self._config = self._load_config(ssh_config)
        self._lock = threading.RLock()
        self._conn: _Connection | None = None

    def __repr__(self) -> str:
        return f"SSHTransport({self.name!r}, address={self.address!r})"

    def __enter__(self) -> SSHTransport:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ---- configuration --------------------------------------------------------------------------

    @staticmethod
    def _load_config(path: str | None) -> paramiko.SSHConfig | None:
        if path is None:
            return None
        full = os.path.expanduser(path)
        if not os.path.isfile(full):
            return None
        try:
            return paramiko.SSHConfig.from_path(full)
        except (OSError, SSHException) as exc:
            raise ConfigError(f"cannot read ssh config {full}: {exc}") from exc

    def _endpoint(self) -> _Endpoint:
        """Where this transport connects, with the config applied."""
        return self._resolve(self.address, self.port, self.user, self.key_file)

    def _resolve(self, alias: str, port: int | None, user: str | None, key_file: str | None) -> _Endpoint:
        opts = self._config.lookup(alias) if self._config is not None else {}
        files = [key_file] if key_file else []
        files += list(opts.get("identityfile", []))
        jump = str(opts.get("proxyjump", "")).strip()
        hops = () if jump.lower() in ("", "none") else tuple(h.strip() for h in jump.split(",") if h.strip())
        return _Endpoint(
            alias=alias,
            hostname=str(opts.get("hostname", alias)),
            port=port or int(opts.get("port", 22)),
            user=user or str(opts.get("user", "")) or getpass.getuser(),
            identity_files=tuple(os.path.expanduser(f) for f in files),
            proxy_jump=hops,
            identities_only=str(opts.get("identitiesonly", "no")).lower() == "yes",
        )

    # ---- connecting -----------------------------------------------------------------------------

    def _connection(self) -> _Connection:
        """The live connection, reconnecting once if the last one died."""
        with self._lock:
            if self._conn is not None and self._conn.transport.is_active():
                return self._conn
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            self._conn = self._connect()
            return self._conn

    def _connect(self) -> _Connection:
        target = self._endpoint()
        chain: list[_Endpoint] = []
        self._add_jumps(target, chain, depth=0)
        opened: list[paramiko.Transport] = []
        try:
            for ep in [*chain, target]:
                opened.append(self._open_transport(ep, opened[-1] if opened else None))
        except BaseException:
            for t in reversed(opened):
                t.close()
            raise
        return _Connection(transport=opened[-1], jumps=opened[:-1])

    def _add_jumps(self, ep: _Endpoint, chain: list[_Endpoint], depth: int) -> None:
        if depth > _MAX_JUMPS:
            raise HostUnreachable(f"{self.name}: ProxyJump chain over {_MAX_JUMPS} hops", host=self.name)
        for hop in ep.proxy_jump:
            user, host, port = _split_user_host_port(hop)
            jump = self._resolve(host, port, user, None)
            self._add_jumps(jump, chain, depth + 1)
            chain.append(jump)

    def _open_transport(self, ep: _Endpoint, via: paramiko.Transport | None) -> paramiko.Transport:
        with ssh_errors(self.name, "connect", target=str(ep)):
            if via is None:
                tcp = socket.create_connection((ep.hostname, ep.port), timeout=self.connect_timeout)
                # Commands are small request/response exchanges: do not let Nagle hold them back.
                tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock: socket.socket | paramiko.Channel = tcp
            else:
                sock = via.open_channel(
                    "direct-tcpip", (ep.hostname, ep.port), ("127.0.0.1", 0), timeout=self.connect_timeout
                )
            t = paramiko.Transport(sock)
            try:
                t.banner_timeout = self.connect_timeout
                t.auth_timeout = self.connect_timeout
                known = self._known_hosts().lookup(ep.known_hosts_name)
                if known is not None:
                    _prefer_key_types(t, list(known.keys()))
                t.start_client(timeout=self.connect_timeout)
                self._check_host_key(t, ep, known)
                self._authenticate(t, ep)
                t.set_keepalive(self.keepalive)
            except BaseException:
                t.close()
                raise
            return t

    def _known_hosts(self) -> paramiko.HostKeys:
        keys = paramiko.HostKeys()
        if os.path.isfile(self.known_hosts):
            keys.load(self.known_hosts)
        return keys

    def _check_host_key(
        self, t: paramiko.Transport, ep: _Endpoint, known: Mapping[str, paramiko.PKey] | None
    ) -> None:
        """Check the server's key against ``known``, the known_hosts entries of ``ep`` (None: none)."""
        key = t.get_remote_server_key()
        name = ep.known_hosts_name
        if known is None or len(known) == 0:
            if self.accept_new_host_key:
                self._append_known_host(name, key)
                return
            raise HostKeyError(
                f"unknown host key for {name} ({key.get_name()} {key.fingerprint}), "
                f"not in {self.known_hosts}; "
                f"to accept it, check the fingerprint and run "
                f"`ssh-keyscan -p {ep.port} {ep.hostname} >> {self.known_hosts}`, "
                f"or set accept_new_host_key: true for this host",
                host=self.name,
            )
        if known.get(key.get_name()) == key:
            return
        old = ", ".join(f"{k.get_name()} {k.fingerprint}" for k in known.values())
        raise HostKeyError(
            f"host key for {name} has changed (server offers {key.get_name()} {key.fingerprint}, "
            f"{self.known_hosts} has {old}); refusing to connect. If the host was reinstalled, remove the "
            f"old key with `ssh-keygen -R '{name}' -f {self.known_hosts}`",
            host=self.name,
        )

    def _append_known_host(self, name: str, key: paramiko.PKey) -> None:
        line = HostKeyEntry([name], key).to_line() or ""
        os.makedirs(os.path.dirname(self.known_hosts) or ".", mode=0o700, exist_ok=True)
        fd = os.open(self.known_hosts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as fh:
            if fh.tell() > 0:
                with open(self.known_hosts, "rb") as check:
                    check.seek(-1, os.SEEK_END)
                    if check.read(1) != b"\n":
                        fh.write("\n")
            fh.write(line)

    def _authenticate(self, t: paramiko.Transport, ep: _Endpoint) -> None:
        tried: list[str] = []

        def key_file_accepted(path: str) -> bool:
            """Offer the key in ``path``; note it (and why it could not be loaded) in ``tried`` if refused."""
            key, why = _load_key(path)
            if key is None:
                tried.append(f"{path} ({why})")
                return False
            if _try_key(t, ep, key):
                return True
            tried.append(path)
            return False

        files = list(ep.identity_files)
        if any(key_file_accepted(path) for path in files):
            return
        if self.use_agent and not ep.identities_only and self._agent_key_accepted(t, ep, tried):
            return
        if not files:
            for path in map(os.path.expanduser, _DEFAULT_IDENTITIES):
                if os.path.isfile(path) and key_file_accepted(path):
                    return
        what = ", ".join(tried) if tried else "no key file, no agent key, no ~/.ssh/id_* key found"
        raise AuthError(f"{ep}: no key was accepted (tried {what})", host=self.name)

    @staticmethod
    def _agent_key_accepted(t: paramiko.Transport, ep: _Endpoint, tried: list[str]) -> bool:
        """Offer the SSH agent's keys; note how many were refused in ``tried``."""
        agent = paramiko.Agent()
        try:
            agent_keys = agent.get_keys()
            if any(_try_key(t, ep, agent_key) for agent_key in agent_keys):
                return True
            if agent_keys:
                tried.append(f"{len(agent_keys)} agent key(s)")
            return False
        finally:
            agent.close()

    # ---- channels -------------------------------------------------------------------------------

    def _session(self, action: str) -> paramiko.Channel:
        """Open a session channel, reconnecting once if the connection turns out to be dead."""
        with ssh_errors(self.name, action):
            conn = self._connection()
            try:
                return conn.transport.open_session(timeout=self.connect_timeout)
            except (SSHException, EOFError, OSError):
                if conn.transport.is_active():
                    raise
            with self._lock:
                if self._conn is conn:
                    conn.close()
                    self._conn = None
            return self._connection().transport.open_session(timeout=self.connect_timeout)

    def run(self, command: str, *, timeout: float = 30.0, stdin: bytes | None = None) -> CommandResult:
        chan = self._session("run")
        remote = f"timeout -s KILL {timeout + _BACKSTOP_S:.3f} bash --norc -c {shlex.quote(command)}"
        out: list[bytes] = []
        err: list[bytes] = []
        try:
            with ssh_errors(self.name, "run"):
                chan.exec_command(remote)
                if stdin:
                    chan.settimeout(timeout)
                    try:
                        chan.sendall(stdin)
                    except TimeoutError:
                        raise command_timeout(self.name, timeout, command) from None
                chan.shutdown_write()
                rc = self._collect(chan, out, err, timeout, command)
        finally:
            chan.close()
        text = b"".join(out).decode(errors="replace")
        return CommandResult(rc, text, b"".join(err).decode(errors="replace"))

    def _collect(
        self, chan: paramiko.Channel, out: list[bytes], err: list[bytes], timeout: float, command: str
    ) -> int:
        deadline = time.monotonic() + timeout

        def drain() -> None:
            while chan.recv_ready():
                out.append(chan.recv(65536))
            while chan.recv_stderr_ready():
                err.append(chan.recv_stderr(65536))

        while True:
            drain()
            if _exit_status(chan) is not None and chan.eof_received:
                break
            if chan.closed or not chan.get_transport().is_active():
                break
            left = deadline - time.monotonic()
            if left <= 0:
                raise command_timeout(self.name, timeout, command)
            if chan.eof_received:
                # Both streams are at EOF; the exit status follows.
                chan.status_event.wait(min(left, 0.5))
            else:
                select.select([chan], [], [], min(left, 1.0))
        drain()
        rc = _exit_status(chan)
        if rc is not None:
            return rc
        transport = chan.get_transport()
        if chan.eof_received:
            # An orderly close without exit status is a death by signal (paramiko ignores exit-signal),
            # unless the connection is going down right now: give its thread a moment to say so.
            transport.join(0.2)
        if not chan.eof_received or not transport.is_active():
            # A dropped connection closes channels without EOF.
            raise HostUnreachable(f"connection to {self.name} dropped during a command", host=self.name)
        return -1

    def stream(self, command: str) -> LineStream:
        chan = self._session("stream")
        try:
            with ssh_errors(self.name, "stream"):
                chan.get_pty(width=4096)
                chan.exec_command(f"exec bash --norc -c {shlex.quote(command)} </dev/null 2>/dev/null")
        except BaseException:
            chan.close()
            raise
        return _ChannelStream(chan)

    def put(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        if path.startswith("~/"):
            path = path[2:]  # SFTP paths are relative to the home directory
        tmp = f"{path}.servetune-{uuid.uuid4().hex[:8]}.tmp"
        with self._lock, ssh_errors(self.name, "put"):
            sftp = self._sftp()
            try:
                with sftp.open(tmp, "wb") as fh:
                    fh.write(data)
                sftp.chmod(tmp, mode)
                sftp.posix_rename(tmp, path)
            except OSError as exc:
                sftp_chan = sftp.get_channel()
                if sftp_chan is None or not sftp_chan.get_transport().is_active():
                    raise  # the connection went: ssh_errors makes it HostUnreachable
                with suppress(OSError):
                    sftp.remove(tmp)
                raise RunnerError(f"cannot write {path} on {self.name}: {exc}", host=self.name) from exc

    def _sftp(self) -> paramiko.SFTPClient:
        conn = self._connection()
        chan = conn.sftp.get_channel() if conn.sftp is not None else None
        if conn.sftp is None or chan is None or chan.closed:
            try:
                sftp = paramiko.SFTPClient.from_transport(conn.transport)
            except (SSHException, EOFError) as exc:
                if not conn.transport.is_active():
                    raise  # the connection went: ssh_errors makes it HostUnreachable
                # The connection is up but the server refused the "sftp" subsystem: a set-up fault.
                raise HostMisconfigured(
                    f"{self.name}: the SSH server has no SFTP subsystem ({exc or type(exc).__name__}); fix: "
                    "enable 'Subsystem sftp' in its sshd_config", host=self.name, fault="no_sftp") from exc
            if sftp is None:
                raise HostUnreachable(f"{self.name}: cannot open SFTP", host=self.name)
            conn.sftp = sftp
        return conn.sftp

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class _ChannelStream:
    """Lines of a remote command run on a pty. A dropped connection ends iteration with exit_code None."""

    def __init__(self, chan: paramiko.Channel) -> None:
        self._chan = chan
        self._closed = False
        self.exit_code: int | None = None

    def __iter__(self) -> Iterator[str]:
        chan = self._chan
        chan.settimeout(0.5)
        buf = b""
        while True:
            try:
                data = chan.recv(65536)
            except TimeoutError:
                if chan.get_transport().is_active():
                    continue
                break
            except (OSError, EOFError, SSHException):
                break
            if not data:
                break
            buf += data
            *complete, buf = buf.split(b"\n")
            for raw in complete:
                yield raw.decode(errors="replace").rstrip("\r")
        if buf and not self._closed:
            yield buf.decode(errors="replace").rstrip("\r")
        while _exit_status(chan) is None and not chan.closed and chan.get_transport().is_active():
            chan.status_event.wait(0.5)
        if not self._closed:
            self.exit_code = _exit_status(chan)
        chan.close()

    def close(self) -> None:
        self._closed = True
        self._chan.close()

    def __enter__(self) -> _ChannelStream:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _exit_status(chan: paramiko.Channel) -> int | None:
    """The exit status the server sent, or None. (``exit_status_ready()`` is also true for a channel
    closed by a dropped connection, with a made-up -1.)"""
    return chan.exit_status if chan.exit_status >= 0 else None


def _prefer_key_types(t: paramiko.Transport, known_types: list[str]) -> None:
    """Ask for the host key types known_hosts already holds, so a known host is not seen as changed."""
    want: list[str] = []
    for kt in known_types:
        want += ["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"] if kt == "ssh-rsa" else [kt]
    opts = t.get_security_options()
    supported = list(opts.key_types)
    first = [k for k in want if k in supported]
    opts.key_types = first + [k for k in supported if k not in first]


def _load_key(path: str) -> tuple[paramiko.PKey | None, str]:
    if not os.path.isfile(path):
        return None, "not found"
    try:
        return paramiko.PKey.from_path(path), ""
    except paramiko.PasswordRequiredException:
        return None, "encrypted: load it into ssh-agent"
    except (OSError, SSHException, ValueError) as exc:
        return None, f"unreadable: {exc}"


def _try_key(t: paramiko.Transport, ep: _Endpoint, key: paramiko.PKey) -> bool:
    try:
        t.auth_publickey(ep.user, key)
    except BadAuthenticationType as exc:
        raise AuthError(f"{ep}: the server does not accept keys (allowed: {', '.join(exc.allowed_types)})",
                        host=ep.alias) from exc
    except AuthenticationException:
        return False
    return t.is_authenticated()
