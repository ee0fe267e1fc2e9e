"""Controllers sharing a host: a **lease** per controller (renewed by the controller's heartbeat), a **claim**
that one controller holds for one trial at a time, and a **queue** of the controllers waiting for it, so two
controllers on one host take turns, first come, first served.

All three live in one folder per host and GPU set, whatever the runs root or Unix user:
``<host_dir>/gpus-<hash of the GPUs' UUIDs>`` (``host_dir`` is ``/var/tmp/servetune`` unless set; the folder
is made writable for every user, so two people's controllers see each other). A controller is known by its
machine id, PID namespace, PID and process start time: on the same machine and namespace a lease whose process
is gone (or is another process under a reused PID) is dead at once; from another machine or namespace only
the lease's expiry tells, never the PID alone.

Everything read back is data: a lease file of the wrong shape is ignored with one line naming it, and a
heartbeat in the host's future (a clock stepped back, a forged file) is capped at the host's now (it then
expires ``ttl`` later unless its controller renews it).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import socket
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from runners.errors import HostMisconfigured, HostUnreachable, RunnerError
from runners.host.shell import Shell, plain_name
from runners.printable import printable

__all__ = ["CLAIM_DIR", "LEASE_DIR", "MAX_PID", "MAX_TTL", "QUEUE_DIR", "Claim", "Lease", "claim", "drop",
           "gpu_dir", "here", "holder", "live", "new_controller_id", "parse_lease", "read_all", "release",
           "renew"]

log = logging.getLogger("servetune")

LEASE_DIR = "leases"
CLAIM_DIR = "claim"
QUEUE_DIR = "queue"
#: The largest PID Linux hands out (``/proc/sys/kernel/pid_max`` is at most 2**22).
MAX_PID = 2**22
#: The longest lease servetune writes or believes (a day): a longer one is a forged or broken file.
MAX_TTL = 86400.0
#: Seconds after which a waiting controller that stopped asking loses its place in the queue.
QUEUE_STALE = 30
#: Seconds a claim waits for the lock of the claim folder (``claim.lock``) before it calls the host busy.
LOCK_WAIT = 5


def new_controller_id() -> str:
    """A fresh id for one controller (one ``run_search``): this machine's name, pid and a random part."""
    return f"{plain_name(socket.gethostname())}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@functools.cache
def default_controller_id() -> str:
    """The controller id of every Host of this process that no controller has named (a Host used alone)."""
    return new_controller_id()


def _machine_id() -> str:
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text:
            return text
    return f"host:{socket.gethostname()}"


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


@functools.cache
def here() -> tuple[str, str]:
    """Where this process runs: (machine id, PID namespace) (``/etc/machine-id``, ``/proc/self/ns/pid``)."""
    return _machine_id(), _pid_namespace()


