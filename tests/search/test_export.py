"""``servetune export``: the script is exactly what the trial ran, with its evidence in the header."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from runners.errors import ConfigError
from search.outputs.export import export_script
from search.strategy.view import StudyView
from search.trial.records import TrialFacts
from tests.fixtures.trials import build_study, level, make_trial, standard_trials, store_facts

NOW = datetime(2026, 11, 29, 7, 30, tzinfo=UTC)


def exec_argv(script: str) -> list[str]:
    lines = [line for line in script.splitlines() if line.startswith("exec ")]
    assert len(lines) == 1
    return shlex.split(lines[0])[1:]


def exports(script: str) -> dict[str, str]:
    out = {}
    for line in script.splitlines():
        if line.startswith("export "):
            key, _, value = line.removeprefix("export ").partition("=")
            out[key] = shlex.split(value)[0]
    return out


def bash_n(tmp_path: Path, script: str) -> None:
    path = tmp_path / "serve.sh"
    path.write_text(script)
    result = subprocess.run([shutil.which("bash") or "/bin/bash", "-n", str(path)], capture_output=True,
                            text=True, timeout=10)
    assert result.returncode == 0, result.stderr


def test_script_is_exactly_what_trial_0_ran(study: optuna.Study, tmp_path: Path) -> None:
    script = export_script(StudyView.of(study), trial=0, now=NOW)
    bash_n(tmp_path, script)
    facts = TrialFacts.from_trial(study.trials[0])
    assert exec_argv(script) == facts.argv
    assert exports(script) == facts.env == {"NCCL_P2P_LEVEL": "NVL", "NCCL_ALGO": "Ring"}
    assert script.startswith("#!/usr/bin/env bash\n# servetune export: study qwen-h100, trial 0\n")
    assert "# exported 2026-11-29T07:30:00+00:00\n" in script
    assert "# engine: sglang 0.5.10\n" in script
    assert "# GPU: NVIDIA H100 80GB HBM3 x 4 on host gpu-a\n" in script
    assert "# objective: output_throughput at concurrency 16 = 2100.00 tok/s (one launch; maximize)\n" in script
    assert "#   c=1: output 180.0 tok/s, 0.70 req/s, TTFT mean 40.0 ms, p99 90.0 ms, TPOT mean 5.25 ms, " \
           "p99 9.50 ms\n" in script
    assert "#   c=16: output 2100.0 tok/s" in script
    assert "# free GPU memory after CUDA graph capture: 4.10 GiB\n" in script
    assert "WARNING" not in script and "SIMULATED" not in script
    # 0.5.10 spells the graph flag --cuda-graph-max-bs; the exec line is last.
    assert "--cuda-graph-max-bs 128" in script and "--cuda-graph-max-bs-decode" not in script
    assert script.splitlines()[-1].startswith("exec /opt/sglang-venv/bin/python -m sglang.launch_server ")


def test_best_by_default_and_thin_headroom_warning(study: optuna.Study, tmp_path: Path) -> None:
    script = export_script(StudyView.of(study), now=NOW)
    bash_n(tmp_path, script)
    assert "# servetune export: study qwen-h100, trial 1\n" in script
    assert exec_argv(script) == TrialFacts.from_trial(study.trials[1]).argv
    assert "--cuda-graph-max-bs-decode 256" in script  # 0.5.23 respelling
    assert "# free GPU memory after CUDA graph capture: 0.82 GiB\n" in script
    assert "# WARNING: only 0.82 GiB free after CUDA graph capture (below 2 GiB): a prefill burst may run " \
           "out of memory" in script


def test_min_free_gib_picks_best_trial_clearing_the_bar(study: optuna.Study) -> None:
    script = export_script(StudyView.of(study), min_free_gib=2.0, now=NOW)
    assert "# servetune export: study qwen-h100, trial 0\n" in script
    assert "WARNING" not in script
    # With an explicit trial the bar only moves the warning.
    assert "(below 5 GiB)" in export_script(StudyView.of(study), trial=0, min_free_gib=5.0, now=NOW)


def test_no_trial_clears_the_bar_names_the_closest(study: optuna.Study) -> None:
    with pytest.raises(ConfigError) as err:
        export_script(StudyView.of(study), min_free_gib=6.0)
    message = str(err.value)
    assert "\n" not in message
    assert "kept 6 GiB free after CUDA graph capture" in message
    assert message.endswith("closest: trial 0 (4.10 GiB), trial 1 (0.82 GiB)")


@pytest.mark.parametrize(("trial", "expected"), [
    (2, "trial 2 of study 'qwen-h100' is PRUNED (oom in cuda_graph): only COMPLETE trials can be exported"),
    (3, "trial 3 of study 'qwen-h100' is PRUNED (oom in decode)"),
    (4, "trial 4 of study 'qwen-h100' is FAIL (host_busy)"),
    (5, "is RUNNING"),
    (42, "study 'qwen-h100' has no trial 42 (trials 0-5)"),
])
def test_unexportable_trials(study: optuna.Study, trial: int, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        export_script(StudyView.of(study), trial=trial)


def test_empty_study_and_negative_bar(tmp_path: Path, study: optuna.Study) -> None:
    empty = build_study(f"sqlite:///{tmp_path / 'o.db'}", "empty", [])
    with pytest.raises(ConfigError, match="has no COMPLETE feasible trial to export yet"):
        export_script(StudyView.of(empty))
    with pytest.raises(ConfigError, match="--min-free-gib must be 0 or more"):
        export_script(StudyView.of(study), min_free_gib=-1)


def test_simulated_trial_says_so(tmp_path: Path) -> None:
    sim = make_trial(state=TrialState.COMPLETE, mfs=0.85, cgbs=64, value=900.0, simulated=True, engine="sim",
                     engine_options={"profile": "profiles/h100x4.yaml", "speed": 200.0, "version": "0.5.10"},
                     memory={"free_after_capture_gib": 1.5}, levels=[level(16, 900.0)])
    study = build_study(f"sqlite:///{tmp_path / 'o.db'}", "sim", [sim])
    script = export_script(StudyView.of(study), trial=0, now=NOW)
    bash_n(tmp_path, script)
    assert "# engine: sim 0.5.10 (SIMULATED)\n" in script
    assert "# NOTE: every figure below is SIMULATED" in script
    assert "# measured (simulated) per concurrency level:\n" in script
    assert "# WARNING: only 1.50 GiB free" in script
    argv = exec_argv(script)
    assert argv == TrialFacts.from_trial(study.trials[0]).argv
    assert argv[1:3] == ["-m", "runners.simhost.server"]


def test_trial_without_launch_config(tmp_path: Path) -> None:
    trial = make_trial(state=TrialState.COMPLETE, mfs=0.85, cgbs=64, value=1.0, levels=[level(16, 1.0)])
    store_facts(trial, TrialFacts.from_trial(trial).model_copy(update={"launch_config": None}))
    study = build_study(f"sqlite:///{tmp_path / 'o.db'}", "old", [trial])
    with pytest.raises(ConfigError, match="trial 0 of study 'old' has no stored launch_config"):
        export_script(StudyView.of(study))


def test_the_header_says_what_min_free_gib_excluded_and_the_gpus_the_server_held(tmp_path: Path) -> None:
    trials = standard_trials()
    # trial 0 ran with --tp 4 on a host of 8 GPUs
    facts = TrialFacts.from_trial(trials[0])
    store_facts(trials[0], facts.model_copy(update={"gpu_count": 8}))
    view = StudyView.of(build_study(f"sqlite:///{tmp_path / 'e.db'}", "bar", trials))
    header = [line for line in export_script(view, min_free_gib=2.0, now=NOW).splitlines() if line.startswith("# ")]
    assert header[0] == "# servetune export: study bar, trial 0"  # trial 1 ranks first but kept 0.82 GiB
    assert ("# --min-free-gib 2: excluded trial(s) 1, which rank above it but kept less than 2 GiB free after CUDA "
            "graph capture") in header
    assert "# GPU: NVIDIA H100 80GB HBM3 x 4; the host has 8 on host gpu-a" in header
