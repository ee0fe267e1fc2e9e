"""From a space's workload to what the load generator runs on the host: the plan and the files it needs."""

from __future__ import annotations

from pathlib import Path

from runners.server import BenchPlan
from spaces.schema import Space

DATASET_FILE = "dataset.json"
"""The dataset's name in a run directory."""


def bench_plan(space: Space, *, api: str, model: str, levels: tuple[int, ...] | None = None,
               requests: tuple[int, ...] | None = None, request_rate: float | None = None,
               warmup: int | None = None) -> BenchPlan:
    """The space's sweep (or, with ``levels``/``requests``/``request_rate``, one step of a rate search)."""
    wl = space.workload
    return BenchPlan(
        api=api,
        levels=levels if levels is not None else tuple(wl.concurrency),
        requests=requests if requests is not None else tuple(wl.requests()),
        input_len=wl.input_len,
        output_len=wl.output_len,
        warmup=wl.warmup_requests if warmup is None else warmup,
        model=model,
        timeout=space.budget.benchmark_timeout,
        range_ratio=wl.range_ratio,
        dataset=DATASET_FILE if wl.dataset is not None else None,
        prefix_len=wl.prefix.len if wl.prefix is not None else 0,
        prefix_groups=wl.prefix.groups if wl.prefix is not None else 1,
        seed=wl.seed,
        request_rate=request_rate,
    )


def run_files(space: Space) -> dict[str, str]:
    """Files the load generator needs in the run directory besides itself (the dataset, if any)."""
    if space.workload.dataset is None:
        return {}
    return {DATASET_FILE: Path(space.workload.dataset).read_text(encoding="utf-8")}
