"""This controller's leases on its hosts: written at the start, renewed every ``ttl / 3`` seconds, dropped at the
end (see :mod:`search.driver.run`, "Hosts are shared")."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from runners.errors import RunnerError
from runners.host import Host, Lease

__all__ = ["LEASE_TTL", "Leases"]

log = logging.getLogger("servetune")

#: How long a lease lasts without a heartbeat (a controller that dies leaves its servers this long).
LEASE_TTL = 60.0


class Leases:
    """This controller's leases on its hosts: written at the start, renewed every ``ttl / 3`` seconds, dropped
    (with any claim) at the end. A renewal that fails is retried at the next beat."""

    def __init__(self, hosts: Sequence[Host], lease: Lease) -> None:
        self.hosts = list(hosts)
        self.lease = lease
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"lease-{lease.controller}", daemon=True)
        self.held: set[str] = set()
        """Hosts whose last renewal went through."""

    def renew(self, host: Host) -> None:
        hold = host.hold
        if hold is None:  # a scheduler decides who gets the GPUs: nothing to lease
            self.held.add(host.name)
            return
        try:
            hold.renew(self.lease)
            self.held.add(host.name)
        except (RunnerError, ValueError) as exc:
            self.held.discard(host.name)
            log.warning("lease on %s not renewed: %s", host.name, exc)

    def ensure(self, host: Host) -> None:
        """Renew now if the last renewal failed: a claim without a live lease would be taken over."""
        if host.name not in self.held:
            self.renew(host)

    def start(self) -> None:
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.lease.ttl / 3):
            for host in self.hosts:
                self.renew(host)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        for host in self.hosts:
            hold = host.hold
            if hold is None:
                continue
            try:
                hold.drop(self.lease.controller)
            except RunnerError as exc:
                log.warning("lease on %s not removed (it expires by itself): %s", host.name, exc)
