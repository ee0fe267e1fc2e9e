"""Objective kinds and workload shapes in space files: valid combinations load, bad ones are one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from runners.errors import ConfigError
from spaces.schema import load_space

ROOT = Path(__file__).resolve().parents[2]

BASE = {
    "name": "t",
    "engine": {"kind": "sglang", "python": "/usr/bin/python3"},
    "model_path": "/models/m",
    "knobs": {"mem_fraction_static": {"low": 0.6, "high": 0.9, "step": 0.01}},
    "workload": {"concurrency": [1, 16, 64]},
}


def load(tmp_path: Path, **sections: object) -> object:
    data = json.loads(json.dumps(BASE))
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    p = tmp_path / "space.yaml"
    p.write_text(yaml.safe_dump(data))
    return load_space(p)


def test_throughput_at_is_the_default() -> None:
    space = load_space(ROOT / "spaces" / "demo-sim.yaml")
    assert space.objective.kind == "throughput_at"


def test_max_rate_under_slo_loads_with_its_search(tmp_path: Path) -> None:
    space = load(tmp_path, objective={"kind": "max_rate_under_slo", "level": 64,
                                      "slo": {"p99_ttft_ms": 2000, "max_error_rate": 0.01},
                                      "rate": {"start": 2, "high": 64, "steps": 10, "tolerance": 0.03}})
    rs = space.objective.rate_search  # type: ignore[attr-defined]
    assert (rs.start, rs.low, rs.high, rs.steps, rs.tolerance, rs.result) == (2, 0.25, 64, 10, 0.03, "rate")


def test_pareto_loads_with_its_metrics_and_directions(tmp_path: Path) -> None:
    space = load(tmp_path, objective={"kind": "pareto", "level": 16, "slo": {"p99_ttft_ms": 3000},
                                      "metrics": [{"name": "output_throughput", "direction": "maximize"},
                                                  {"name": "p99_tpot_ms"}, {"name": "mean_ttft_ms"}]})
    objective = space.objective  # type: ignore[attr-defined]
    assert objective.metric_names == ["output_throughput", "p99_tpot_ms", "mean_ttft_ms"]
    assert objective.directions == ["maximize", "minimize", "minimize"]  # a latency is minimised by default
    assert objective.scored_by == "output_throughput"
    assert space.target_level == 16  # type: ignore[attr-defined]
    shipped = load_space(ROOT / "spaces" / "sim-pareto.yaml")
    assert shipped.objective.kind == "pareto" and len(shipped.objective.metric_names) == 2


def test_every_pareto_metric_is_a_figure_the_load_generator_reports() -> None:
    from runners.loadgen import RECORD_KEYS
    from spaces.objective import DERIVED_METRICS
    from spaces.schema import PARETO_METRICS

    assert set(PARETO_METRICS) <= set(RECORD_KEYS) | set(DERIVED_METRICS)
    assert all(sense == ("minimize" if name.endswith("_ms") or name in DERIVED_METRICS else "maximize")
               for name, sense in PARETO_METRICS.items())


@pytest.mark.parametrize("objective, message", [
    ({"kind": "max_rate_under_slo"}, "objective: max_rate_under_slo needs at least one slo limit"),
    ({"kind": "max_rate_under_slo", "slo": {"p99_ttft_ms": 100}, "metric": "output_throughput"},
     "objective: max_rate_under_slo scores the rate"),
    ({"kind": "throughput_at", "rate": {"start": 1}}, "objective: rate is only for kind max_rate_under_slo"),
    ({"kind": "max_rate_under_slo", "slo": {"p99_ttft_ms": 100}, "rate": {"start": 1, "low": 2}},
     "objective.rate: need low <= start <= high"),
    ({"kind": "fastest"}, "objective.kind: Input should be 'throughput_at', 'max_rate_under_slo', 'pareto', 'cost_per_mtok' or "
     "'energy_per_token'"),
    # pareto: two or more known metrics, each once, in their direction; SLO keys that apply to it
    ({"kind": "pareto", "metrics": [{"name": "output_throughput"}]},
     "objective: pareto needs 2 or more metrics to trade off (got 1); for one metric use kind throughput_at"),
    ({"kind": "pareto"}, "objective: pareto needs 2 or more metrics to trade off (got 0)"),
    ({"kind": "pareto", "metrics": [{"name": "output_throughput"}, {"name": "p95_tpot_ms"}]},
     "objective.metrics.1.name: unknown metric 'p95_tpot_ms'; allowed: output_throughput, request_throughput"),
    ({"kind": "pareto", "metrics": [{"name": "p99_tpot_ms"}, {"name": "p99_tpot_ms"}]},
     "objective: pareto metric p99_tpot_ms is named twice; each metric once"),
    ({"kind": "pareto", "metrics": [{"name": "output_throughput"}, {"name": "p99_tpot_ms", "direction": "down"}]},
     "objective.metrics.1.direction: Input should be 'maximize' or 'minimize'"),
    ({"kind": "pareto", "metrics": [{"name": "output_throughput"}, {"name": "p99_tpot_ms", "direction": "maximize"}]},
     "objective.metrics.1: p99_tpot_ms is a latency: its direction is minimize, not maximize"),
    ({"kind": "pareto", "metrics": [{"name": "output_throughput"}, {"name": "p99_ttft_ms"}],
      "slo": {"max_error_rate": 0.01}},
     "objective: slo.max_error_rate is only for max_rate_under_slo (a pareto trial's level must serve every "
     "request); allowed here: slo.p99_ttft_ms, slo.p99_tpot_ms"),
    ({"kind": "pareto", "metrics": [{"name": "output_throughput"}, {"name": "p99_ttft_ms"}],
      "metric": "output_throughput"}, "objective: pareto scores its metrics list; drop metric"),
    ({"kind": "pareto", "metrics": [{"name": "output_throughput"}, {"name": "p99_ttft_ms"}],
      "rate": {"start": 1}}, "objective: rate is only for kind max_rate_under_slo (this objective is pareto)"),
    ({"metrics": [{"name": "output_throughput"}, {"name": "p99_ttft_ms"}]},
     "objective: metrics is only for kind pareto (this objective is throughput_at: give metric)"),
])
def test_bad_objectives_are_one_line(tmp_path: Path, objective: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, objective=objective)
    text = str(err.value)
    assert "\n" not in text and message in text, text


@pytest.mark.parametrize("workload, message", [
    ({"range_ratio": 1.5}, "workload.range_ratio: Input should be less than or equal to 1"),
    ({"dataset": "x.json", "prefix": {"len": 8}}, "workload: dataset and prefix are two workloads"),
    ({"burst": True, "requests_per_level": 5}, "workload: burst sends exactly `level` requests"),
    ({"dataset": "missing.json"}, "workload.dataset: no such file missing.json"),
    ({"prefix": {"len": 0}}, "workload.prefix.len: Input should be greater than or equal to 1"),
])
def test_bad_workloads_are_one_line(tmp_path: Path, workload: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, workload=workload)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize("content, message", [
    ("{not json", "is not JSON"),
    ('{"a": 1}', "is not ShareGPT-shaped"),
    (b"\xff\xfe", "is not JSON"),
])
def test_a_bad_dataset_file_is_one_line(tmp_path: Path, content: str | bytes, message: str) -> None:
    path = tmp_path / "d.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConfigError) as err:
        load(tmp_path, workload={"dataset": "d.json"})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_dataset_is_found_beside_the_space_and_made_absolute(tmp_path: Path) -> None:
    (tmp_path / "prompts.json").write_text((ROOT / "spaces" / "data" / "sharegpt-mini.json").read_text())
    space = load(tmp_path, workload={"dataset": "prompts.json", "range_ratio": 0.5, "seed": 7})
    wl = space.workload  # type: ignore[attr-defined]
    assert wl.dataset == str((tmp_path / "prompts.json").resolve()) and wl.shape == "sharegpt" and wl.seed == 7


def test_burst_sends_each_level_at_once(tmp_path: Path) -> None:
    space = load(tmp_path, workload={"concurrency": [150], "burst": True})
    assert space.workload.requests() == [150]  # type: ignore[attr-defined]
