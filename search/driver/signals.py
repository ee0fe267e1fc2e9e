"""Signals and heartbeats: the first SIGINT/SIGTERM lets the running trials finish, a second aborts them; a
running trial's heartbeat tells other controllers it is alive."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Any

from optuna.storages import RDBStorage

from runners.errors import first_line

__all__ = ["Heartbeat", "Signals"]

log = logging.getLogger("servetune")


class Heartbeat:
    """Records a trial's heartbeat every ``interval`` seconds until stopped."""

    def __init__(self, storage: RDBStorage, trial_id: int, interval: float) -> None:
        self._storage = storage
        self._id = trial_id
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{trial_id}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        said = ""
        while not self._stop.wait(self._interval):
            try:
                self._storage.record_heartbeat(self._id)
                said = ""
            except Exception as exc:  # a storage hiccup: the next beat may get through
                cause = exc.__cause__ if exc.__cause__ is not None else exc
                why = first_line(getattr(cause, "orig", None) or cause)
                if why != said:  # once per outage, not at every beat
                    log.warning("heartbeat of trial id %d not recorded: %s", self._id, why)
                said = why


class Signals:
    """First signal: finish the running trials, then stop. Second: abort them."""

    def __init__(self, stop: threading.Event, abort: threading.Event) -> None:
        self.stop = stop
        self.abort = abort
        self.stop_requested = threading.Event()
        self.count = 0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Signals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        self.stop_requested.set()
        self.stop.set()
        if self.count >= 2:
            self.abort.set()
            log.warning("second %s: aborting the running trials", signal.Signals(signum).name)
        else:
            log.warning("%s: finishing the running trials, then stopping (again to abort them)",
                        signal.Signals(signum).name)
