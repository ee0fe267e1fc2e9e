"""Durations and sizes as space files write them (spaces/units.py)."""

from __future__ import annotations

import pytest

from spaces.units import parse_duration, parse_size


def test_durations() -> None:
    assert parse_duration("8h") == 8 * 3600
    assert parse_duration("90s") == 90
    assert parse_duration("1.5m") == 90
    assert parse_duration(300) == 300
    with pytest.raises(ValueError):
        parse_duration("0s")


def test_sizes() -> None:
    assert parse_size("4GiB") == parse_size("4G") == 4 * 2**30
    assert parse_size("512MiB") == 512 * 2**20
    assert parse_size(2**30) == 2**30
    for bad in ("4 parsecs", "1KiB", "-1GiB"):
        with pytest.raises(ValueError):
            parse_size(bad)
