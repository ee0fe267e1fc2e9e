"""Controllers sharing a host: a **lease** per controller (one file under ``<runs_root>/.servetune/leases``,
renewed by the controller's heartbeat) and a **claim** that one controller holds for one trial at a time,
so two controllers on one host take turns. A claim whose controller has no live lease is taken over."""

from __future__ import annotations

import functools
import json
import os
import socket
import uuid
from dataclasses import asdict, dataclass

from runners.errors import HostUnreachable, RunnerError
from runners.host.shell import Shell, plain_name

LEASE_DIR = ".servetune/leases"
CLAIM_DIR = ".servetune/claim"


def new_controller_id() -> str:
    """A fresh id for one controller (one ``run_search``): this machine's name, pid and a random part."""
    return f"{plain_name(socket.gethostname())}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@functools.cache
def default_controller_id() -> str:
    """The controller id of every Host of this process that no controller has named (a Host used alone)."""
    return new_controller_id()


@dataclass(frozen=True)
class Lease:
    """A controller's lease on a host: who it is and where it runs, what it works on, its last heartbeat.

    ``heartbeat`` is the host's clock (seconds since the epoch) at the last renewal and ``ttl`` how long the
    lease lasts without one; ``storage`` is the study's storage URL with any password taken out.
    """

    controller: str
    pid: int
    hostname: str
    study: str
    storage: str
    ttl: float
    heartbeat: float = 0.0

    def expired(self, host_now: float) -> bool:
        return host_now > self.heartbeat + self.ttl

    def live(self, host_now: float) -> bool:
        """Not expired, and (when its controller runs on this machine) its controller process exists."""
        if self.expired(host_now):
            return False
        if self.hostname == socket.gethostname():
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
        return True

    def describe(self) -> str:
        return f"controller {self.controller} (pid {self.pid} on {self.hostname}, study {self.study})"


@dataclass(frozen=True)
class Claim:
    """The result of :func:`claim`: ``ok`` (the host is ours for a trial) or who holds it."""

    ok: bool
    holder: Lease | None = None
    reason: str = ""


def _check_controller(controller: str) -> None:
    if controller != plain_name(controller):
        raise ValueError(f"controller id {controller!r} is not a plain name")


def renew(shell: Shell, lease: Lease, *, timeout: float = 15.0) -> None:
    """Write (or renew) ``lease`` with the host's current time as its heartbeat."""
    _check_controller(lease.controller)
    head = json.dumps({k: v for k, v in asdict(lease).items() if k != "heartbeat"})[:-1] + ', "heartbeat": '
    res = shell.run_script("write_lease.sh", f"{shell.runs_root}/{LEASE_DIR}", lease.controller, head,
                           timeout=timeout)
    if not res.ok:
        raise RunnerError(f"cannot write the lease on {shell.name}: {res.stderr.strip()[:200]}", host=shell.name)


def drop(shell: Shell, controller: str, *, timeout: float = 15.0) -> None:
    """Remove ``controller``'s lease, and its claim on the host if it holds one."""
    _check_controller(controller)
    shell.run_script("drop_lease.sh", f"{shell.runs_root}/{LEASE_DIR}", f"{shell.runs_root}/{CLAIM_DIR}",
                     controller, timeout=timeout)


def read_all(shell: Shell, *, timeout: float = 15.0) -> tuple[float, list[Lease]]:
    """The host's clock and every lease on it (unreadable files skipped)."""
    res = shell.run_script("leases.sh", f"{shell.runs_root}/{LEASE_DIR}", timeout=timeout)
    lines = res.stdout.splitlines()
    try:
        now = float(lines[0])
    except (IndexError, ValueError):
        raise HostUnreachable(f"cannot read the leases on {shell.name}: {res.stderr.strip()[:200]}",
                              host=shell.name) from None
    out = []
    for line in lines[1:]:
        try:
            data = json.loads(line)
            out.append(Lease(**{k: data[k] for k in Lease.__dataclass_fields__}))
        except (ValueError, TypeError, KeyError):
            continue
    return now, out


def live(shell: Shell) -> list[Lease]:
    now, leases = read_all(shell)
    return [lease for lease in leases if lease.live(now)]


def holder(shell: Shell) -> Lease | None:
    """The lease of the controller that holds the host's claim now (None: nobody, or a dead one)."""
    res = shell.run(f"cat {shell.shell_path(f'{shell.runs_root}/{CLAIM_DIR}')}/controller 2>/dev/null; true",
                    timeout=15)
    who = res.stdout.strip()
    if not who:
        return None
    return next((lease for lease in live(shell) if lease.controller == who), None)


def claim(shell: Shell, controller: str, *, timeout: float = 15.0) -> Claim:
    """Claim the host for one trial of ``controller``. When another live controller holds it, nothing is
    touched and the result names it."""
    now, leases = read_all(shell, timeout=timeout)
    others = [lease for lease in leases if lease.live(now) and lease.controller != controller]
    res = shell.run_script("claim.sh", f"{shell.runs_root}/{CLAIM_DIR}", controller,
                           *(lease.controller for lease in others), timeout=timeout)
    out = res.stdout.strip()
    if out == "ok":
        return Claim(True)
    if not out.startswith("held "):
        raise RunnerError(f"cannot claim {shell.name}: {res.stderr.strip()[:200]}", host=shell.name)
    who = out.removeprefix("held ")
    found = next((lease for lease in others if lease.controller == who), None)
    what = found.describe() if found else f"controller {who}"
    return Claim(False, found, f"{shell.name} is held by {what}")


def release(shell: Shell, controller: str, *, timeout: float = 15.0) -> None:
    """Give the host's claim back (only if ``controller`` holds it)."""
    shell.run_script("release_claim.sh", f"{shell.runs_root}/{CLAIM_DIR}", controller, timeout=timeout)
