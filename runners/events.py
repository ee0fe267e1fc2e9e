"""What a server session tells the layer above while a trial runs, as typed values: the caller matches on the
class instead of a string kind. :class:`~runners.server.ServerSession` calls ``on_event(event)`` with one of
:data:`ServerEvent` from its log follower and its benchmark loop."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from runners.telemetry import Failure, Phase


@dataclass(frozen=True)
class PhaseReached:
    """The server's log says it has moved to ``phase`` (loading weights, KV pool, CUDA graphs, ...)."""

    phase: Phase


@dataclass(frozen=True)
class FatalSeen:
    """A log line says the server is dying (evidence; its exit is proof): ``failure`` is the parser's reading."""

    failure: Failure


@dataclass(frozen=True)
class ServerReady:
    """The server is ready and its own (``info``: the engine's server-info answer, possibly empty)."""

    info: Mapping[str, Any]


@dataclass(frozen=True)
class LevelDone:
    """The load generator finished one concurrency level: ``record`` has sglang.bench_serving's names
    (``max_concurrency``, ``output_throughput``, ``p99_ttft_ms``, ...)."""

    record: Mapping[str, Any]


ServerEvent = PhaseReached | FatalSeen | ServerReady | LevelDone
"""Every event a session emits."""

EventSink = Callable[[ServerEvent], None]
"""What a session calls with each event."""
