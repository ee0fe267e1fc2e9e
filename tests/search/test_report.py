"""The morning report and ``servetune status``, on a study built the way the objective records trials.

The trials come from :mod:`tests.fixtures.trials` (user attrs exactly as ``search/objective.py`` writes them).
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from search.outputs.report import report_markdown
from search.outputs.status import study_status
from search.outputs.text import format_duration
from search.spaces import load_checked_space, sim_calibration
from search.strategy.view import StudyView
from search.trial.records import SIM_CALIBRATION_ATTR
from tests.fixtures.trials import (
    T0,
    build_study,
    level,
    make_trial,
)

# ---- tests ---------------------------------------------------------------------------------------


def test_counts_and_best_configuration(study: optuna.Study) -> None:
    text = report_markdown(StudyView.of(study))
    assert text.startswith("# servetune report: qwen-h100\n")
    assert "Objective: maximize `output_throughput` at concurrency 16." in text
    assert "| 2 | 2 | 1 | 1 | 0 | 6 |" in text  # complete, pruned, failed, running, waiting, total
    assert "Trial 1: `output_throughput` = 2400.0 at concurrency 16" in text
    assert "NVIDIA H100 80GB HBM3 x 4" in text and "sglang 0.5.23" in text
    assert "Free GPU memory after CUDA graph capture: 0.82 GiB. **Thin** (below 2 GiB)" in text
    assert "| `mem_fraction_static` | 0.88 |" in text
    best_levels = text.split("### Figures per concurrency level", 1)[1]
    assert "| concurrency | output tok/s | req/s | mean TTFT ms | p99 TTFT ms |" in best_levels
    assert "| 16 | 2400.0 | 9.38 | 640.0 | 1440.0 | 9.0 | 17.0 | 64 | 0 |" in best_levels


def test_oom_boundary_table(study: optuna.Study) -> None:
    text = report_markdown(StudyView.of(study))
    section = text.split("## OOM boundary", 1)[1].split("## Failures by cause", 1)[0]
    # The grid: fraction down, graph batch size across; FAIL (#4) and RUNNING (#5) are not part of it.
    assert "| mem_fraction_static \\ cuda_graph_max_bs | 128 | 256 |" in section
    assert "| 0.8 | ok |  |" in section
    assert "| 0.88 |  | ok |" in section
    assert "| 0.9 | OOM decode |  |" in section
    assert "| 0.93 |  | OOM cuda_graph |" in section
    assert "| 0.85 |" not in section and "| 64 |" not in section
    # The detail rows: which died where, with what headroom, vs which survived.
    assert "| 0.93 | 256 | OOM | cuda_graph | - | 3.94 | 2.80 | #2 |" in section
    assert "| 0.9 | 128 | OOM | decode | 1.20 | - | - | #3 |" in section
    assert "| 0.88 | 256 | ok | - | 0.82 | - | - | #1 |" in section
    assert "| 0.8 | 128 | ok | - | 4.10 | - | - | #0 |" in section
    assert "kept less than 2 GiB free after capture (#1)" in section


def test_failures_by_cause(study: optuna.Study) -> None:
    text = report_markdown(StudyView.of(study))
    section = text.split("## Failures by cause", 1)[1].split("## Time spent", 1)[0]
    assert "| oom | PRUNED | 2 | cuda_graph, decode | #2: CUDA out of memory in cuda_graph: tried to " \
           "allocate 3.94 GiB with 2.80 GiB free; #3: out of memory in decode" in section
    assert "| host_busy | FAIL | 1 | - | #4: GPU 0 on gpu-b is busy: pid 4242 (python3) holds 20480 MiB |" \
           in section
    assert "1 FAIL trial(s) were infrastructure trouble" in section


def test_time_spent(study: optuna.Study) -> None:
    section = report_markdown(StudyView.of(study)).split("## Time spent", 1)[1]
    assert "trials ran for 15m 44s in all, 3m 09s per trial on average (5 measured)" in section
    assert "ok 10m 20s" in section and "host_busy 4.0s" in section
    assert "wall clock: 2026-11-28 22:00:00 to 2026-11-28 22:19:04" in section


def test_study_status(study: optuna.Study) -> None:
    now = T0 + timedelta(minutes=22)
    data = study_status(StudyView.of(study), n_trials=10, now=now).model_dump()
    assert data["trials"] == {"total": 6, "done": 5, "complete": 2, "pruned": 2, "failed": 1, "running": 1,
                              "waiting": 0, "oom": 2, "search": 4, "confirmations": 0, "skipped": 0,
                              "reused": 0, "died": 2}
    assert data["running"] == [{"number": 5, "host": "gpu-a", "params": {
        "mem_fraction_static": 0.86, "cuda_graph_max_bs": 64, "nccl.NCCL_ALGO": "unset"}, "elapsed_s": 120.0}]
    assert data["best"]["number"] == 1 and data["best"]["value"] == 2400.0
    assert data["best"]["free_after_capture_gib"] == 0.82
    hosts = data["hosts"]
    assert hosts["gpu-a"]["state"] == "running" and hosts["gpu-a"]["trial"] == 5
    assert hosts["gpu-a"]["complete"] == 2 and hosts["gpu-a"]["pruned"] == 2 and hosts["gpu-a"]["trials"] == 5
    assert hosts["gpu-b"]["state"] == "unavailable" and hosts["gpu-b"]["last_outcome"] == "host_busy"
    # budget 10 in COMPLETE+PRUNED: 6 left x mean 188.8 s / 1 worker (the running trial)
    assert data["remaining_trials"] == 6 and data["mean_trial_s"] == 188.8
    assert data["eta_s"] == pytest.approx(6 * 188.8, abs=0.1)
    assert json.loads(json.dumps(data)) == data
    assert study_status(StudyView.of(study)).eta_s is None


def test_status_eta_divides_by_workers(tmp_path: Path) -> None:
    done = make_trial(state=TrialState.COMPLETE, mfs=0.8, cgbs=64, value=1.0, levels=[level(16, 1.0)],
                      duration_s=100)
    study = build_study(f"sqlite:///{tmp_path / 'o.db'}", "s", [done])
    data = study_status(StudyView.of(study), n_trials=5, workers=2, now=T0 + timedelta(minutes=3)).model_dump()
    assert data["hosts"]["gpu-a"]["state"] == "idle" and data["hosts"]["gpu-a"]["last_outcome"] == "ok"
    assert data["remaining_trials"] == 4 and data["eta_s"] == 200.0


def test_empty_study(tmp_path: Path) -> None:
    study = build_study(f"sqlite:///{tmp_path / 'o.db'}", "empty", [])
    text = report_markdown(StudyView.of(study))
    assert "No COMPLETE feasible trial yet." in text
    assert "No trial ran out of memory (0 survived)." in text
    assert "No trial has finished yet." in text


def test_format_duration() -> None:
    assert format_duration(42.5) == "42.5s"
    assert format_duration(125) == "2m 05s"
    assert format_duration(3725) == "1h 02m 05s"


def test_the_verdict_leads_with_the_confirmed_configuration(tmp_path: Path) -> None:
    """With confirmation launches, the verdict names the configuration chosen on its repeated launches and
    the figure `run` and `export` report (the mean of the launches made after the choice), not the
    luckiest single launch (trial 1's 120)."""
    def launch(value: float, mfs: float, **attrs: object) -> optuna.trial.FrozenTrial:
        t = make_trial(state=TrialState.COMPLETE, mfs=mfs, cgbs=128, value=value, levels=[level(16, value)])
        t.user_attrs.update(attrs)
        return t

    trials = [launch(100.0, 0.8), launch(120.0, 0.7), launch(101.0, 0.8, confirmation_of=0),
              launch(70.0, 0.7, confirmation_of=1), *(launch(v, 0.8, confirmation_of=0, final=True)
                                                      for v in (99.0, 100.0, 98.0))]
    text = report_markdown(StudyView.of(build_study(f"sqlite:///{tmp_path / 'c.db'}", "c", trials)))
    verdict = text.split("## Verdict", 1)[1].split("## Figures", 1)[0]
    assert "**Best: trial 0**, `output_throughput` = 99.0 tok/s at concurrency 16" in verdict, verdict
    assert ("**Confirmed by:** 5 launches (trials #0, #2, #4, #5, #6), spread 3.0%; the figure is the mean "
            "of the 3 launches made after it was chosen") in verdict


def test_a_simulated_study_says_what_its_host_is_calibrated_to(tmp_path: Path) -> None:
    line = sim_calibration(load_checked_space(Path(__file__).resolve().parents[2] / "spaces" / "demo-sim.yaml"))
    assert line is not None and line.startswith("dsv4-flash-nvfp4-tp4-rtxpro6000: Seed 003")
    assert "TPOT about 84 ms at C=1" in line and "\n" not in line
    trial = make_trial(state=TrialState.COMPLETE, mfs=0.7, cgbs=64, value=29.0, levels=[level(16, 29.0)],
                       simulated=True)
    study = build_study(f"sqlite:///{tmp_path / 'c.db'}", "calibrated", [trial])
    study.set_user_attr(SIM_CALIBRATION_ATTR, line)
    head = report_markdown(StudyView.of(study)).split("## ", 2)[:2]
    assert f"> The simulated host is calibrated to {line}." in "".join(head)
