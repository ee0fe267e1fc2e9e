"""The correctness gate, the cost and energy objectives and the speculative space, end to end on the simulated host.

Real processes (the simulated SGLang host and its nvidia-smi), real HTTP, a real SQLite study:

* forcing ``NCCL_PROTO=LL128`` on seed 003's PCIe TP4 host corrupts some answers (the profile's numerics):
  the gate records the prompts it got wrong, the trial is infeasible and never the recommendation, the
  report says so;
* ``spaces/sim-speculative.yaml`` (coupled speculative knobs, a free flag, a constraint) searched for
  ``energy_per_token`` and for ``cost_per_mtok``: the conditional knobs appear only with EAGLE, the figures
  are in the records and the report with their units.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from search.driver.hosts import local_host
from search.driver.run import RunOptions, run_search
from search.outputs.report import report_markdown
from search.spaces import load_checked_space
from search.strategy.view import StudyView
from search.trial.records import TrialFacts, records
from spaces.schema import Space
from tests.search.overnight_kit import make_space

ROOT = Path(__file__).resolve().parents[2]


def _search(space: Space, wd: Path, n_trials: int, *, enqueue: list[dict[str, Any]] = (),  # type: ignore[assignment]
            price: float | None = None, seed: int = 1) -> optuna.Study:
    url = f"sqlite:///{wd}/study.db"
    if enqueue:
        study = optuna.create_study(storage=url, study_name="t", directions=space.objective.directions)
        for params in enqueue:
            study.enqueue_trial(params)
    host = local_host(space, runs_root=str(wd / "runs"), sim_dir=wd / "sim", price_per_gpu_hour=price)
    options = RunOptions(study_name="t", storage_url=url, artifacts_dir=wd / "artifacts", n_trials=n_trials,
                         timeout=None, seed=seed, smi_interval=0.2, confirm_k=0)
    return run_search(space, [host], options).study


@pytest.mark.slow
def test_forced_ll128_on_pcie_is_rejected_by_the_gate(tmp_path: Path) -> None:
    path = make_space(tmp_path / "space.yaml", speed=200,
                      knobs={"mem_fraction_static": {"low": 0.62, "high": 0.62},
                             "cuda_graph_max_bs": {"choices": [64]},
                             "num_continuous_decode_steps": {"choices": [1]},
                             "nccl": {"NCCL_PROTO": ["unset", "LL128"]}})
    space = load_checked_space(path)
    assert space.gate_on  # NCCL_PROTO can change the answers: on by default
    base = {"mem_fraction_static": 0.62, "cuda_graph_max_bs": 64, "num_continuous_decode_steps": 1}
    study = _search(space, tmp_path, 2, enqueue=[{**base, "nccl.NCCL_PROTO": "unset"},
                                                 {**base, "nccl.NCCL_PROTO": "LL128"}])
    recs = {r.params.get("nccl.NCCL_PROTO"): r for r in records(study) if r.state == TrialState.COMPLETE}
    good, bad = recs["unset"], recs["LL128"]
    assert good.correctness is not None and good.correctness.passed and good.feasible
    assert good.correctness.same_as_reference  # the probe-like launch is the reference itself
    assert bad.correctness is not None and not bad.correctness.passed and not bad.feasible
    assert bad.correctness.agreement is not None and bad.correctness.agreement < space.correctness.min_agreement
    assert bad.correctness.wrong and all(w.diverged_at is not None for w in bad.correctness.wrong)
    assert bad.value is not None  # it served and was measured: fast or not, it is never the answer
    view = StudyView.of(study, space=space)
    assert view.choice is not None and view.choice.number == good.number
    report = report_markdown(view)
    assert "## Correctness gate" in report and f"| #{bad.number} |" in report
    assert "1 rejected" in report


def _speculative(tmp_path: Path, objective: dict[str, Any]) -> Space:
    data = yaml.safe_load((ROOT / "spaces" / "sim-speculative.yaml").read_text())
    data["engine"]["sim"]["profile"] = str(ROOT / "runners/simhost/profiles/llama31-8b-h100.yaml")
    data["engine"]["sim"]["speed"] = 50
    data["objective"] = objective
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_checked_space(path)


EAGLE = {"mem_fraction_static": 0.86, "--schedule-policy": "fcfs", "--kv-cache-dtype": "auto",
         "--speculative-algorithm": "EAGLE", "--speculative-draft-model-path": "/models/EAGLE3-LLaMA3.1-Instruct-8B",
         "--speculative-num-steps": 3, "--speculative-eagle-topk": 1, "--speculative-num-draft-tokens": 4}
PLAIN = {"mem_fraction_static": 0.86, "--schedule-policy": "lpm", "--kv-cache-dtype": "fp8_e5m2",
         "--speculative-algorithm": None, "--speculative-num-steps": 5}  # a conditional knob it does not search
BROKEN = {**EAGLE, "--speculative-num-steps": 1, "--speculative-num-draft-tokens": 8}


@pytest.mark.slow
def test_speculative_space_for_energy_per_token(tmp_path: Path) -> None:
    space = _speculative(tmp_path, {"kind": "energy_per_token", "level": 4})
    study = _search(space, tmp_path, 4, enqueue=[EAGLE, PLAIN, BROKEN])
    assert study.directions == [optuna.study.StudyDirection.MINIMIZE]
    by_number = {r.number: r for r in records(study)}
    eagle, plain, broken = by_number[0], by_number[1], by_number[2]
    assert eagle.state == TrialState.COMPLETE and eagle.params["--speculative-num-steps"] == 3
    assert "--speculative-num-steps" not in plain.params  # switched off without EAGLE: not searched
    assert eagle.launch_config is not None and eagle.launch_config.flags["--speculative-algorithm"] == "EAGLE"
    assert "--speculative-num-steps" in (eagle.argv or []) and "--speculative-num-steps" not in (plain.argv or [])
    assert "--schedule-policy" in (plain.argv or [])
    assert broken.state == TrialState.PRUNED and broken.outcome == "constraint" and not broken.launched
    for rec in (eagle, plain):
        assert rec.power_w is not None and rec.power_w > 0
        assert rec.energy_per_token_j == pytest.approx(rec.power_w / _throughput(rec, 4), rel=1e-3)
        assert rec.value == pytest.approx(rec.energy_per_token_j)
        assert rec.correctness is not None and rec.correctness.passed  # speculation and FP8 KV keep the answers
    report = report_markdown(StudyView.of(study, space=space))
    assert "J/output token" in report and "energy_per_token_j" in report


@pytest.mark.slow
def test_speculative_space_for_cost_per_mtok(tmp_path: Path) -> None:
    space = _speculative(tmp_path, {"kind": "cost_per_mtok", "level": 4, "slo": {"p99_ttft_ms": 60000}})
    study = _search(space, tmp_path, 2, enqueue=[EAGLE, PLAIN], price=2.5)
    done = [r for r in records(study) if r.state == TrialState.COMPLETE]
    assert len(done) == 2
    for rec in done:
        assert rec.price_per_gpu_hour == 2.5
        assert rec.cost_per_mtok == pytest.approx(2.5 / 3600 / _throughput(rec, 4) * 1e6, rel=1e-3)
        assert rec.value == pytest.approx(rec.cost_per_mtok)
    view = StudyView.of(study, space=space)
    assert view.choice is not None
    assert view.choice.value == min(r.value for r in done if r.value is not None)  # minimised
    report = report_markdown(view)
    assert "per 1M output tokens" in report


def _throughput(rec: TrialFacts, level: int) -> float:
    row = next(lv for lv in rec.levels if lv.max_concurrency == level)
    assert row.output_throughput is not None
    return float(row.output_throughput)
