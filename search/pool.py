"""The hosts a controller owns: one trial per host at a time, flapping hosts set aside for a while.

``acquire()`` hands out a free host (blocking); ``release(host, ok=...)`` gives it back. A host that
fails ``max_consecutive_failures`` trials in a row (infrastructure failures only: OOMs are the config's
fault, not the host's) is set aside for ``cooldown`` seconds while the others carry on. When every host is
set aside at once, :meth:`acquire` raises :class:`NoHostsLeft` and the search ends cleanly.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from runners.errors import ServetuneError
from runners.host import Host, HostInfo


class NoHostsLeft(ServetuneError):
    """Every host has been set aside after repeated infrastructure failures."""


@dataclass
class HostSlot:
    host: Host
    busy: bool = False
    consecutive_failures: int = 0
    set_aside_until: float = 0.0
    set_aside_count: int = 0
    info: HostInfo | None = None
    last_error: str = ""
    trials: int = 0
    state: str = "idle"
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.host.name


class HostPool:
    def __init__(self, hosts: Sequence[Host], *, max_consecutive_failures: int = 3,
                 cooldown: float = 300.0) -> None:
        if not hosts:
            raise ValueError("a host pool needs at least one host")
        self.slots = [HostSlot(h) for h in hosts]
        self.max_failures = max_consecutive_failures
        self.cooldown = cooldown
        self._cond = threading.Condition()

    def __len__(self) -> int:
        return len(self.slots)

    def acquire(self, *, stop: threading.Event | None = None) -> HostSlot:
        with self._cond:
            while True:
                now = time.monotonic()
                usable = [s for s in self.slots if s.set_aside_until <= now]
                if not usable:
                    raise NoHostsLeft(
                        "every host is set aside after repeated failures: "
                        + "; ".join(f"{s.name}: {s.last_error}" for s in self.slots)
                    )
                for slot in usable:
                    if not slot.busy:
                        slot.busy = True
                        slot.state = "running"
                        return slot
                if stop is not None and stop.is_set():
                    raise NoHostsLeft("stopping")
                self._cond.wait(timeout=0.5)

    def release(self, slot: HostSlot, *, infra_failure: bool, error: str = "") -> None:
        with self._cond:
            slot.busy = False
            slot.trials += 1
            if infra_failure:
                slot.consecutive_failures += 1
                slot.last_error = error
                if slot.consecutive_failures >= self.max_failures:
                    slot.set_aside_until = time.monotonic() + self.cooldown
                    slot.set_aside_count += 1
                    slot.consecutive_failures = 0
                    slot.state = "set aside"
                else:
                    slot.state = "idle"
            else:
                slot.consecutive_failures = 0
                slot.state = "idle"
            self._cond.notify_all()

    def states(self) -> list[dict[str, object]]:
        now = time.monotonic()
        with self._cond:
            return [
                {
                    "host": s.name,
                    "state": s.state if s.set_aside_until <= now or s.state != "set aside" else "set aside",
                    "trials": s.trials,
                    "consecutive_failures": s.consecutive_failures,
                    "last_error": s.last_error,
                }
                for s in self.slots
            ]
