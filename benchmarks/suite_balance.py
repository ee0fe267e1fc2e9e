"""How two xdist workers share ``make test``'s files, from a run's measured test times.

Reads the per-test times of a pytest run (``--junitxml``), collects the same paths, and replays
``--dist loadfile``'s scheduler (pytest-xdist 3.8 ``LoadScopeScheduling``: one file per worker, then another to
each worker whose pending tests are down to 2, and again after each test) in two queue orders: xdist's own
(most tests first, its default ``--loadscope-reorder``: what ``make test`` uses) and the measured longest file
first. Prints each order's wall time (the busier worker's), the other worker's idle time at the end, and a
perfect split (half the measured test time), with the git revision. The test times are measured; the schedule
is replayed, not measured.

    .venv/bin/python benchmarks/suite_balance.py run.xml tests/search -m "not engines"
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import deque
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


class _Order:
    """A pytest plugin that keeps the collected test ids, in the order the run would use."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.ids = [item.nodeid for item in session.items]


def measured(junit: Path) -> dict[str, float]:
    """Test id -> seconds (setup, call and teardown together, as the junit ``time`` is)."""
    times: dict[str, float] = {}
    for case in ET.parse(junit).iter("testcase"):
        module = case.get("classname", "")
        parts = module.split(".")
        cls = ""
        if parts and parts[-1][:1].isupper():
            cls, parts = parts[-1], parts[:-1]
        path = "/".join(parts) + ".py"
        key = f"{path}::{cls}::{case.get('name')}" if cls else f"{path}::{case.get('name')}"
        times[key] = float(case.get("time") or 0.0)
    return times


def files_in_order(ids: list[str], times: dict[str, float]) -> list[tuple[str, list[float]]]:
    files: dict[str, list[float]] = {}
    for nodeid in ids:
        files.setdefault(nodeid.split("::", 1)[0], []).append(times.get(nodeid, 0.0))
    return list(files.items())


def replay(queue: list[tuple[str, list[float]]], workers: int = 2) -> tuple[float, float]:
    """(wall seconds, idle seconds of the other workers at the end) of xdist's loadfile scheduler."""
    work = deque(queue)
    pending: list[deque[float]] = [deque() for _ in range(workers)]
    clock = [0.0] * workers

    def assign(node: int) -> None:
        if work:
            pending[node].extend(work.popleft()[1])

    for node in range(workers):
        assign(node)
    for node in range(workers):
        if len(pending[node]) <= 2:
            assign(node)
    while any(pending):
        node = min((n for n in range(workers) if pending[n]), key=lambda n: clock[n] + pending[n][0])
        clock[node] += pending[node].popleft()
        if len(pending[node]) <= 2:
            assign(node)
    wall = max(clock)
    return wall, sum(wall - c for c in clock)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("junit", type=Path, help="the --junitxml of a measured run")
    ap.add_argument("paths", nargs="+", help="the test paths that run measured")
    ap.add_argument("-m", dest="markexpr", default="not engines")
    ns = ap.parse_args()
    if not ns.junit.is_file():
        print(f"suite_balance: no junit file {ns.junit}; write one with pytest --junitxml=FILE", file=sys.stderr)
        return 2
    order = _Order()
    rc = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-m", ns.markexpr, *ns.paths],
                     plugins=[order])
    if rc != 0 or not order.ids:
        print(f"suite_balance: collecting {ns.paths} failed (pytest exit {rc})", file=sys.stderr)
        return 2
    times = measured(ns.junit)
    collected = files_in_order(order.ids, times)
    xdist = sorted(collected, key=lambda f: -len(f[1]))  # --loadscope-reorder (a stable sort)
    longest = sorted(collected, key=lambda f: -sum(f[1]))
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                         check=False).stdout.strip() or "unknown"
    total = sum(sum(t) for _, t in collected)
    print(f"revision {rev}; {len(order.ids)} tests in {len(collected)} files; measured test time {total:.0f} s "
          f"(from {ns.junit}); schedule replayed for 2 workers, not measured; a perfect split {total / 2:.0f} s")
    for name, queue in (("xdist's order (most tests first)", xdist), ("measured longest file first", longest)):
        wall, idle = replay(queue)
        print(f"{name}: wall {wall:.0f} s ({wall / (total / 2) - 1:+.1%} over a perfect split), "
              f"the other worker idle {idle:.0f} s at the end; last file {queue[-1][0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
