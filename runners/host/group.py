"""Hosts taken together by a server that spans nodes (an inventory group)."""

from __future__ import annotations

from dataclasses import dataclass

from runners.host.host import Host

__all__ = ["HostGroup"]


@dataclass(frozen=True)
class HostGroup:
    """Hosts one server spans, in rank order (``hosts[0]`` is the head): a controller claims all of them for a
    trial or none, and a trial of N nodes runs on the first N."""

    name: str
    hosts: tuple[Host, ...]

    def __post_init__(self) -> None:
        if len(self.hosts) < 2:
            raise ValueError(f"group {self.name!r}: a group takes at least two hosts")