def process_start(pid: int) -> int | None:
    """The start time (clock ticks since boot) of live, non-zombie process ``pid`` of this namespace; None when
    there is none. Where /proc cannot tell, 0 for a process that exists."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except FileNotFoundError:
        return None
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return 0
        return 0
    fields = raw.rpartition(")")[2].split()
    if len(fields) < 20 or fields[0] == "Z":
        return None
    return int(fields[19]) if fields[19].isdigit() else 0


@dataclass(frozen=True)
class Lease:
    """A controller's lease on a host: who it is and where it runs, what it works on, its last heartbeat.

    ``heartbeat`` is the host's clock (seconds since the epoch) at the last renewal and ``ttl`` how long the
    lease lasts without one; ``storage`` is the study's storage URL with any password taken out. ``machine``
    (machine id), ``pid_ns`` (PID namespace) and ``start`` (process start time) say where ``pid`` means
    something: empty, only the lease's expiry tells whether it is live.
    """

    controller: str
    pid: int
    hostname: str
    study: str
    storage: str
    ttl: float
    heartbeat: float = 0.0
    machine: str = ""
    pid_ns: str = ""
    start: int = 0

    @classmethod
    def of_this_process(cls, controller: str, study: str, storage: str, ttl: float) -> Lease:
        """A lease for ``controller`` run by this process, with its machine, PID namespace and start time."""
        machine, ns = here()
        return cls(controller, os.getpid(), socket.gethostname(), study, storage, ttl, machine=machine,
                   pid_ns=ns, start=process_start(os.getpid()) or 0)

    def expired(self, host_now: float) -> bool:
        return host_now > self.heartbeat + self.ttl

    def live(self, host_now: float) -> bool:
        """Not expired, and (when its controller runs on this machine, in this PID namespace) its controller
        process still exists: the same PID with the same start time."""
        if self.expired(host_now):
            return False
        if not self.machine or (self.machine, self.pid_ns) != here():
            return True  # another machine or PID namespace: its PID means nothing here
        started = process_start(self.pid)
        if started is None:
            return False
        return not self.start or not started or started == self.start

    def describe(self) -> str:
        return f"controller {self.controller} (pid {self.pid} on {self.hostname}, study {self.study})"


_TEXT_FIELDS = ("controller", "hostname", "study", "storage", "machine", "pid_ns")


def _number(data: dict[str, Any], key: str) -> float:
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} is {type(value).__name__ if value is not None else 'null'}, not a number")
    if not math.isfinite(value):
        raise ValueError(f"{key} is {value}, not a finite number")
    return float(value)


def _integer(data: dict[str, Any], key: str, low: int, high: int) -> int:
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} is {type(value).__name__ if value is not None else 'null'}, not an integer")
    if not low <= value <= high:
        raise ValueError(f"{key} is {value}, outside {low}..{high}")
    return value


def parse_lease(name: str, text: str) -> Lease:
    """The lease in file ``name`` (``<controller>.json``) holding ``text``; ValueError saying what is wrong."""
    try:
        data = json.loads(text)
    except ValueError:
        raise ValueError("not JSON") from None
    if not isinstance(data, dict):
        raise ValueError(f"a JSON {type(data).__name__}, not an object")
    missing = [k for k in ("controller", "pid", "hostname", "study", "storage", "ttl", "heartbeat")
               if k not in data]
    if missing:
        raise ValueError(f"no {', '.join(missing)}")
    for key in _TEXT_FIELDS:
        value = data.get(key, "")
        if not isinstance(value, str) or len(value) > 1000:
            raise ValueError(f"{key} is {type(value).__name__ if value is not None else 'null'}, not a short text")
        if not value.isprintable():
            raise ValueError(f"{key} holds control characters")
    controller = data["controller"]
    if controller != plain_name(controller) or f"{controller}.json" != name:
        raise ValueError(f"controller {controller[:80]!r} does not match the file's name")
    ttl = _number(data, "ttl")
    if not 0 <= ttl <= MAX_TTL:
        raise ValueError(f"ttl is {ttl}, outside 0..{MAX_TTL:.0f} seconds")
    return Lease(controller, _integer(data, "pid", 1, MAX_PID), data["hostname"], data["study"], data["storage"],
                 ttl, _number(data, "heartbeat"), data.get("machine", ""), data.get("pid_ns", ""),
                 _integer(data, "start", 0, 2**63) if "start" in data else 0)


@dataclass(frozen=True)
class Claim:
    """The result of :func:`claim`: ``ok`` (the host is ours for a trial) or who holds it (or waits ahead)."""

    ok: bool
    holder: Lease | None = None
    reason: str = ""


def _check_controller(controller: str) -> None:
    if controller != plain_name(controller):
        raise ValueError(f"controller id {controller!r} is not a plain name")


def gpu_dir(shell: Shell, *, timeout: float = 30.0) -> str:
    """The folder of the host's GPU set under ``shell.host_dir`` (made if missing, writable by every user),
    asked once per environment (a simulated host's GPUs are the ``nvidia-smi`` on its PATH). A host_dir that
    cannot be made is HostMisconfigured, naming it."""
    key = tuple(sorted(shell.env.items()))
    if key not in shell.gpu_dirs:
        res = shell.run_script("host_dir.sh", shell.host_dir, timeout=timeout)
        where = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
        if not res.ok or not where.startswith("/"):
            raise HostMisconfigured(
                f"{shell.name}: cannot make the shared folder {shell.host_dir} where controllers keep their "
                f"leases ({res.stderr.strip()[:160] or 'no output'}); fix: make it writable or set host_dir",
                host=shell.name, fault="host_dir")
        shell.gpu_dirs[key] = where
    return shell.gpu_dirs[key]


def renew(shell: Shell, lease: Lease, *, timeout: float = 15.0) -> None:
    """Write (or renew) ``lease`` with the host's current time as its heartbeat."""
    _check_controller(lease.controller)
    head = json.dumps({k: v for k, v in asdict(lease).items() if k != "heartbeat"})[:-1] + ', "heartbeat": '
    res = shell.run_script("write_lease.sh", f"{gpu_dir(shell)}/{LEASE_DIR}", lease.controller, head,
                           timeout=timeout)
    if not res.ok:
        raise RunnerError(f"cannot write the lease on {shell.name}: {res.stderr.strip()[:200]}", host=shell.name)


def drop(shell: Shell, controller: str, *, timeout: float = 15.0) -> None:
    """Remove ``controller``'s lease, its place in the queue, and its claim on the host if it holds one."""
    _check_controller(controller)
    shell.run_script("drop_lease.sh", gpu_dir(shell), controller, timeout=timeout)


def read_all(shell: Shell, *, timeout: float = 15.0) -> tuple[float, list[Lease]]:
    """The host's clock and every valid lease on it. A file that is no lease is left out with one line
    naming it (once per host object); a heartbeat in the host's future is capped at the host's now, in the
    file too, so it expires ``ttl`` from now unless its controller renews it."""
    where = f"{gpu_dir(shell)}/{LEASE_DIR}"
    res = shell.run_script("leases.sh", where, timeout=timeout)
    lines = res.stdout.splitlines()
    try:
        now = float(lines[0])
    except (IndexError, ValueError):
        raise HostUnreachable(f"cannot read the leases on {shell.name}: {res.stderr.strip()[:200]}",
                              host=shell.name) from None
    out = []
    for line in lines[1:]:
        name, _, text = line.partition("\t")
        try:
            lease = parse_lease(name, text)
        except ValueError as exc:
            _report(shell, f"{where}/{name}", f"ignored lease file {where}/{name} on {shell.name}: {exc}")
            continue
        if lease.heartbeat > now:
            _report(shell, f"{where}/{name}@{lease.heartbeat}",
                    f"lease file {where}/{name} on {shell.name} has a heartbeat {lease.heartbeat - now:.0f} s in "
                    f"the host's future (clock stepped back, or written by hand): capped at now + ttl")
            lease = replace(lease, heartbeat=now)
            with contextlib.suppress(RunnerError, ValueError):  # the cap holds for this read; the next tries again
                renew(shell, lease, timeout=timeout)
        out.append(lease)
    return now, out


def _report(shell: Shell, key: str, line: str) -> None:
    """Say ``line`` once per ``key`` on this host object; what came from the host (a file's name) is shown with
    its control characters escaped, never sent to the terminal."""
    if key not in shell.reported:
        shell.reported.add(key)
        log.warning("%s", "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in line))


def live(shell: Shell) -> list[Lease]:
    now, leases = read_all(shell)
    return [lease for lease in leases if lease.live(now)]


def holder(shell: Shell) -> Lease | None:
    """The lease of the controller that holds the host's claim now (None: nobody, or a dead one)."""
    path = shell.shell_path(f"{gpu_dir(shell)}/{CLAIM_DIR}/controller")
    who = shell.run(f"head -c 300 {path} 2>/dev/null; true", timeout=15).stdout.strip()
    if not who:
        return None
    return next((lease for lease in live(shell) if lease.controller == who), None)


def claim(shell: Shell, controller: str, *, timeout: float = 15.0) -> Claim:
    """Claim the host for one trial of ``controller``. When another live controller holds it, or waits for it
    ahead of ``controller`` (first come, first served), nothing is taken, ``controller`` keeps (or takes) its
    place in the queue and the result names who is ahead."""
    _check_controller(controller)
    now, leases = read_all(shell, timeout=timeout)
    others = [lease for lease in leases if lease.live(now) and lease.controller != controller]
    where = gpu_dir(shell)
    res = shell.run_script("claim.sh", where, controller, QUEUE_STALE, LOCK_WAIT,
                           *(lease.controller for lease in others), timeout=max(timeout, LOCK_WAIT + 10))
    out = res.stdout.strip()
    if out == "ok":
        return Claim(True)
    verb, _, who = out.partition(" ")
    if verb == "locked":
        pid, _, command = who.partition(" ")
        by = f"process {pid} ({command})" if pid.isdigit() else "a process servetune cannot see"
        return Claim(False, None, printable(
            f"{shell.name} is busy: {by} has held the lock {where}/claim.lock for over {LOCK_WAIT}s "
            "(not a servetune controller taking its turn)", newlines=False)[:300])
    if verb not in ("held", "queued"):
        raise RunnerError(f"cannot claim {shell.name}: {res.stderr.strip()[:200]}", host=shell.name)
    found = next((lease for lease in others if lease.controller == who), None)
    what = found.describe() if found else f"controller {who}"
    if verb == "held":
        return Claim(False, found, f"{shell.name} is held by {what}")
    return Claim(False, found, f"{shell.name} is free, but {what} has waited for it longer (first come, first "
                               "served)")


def release(shell: Shell, controller: str, *, timeout: float = 15.0) -> None:
    """Give the host's claim back (only if ``controller`` holds it)."""
    _check_controller(controller)
    shell.run_script("release_claim.sh", f"{gpu_dir(shell)}/{CLAIM_DIR}", controller, timeout=timeout)
