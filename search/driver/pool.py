"""The hosts a controller owns: one trial per host at a time, flapping hosts set aside for a while.

A slot is one host, or a group of hosts a server spanning nodes takes together (:class:`~runners.host.HostGroup`:
the head and its workers, handed out and claimed as one).

``acquire()`` hands out a free host (blocking); ``release(slot, infra_failure=...)`` gives it back after a
trial, ``put_back(slot)`` without one. A host that fails ``max_consecutive_failures`` trials in a row
(infrastructure failures only: OOMs are the config's fault, not the host's) is set aside for ``cooldown``
seconds while the others carry on; after the cooldown it is tried again. A host set aside
``max_set_asides`` times in a row (no successful trial in between) is retired for the rest of the run.
While every host is set aside, :meth:`acquire` waits for the first cooldown to end; once every host is
retired it raises :class:`NoHostsLeft` and the search ends cleanly.

A host another live controller holds (its claim, see :meth:`runners.host.Host.claim`) is *held off*
(:meth:`hold_off`): handed out again after a short wait, with no failure counted, so two controllers on one
host take turns. A host with a set-up fault waiting will not fix is retired at once (:meth:`retire`).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from runners.errors import ServetuneError
from runners.host import Host, HostGroup


class HostState(StrEnum):
    """Where a host of the pool stands."""

    IDLE = "idle"
    RUNNING = "running"
    SET_ASIDE = "set aside"
    """Failed ``max_consecutive_failures`` trials in a row: out until its cooldown ends."""
    RETIRED = "retired"
    """Set aside ``max_set_asides`` times in a row, or a set-up fault waiting will not fix: out for the rest
    of the run."""
    HELD = "held by another controller"
    """Another live controller runs a trial there: handed out again once it lets go (no failure counted)."""

    @property
    def out(self) -> bool:
        """Not taking trials now (set aside or retired)."""
        return self in (HostState.SET_ASIDE, HostState.RETIRED)


@dataclass(frozen=True)
class HostStatus:
    """A snapshot of one host of the pool (:meth:`HostPool.states`)."""

    host: str
    state: HostState
    trials: int
    consecutive_failures: int
    set_aside_count: int
    last_error: str
    held_by: str = ""


class NoHostsLeft(ServetuneError):
    """Every host has been retired after repeated infrastructure failures (or the run is stopping)."""


@dataclass
class HostSlot:
    host: Host
    """The host a trial runs on; of a group, its head (rank 0)."""
    workers: tuple[Host, ...] = ()
    """Of a group: the other hosts, in rank order (rank 1 first); claimed with the head, all or nothing."""
    group: str = ""
    """Of a group: its name, which is the slot's name."""
    busy: bool = False
    consecutive_failures: int = 0
    set_aside_until: float = 0.0
    set_aside_count: int = 0
    set_asides_in_a_row: int = 0
    retired: bool = False
    last_error: str = ""
    trials: int = 0
    last_server_stop: float = -math.inf
    """``time.monotonic()`` when the last server of ours on it was stopped."""
    held_off_until: float = 0.0
    """``time.monotonic()`` until which another controller holds it (no failure counted)."""
    held_by: str = ""

    @property
    def name(self) -> str:
        return self.group or self.host.name

    @property
    def hosts(self) -> tuple[Host, ...]:
        """Every host of the slot, head first."""
        return (self.host, *self.workers)


class HostPool:
    def __init__(self, hosts: Sequence[Host | HostGroup], *, max_consecutive_failures: int = 3,
                 cooldown: float = 300.0, max_set_asides: int = 3) -> None:
        if not hosts:
            raise ValueError("a host pool needs at least one host")
        self.slots = [HostSlot(h.hosts[0], h.hosts[1:], h.name) if isinstance(h, HostGroup) else HostSlot(h)
                      for h in hosts]
        self.max_failures = max_consecutive_failures
        self.cooldown = cooldown
        self.max_set_asides = max_set_asides
        self._cond = threading.Condition()

    def __len__(self) -> int:
        return len(self.slots)

    def acquire(self, *, stop: threading.Event | None = None) -> HostSlot:
        """A free host, waiting while all are busy or set aside. NoHostsLeft once every host is retired,
        or when ``stop`` is set while waiting."""
        with self._cond:
            while True:
                now = time.monotonic()
                live = [s for s in self.slots if not s.retired]
                if not live:
                    raise NoHostsLeft(
                        "every host is retired after repeated failures: "
                        + "; ".join(f"{s.name}: {s.last_error}" for s in self.slots)
                    )
                for slot in live:
                    if slot.set_aside_until <= now and slot.held_off_until <= now and not slot.busy:
                        slot.busy = True
                        return slot
                if stop is not None and stop.is_set():
                    raise NoHostsLeft("stopping")
                back = min((max(s.set_aside_until, s.held_off_until) for s in live
                            if max(s.set_aside_until, s.held_off_until) > now), default=math.inf)
                self._cond.wait(timeout=min(0.5, max(back - now, 0.01)))

    def release(self, slot: HostSlot, *, infra_failure: bool, error: str = "", trial: bool = True) -> None:
        """Give a host back after a trial; ``infra_failure``: the trial failed for the host's sake.
        ``trial=False``: no trial ran (the host could not even be claimed), but the failure counts."""
        with self._cond:
            slot.busy = False
            slot.held_by = ""
            if trial:
                slot.trials += 1
            if infra_failure:
                slot.consecutive_failures += 1
                slot.last_error = error
                if slot.consecutive_failures >= self.max_failures:
                    slot.consecutive_failures = 0
                    slot.set_aside_count += 1
                    slot.set_asides_in_a_row += 1
                    if slot.set_asides_in_a_row >= self.max_set_asides:
                        slot.retired = True
                        slot.set_aside_until = math.inf
                    else:
                        slot.set_aside_until = time.monotonic() + self.cooldown
            else:
                slot.consecutive_failures = 0
                slot.set_asides_in_a_row = 0
            self._cond.notify_all()

    def put_back(self, slot: HostSlot) -> None:
        """Give a host back unused (no trial ran on it): its failure counts are left as they were."""
        with self._cond:
            slot.busy = False
            self._cond.notify_all()

    def hold_off(self, slot: HostSlot, seconds: float, holder: str) -> None:
        """Give a host back unused because another controller holds it: hand it out again after
        ``seconds``; no failure is counted."""
        with self._cond:
            slot.busy = False
            slot.held_off_until = time.monotonic() + seconds
            slot.held_by = holder
            self._cond.notify_all()

    def retire(self, slot: HostSlot, error: str) -> None:
        """Take a host out for the rest of the run (a set-up fault waiting will not fix)."""
        with self._cond:
            slot.busy = False
            slot.retired = True
            slot.set_aside_until = math.inf
            slot.last_error = error
            self._cond.notify_all()

    def states(self) -> list[HostStatus]:
        """Each host's state now, in the pool's order."""
        now = time.monotonic()
        with self._cond:
            return [
                HostStatus(
                    host=s.name,
                    state=HostState.RETIRED if s.retired else HostState.SET_ASIDE if s.set_aside_until > now
                    else HostState.RUNNING if s.busy else HostState.HELD if s.held_off_until > now
                    else HostState.IDLE,
                    trials=s.trials,
                    consecutive_failures=s.consecutive_failures,
                    set_aside_count=s.set_aside_count,
                    last_error=s.last_error,
                    held_by=s.held_by,
                )
                for s in self.slots
            ]
