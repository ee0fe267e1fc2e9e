"""Durations and sizes as space files write them (``90s``, ``8h``; ``48GiB``, ``512MiB``)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB|K|M|G|T)?\s*$")
_SIZE_UNITS = {"B": 1, "K": 2**10, "KiB": 2**10, "M": 2**20, "MiB": 2**20, "G": 2**30, "GiB": 2**30,
               "T": 2**40, "TiB": 2**40}


def parse_duration(value: str | float | int) -> float:
    """``"8h"``, ``"90s"``, ``"15m"``, ``300`` (seconds) to seconds."""
    if isinstance(value, int | float):
        if value <= 0:
            raise ValueError("must be positive")
        return float(value)
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a duration (use e.g. 90s, 15m, 8h)")
    number = float(match.group(1))
    unit = match.group(2) or "s"
    seconds = number * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[unit]
    if seconds <= 0:
        raise ValueError("must be positive")
    return seconds


def parse_size(value: str | int) -> int:
    """``"4GiB"``, ``"512MiB"``, ``"4G"`` (binary units), ``4294967296`` (bytes) to bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        number, unit = float(value), "B"
    else:
        match = _SIZE.match(str(value))
        if not match:
            raise ValueError(f"{value!r} is not a size (use e.g. 4GiB, 512MiB)")
        number, unit = float(match.group(1)), match.group(2) or "B"
    size = int(number * _SIZE_UNITS[unit])
    if size < 2**20:
        raise ValueError(f"{value!r} is below 1 MiB")
    return size


Duration = Annotated[float, Field(gt=0)]
