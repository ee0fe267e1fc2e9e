"""``max_rate_under_slo`` end to end: the shipped space on the simulated host, real processes and HTTP.

Each trial's rate search is run by the load generator in open loop against the real simulated server, so
its steps, the rate found and its intermediate values are checked where a user would see them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from optuna.trial import TrialState

from search.driver.hosts import local_host
from search.driver.run import RunOptions, run_search
from search.outputs.figures import SLO_RATE_FIGURE_ID, study_figures
from search.outputs.report import report_markdown
from search.storage import create_or_load, open_storage
from search.strategy.view import StudyView
from search.trial.records import records
from spaces.schema import load_space
from tests.fixtures.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_shipped_slo_space_finds_a_rate_per_trial(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "spaces" / "sim-slo-rate.yaml").read_text())
    data["port"] = free_port()
    data["engine"]["sim"]["profile"] = str(ROOT / "runners" / "simhost" / "profiles" /
                                           "dsv4-flash-nvfp4-tp4-rtxpro6000.yaml")
    data["workload"]["dataset"] = str(ROOT / "spaces" / "data" / "sharegpt-mini.json")
    data["objective"]["rate"].update(steps=4, requests=20)
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(data))
    space = load_space(path)
    url = f"sqlite:///{tmp_path}/servetune.db"
    study = create_or_load(open_storage(url), "slo")
    study.enqueue_trial({"mem_fraction_static": 0.63, "cuda_graph_max_bs": 64})
    host = local_host(space, runs_root=str(tmp_path / "runs"), sim_dir=tmp_path / "sim")
    options = RunOptions(study_name="slo", storage_url=url, artifacts_dir=tmp_path / "artifacts", n_trials=1,
                         timeout=None, seed=1, smi_interval=0.2, confirm_k=0)
    summary = run_search(space, [host], options)
    (rec,) = records(summary.study)
    assert rec.state == TrialState.COMPLETE, rec.reason
    assert rec.objective_metric == "slo_request_rate"
    steps = rec.levels
    assert 2 <= len(steps) == rec.slo_rate_steps <= 4
    rates = [lv.request_rate for lv in steps]
    assert rates[0] == 0.1 and all(r is not None for r in rates)
    assert all(lv.max_concurrency == 64 and lv.dataset_name == "sharegpt" and lv.seed == 1 for lv in steps)
    # The value is the highest rate at which the SLO held (p99 TTFT <= 5 s, p99 TPOT <= 300 ms, no failure).
    held = [lv.request_rate for lv in steps
            if lv.served and (lv.p99_ttft_ms or 0) <= 5000 and (lv.p99_tpot_ms or 0) <= 300 and not lv.failed]
    assert held, "some rate in range holds this SLO on this configuration"
    assert rec.slo_rate == (max(held) if held else None)
    assert rec.value == (rec.slo_rate or 0.0)
    trial = summary.study.trials[0]
    assert sorted(trial.intermediate_values) == list(range(1, len(steps) + 1))  # one per step, numbered
    # The record keeps each step's verdict, in the order measured, beside its figures.
    assert [s.rate for s in rec.slo_rate_search] == rates
    assert [s.holds for s in rec.slo_rate_search] == [r in held for r in rates]
    assert all(s.violations for s in rec.slo_rate_search if not s.holds)
    assert rec.slo_limits == {"p99_ttft_ms": 5000, "p99_tpot_ms": 300, "error_rate": 0}
    # The report and the figures show the search.
    report = report_markdown(StudyView.of(summary.study))
    assert "## SLO rate search" in report
    row = next(line for line in report.splitlines() if line.startswith(f"| #{rec.number} | {rec.slo_rate:g} |"))
    assert row.count("held") + row.count("broke:") == len(steps)
    figures = study_figures(StudyView.of(summary.study))
    assert next(iter(figures)) == SLO_RATE_FIGURE_ID
    drawn = figures[SLO_RATE_FIGURE_ID].data[0]
    assert list(drawn.x) == sorted(rates) and drawn.name.startswith(f"trial {rec.number}: ")
    assert [y <= 1.0 for y in drawn.y] == [r in held for r in sorted(rates)]  # at or under the limit: held
