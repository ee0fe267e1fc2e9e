"""The efficiency benchmark measures the product: ``benchmarks/efficiency.py`` and ``servetune run`` go through
the same :meth:`Strategy.next` and the same trial function, so a change to the strategy changes both."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from search.driver.hosts import local_host
from search.driver.run import RunOptions, run_search
from search.strategy.strategy import Action, Enqueue, Strategy
from search.strategy.view import StudyView
from search.trial.records import records
from spaces.schema import load_space
from tests.search.overnight_kit import SEED003
from tests.search.overnight_kit import make_space as kit_make_space

ROOT = Path(__file__).resolve().parents[2]
#: A first launch the product's own strategy would never choose (it probes at SGLang's default arithmetic).
MARKER = {"mem_fraction_static": 0.6, "cuda_graph_max_bs": 48, "nccl.NCCL_PROTO": "LL", "nccl.NCCL_ALGO": "unset"}


def efficiency() -> ModuleType:
    """benchmarks/efficiency.py as the script runs (its folder first on the path)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("efficiency_under_test", ROOT / "benchmarks" / "efficiency.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


@pytest.fixture
def changed_strategy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The strategy changed: its first launch is :data:`MARKER` instead of the probe."""
    original = Strategy.next

    def first_is_the_marker(self: Strategy, view: StudyView) -> Action:
        if not view.records:
            return Enqueue(dict(MARKER), {"probe": True}, "the changed strategy's first launch")
        return original(self, view)

    monkeypatch.setattr(Strategy, "next", first_is_the_marker)


def first_params_of_the_benchmark() -> dict[str, Any]:
    bench = efficiency()
    land = bench.Landscape(ROOT / "spaces" / "demo-sim.yaml")
    run = bench.run_servetune(land, 0, 14)
    return dict(run.launched[0][0])


def first_params_of_a_run(wd: Path) -> dict[str, Any]:
    space = load_space(kit_make_space(wd / "space.yaml", speed=1000, workload=SEED003, safe=False, base_budget=None,
                                      knobs={"nccl": {"NCCL_PROTO": ["unset", "LL", "Simple"],
                                                      "NCCL_ALGO": ["unset", "ring"]}}))
    host = local_host(space, runs_root=str(wd / "runs"), sim_dir=wd / "sim")
    try:
        summary = run_search(space, [host], RunOptions(
            study_name="one-strategy", storage_url=f"sqlite:///{wd}/s.db", artifacts_dir=wd / "artifacts",
            n_trials=1, timeout=None, seed=1, smi_interval=0.2, confirm_k=0))
    finally:
        host.close()
    return dict(records(summary.study)[0].params)


def test_the_product_strategy_starts_with_the_probe(tmp_path: Path) -> None:
    """Unchanged, neither starts with the marker (so the test below can fail)."""
    assert first_params_of_the_benchmark() != MARKER


@pytest.mark.slow  # a real run on the simulated host (a few seconds)
def test_a_change_to_the_strategy_changes_the_benchmark_and_the_run(changed_strategy: None,
                                                                     tmp_path: Path) -> None:
    assert first_params_of_the_benchmark() == MARKER
    assert first_params_of_a_run(tmp_path) == MARKER
