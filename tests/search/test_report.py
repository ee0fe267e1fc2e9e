"""The morning report and ``servetune status``, on a study built the way the objective records trials.

The trial builders here (:func:`make_trial`, :func:`build_study`) are shared by ``test_export``,
``test_notes`` and ``test_tracking``: they write the user attrs exactly as ``search/objective.py`` does.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta
from io import BytesIO
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.artifacts import FileSystemArtifactStore
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import FrozenTrial, TrialState

from search.records import MEM_PREFIX
from search.report import format_duration, report_markdown, status_data
from spaces.launch import LaunchConfig, render_script

# ---- builders (shared) -------------------------------------------------------------------------------

T0 = datetime(2026, 11, 28, 22, 0, 0)
FIXED_ARGS = ("--tp", "4", "--trust-remote-code", "--moe-runner-backend", "triton")
SPACE_ENV = {"NCCL_P2P_LEVEL": "NVL"}
DISTRIBUTIONS = {
    "mem_fraction_static": FloatDistribution(0.6, 0.95, step=0.01),
    "cuda_graph_max_bs": CategoricalDistribution([64, 128, 256]),
    "nccl.NCCL_ALGO": CategoricalDistribution(["unset", "Ring", "Tree"]),
}
OOM_CUDA_GRAPH_TAIL = "\n".join([
    "[2026-11-28 22:10:01 TP0] Load weight end. type=Qwen3ForCausalLM, avail mem=60.12 GB, "
    "mem usage=15.30 GB.",
    "[2026-11-28 22:10:02 TP0] KV Cache is allocated. #tokens: 421000, K size: 24.10 GB, V size: 24.10 GB",
    "Capturing batches (bs=256 avail_mem=3.10 GB):   4%|▍         | 1/23",
    "[2026-11-28 22:10:05 TP0] Capture cuda graph failed: CUDA out of memory. Tried to allocate 3.94 GiB. "
    "GPU 0 has a total capacity of 79.19 GiB of which 2.80 GiB is free.",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.94 GiB.",
    "[2026-11-28 22:10:05] Received sigquit from a child process. It usually means the child failed.",
])
OOM_DECODE_TAIL = "\n".join([
    "[2026-11-28 22:20:01 TP0] The server is fired up and ready to roll!",
    "[2026-11-28 22:20:09 TP0] Decode batch. #running-req: 16, #token: 9000, token usage: 0.95",
    "[2026-11-28 22:20:10 TP0] Decode out of memory. Try to lower your batch size.",
    "[2026-11-28 22:20:10 TP0] Scheduler hit an exception: Traceback (most recent call last):",
])


def launch_config(mfs: float, cgbs: int, algo: str = "unset", *, engine: str = "sglang",
                  engine_options: dict[str, Any] | None = None) -> LaunchConfig:
    env = dict(SPACE_ENV)
    if algo != "unset":
        env["NCCL_ALGO"] = algo
    return LaunchConfig(
        engine=engine, python="/opt/sglang-venv/bin/python", model_path="/models/Qwen3-30B-A3B",
        port=30000, knobs={"mem_fraction_static": mfs, "cuda_graph_max_bs": cgbs},
        fixed_args=FIXED_ARGS, env=env, engine_options=engine_options or {},
    )


def level(c: int, out_tps: float, *, failed: int = 0) -> dict[str, Any]:
    return {
        "max_concurrency": c, "completed": 64 - failed, "failed": failed, "duration": 30.0,
        "request_throughput": out_tps / 256, "output_throughput": out_tps, "total_throughput": out_tps * 2,
        "mean_ttft_ms": 40.0 * c, "median_ttft_ms": 38.0 * c, "p99_ttft_ms": 90.0 * c,
        "mean_tpot_ms": 5.0 + c / 4, "median_tpot_ms": 5.0 + c / 4, "p99_tpot_ms": 9.0 + c / 2,
    }


def make_trial(*, state: TrialState, mfs: float, cgbs: int, algo: str = "unset",
               version: str | None = "0.5.10", value: float | None = None, outcome: str = "ok",
               phase: str | None = None, reason: str = "",
               memory: dict[str, Any] | None = None, levels: list[dict[str, Any]] | None = None,
               host: str = "gpu-a", log_tail: str = "", artifacts_dir: Path | None = None,
               artifact_ids: dict[str, str] | None = None, simulated: bool = False, engine: str = "sglang",
               engine_options: dict[str, Any] | None = None, start_min: float = 0.0,
               duration_s: float = 300.0, recorded: bool = True, write_files: bool = True) -> FrozenTrial:
    """A trial with the user attrs ``Objective`` writes (``recorded=False``: failed before the server ran).

    With ``artifacts_dir`` the trial's files are written there, unless ``write_files`` is False (a directory
    that is gone).
    """
    params = {"mem_fraction_static": mfs, "cuda_graph_max_bs": cgbs, "nccl.NCCL_ALGO": algo}
    launch = launch_config(mfs, cgbs, algo, engine=engine, engine_options=engine_options)
    attrs: dict[str, Any] = {
        "launch_config": launch.model_dump(mode="json"),
        "engine": engine,
        "objective_metric": "output_throughput",
        "objective_level": 16,
        "host": host,
        "outcome": outcome,
        "phase": phase,
        "reason": reason,
    }
    if recorded:
        assert version is not None
        attrs.update({
            "engine_version": version,
            "gpu_name": "NVIDIA H100 80GB HBM3",
            "gpu_count": 4,
            "argv": launch.argv(version),
            "env": launch.environment(version),
            "run_id": f"study-{uuid.uuid4().hex[:8]}",
            "startup_s": 95.5,
            "stop_method": "sigterm",
            "stop_s": 1.2,
            "simulated": simulated,
            "levels": levels or [],
            "level_reached": max([lv["max_concurrency"] for lv in levels or [] if not lv.get("failed")],
                                 default=0),
            "log_tail": log_tail,
        })
        for key, fig in (memory or {}).items():
            attrs[MEM_PREFIX + key] = fig
        if outcome == "oom" and phase:
            attrs[MEM_PREFIX + "oom_phase"] = phase
        if state != TrialState.COMPLETE:
            attrs["exit_code"] = 1
        if artifacts_dir is not None:
            attrs["artifacts_dir"] = str(artifacts_dir)
            if write_files:
                write_artifacts(artifacts_dir, launch, version, levels or [], log_tail)
        if artifact_ids is not None:
            attrs["artifact_ids"] = artifact_ids
    trial = optuna.trial.create_trial(
        state=state, value=value, params=params, distributions=DISTRIBUTIONS, user_attrs=attrs,
        intermediate_values={lv["max_concurrency"]: lv["output_throughput"] for lv in levels or []},
    )
    trial.datetime_start = T0 + timedelta(minutes=start_min)
    trial.datetime_complete = None if state == TrialState.RUNNING else \
        trial.datetime_start + timedelta(seconds=duration_s)
    return trial


def artifact_files(launch: LaunchConfig, version: str, levels: list[dict[str, Any]],
                   log_tail: str) -> dict[str, str]:
    return {
        "server.log": log_tail + "\n",
        "launch.sh": render_script(launch, version, header=["servetune trial"]),
        "bench.json": json.dumps(levels, indent=2),
        "nvidia-smi.csv": "timestamp,index,name,memory.total [MiB],memory.used [MiB]\n"
                          "1.0,0,H100,81559,70000\n",
    }


def write_artifacts(directory: Path, launch: LaunchConfig, version: str, levels: list[dict[str, Any]],
                    log_tail: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in artifact_files(launch, version, levels, log_tail).items():
        (directory / name).write_text(text)


def store_artifacts(store: FileSystemArtifactStore, files: dict[str, str]) -> dict[str, str]:
    """Put files in Optuna's artifact store as ``upload_artifact`` would; returns ``{name: artifact_id}``."""
    ids = {}
    for name, text in files.items():
        artifact_id = str(uuid.uuid4())
        store.write(artifact_id, BytesIO(text.encode()))
        ids[name] = artifact_id
    return ids


def standard_trials(artifacts: Path | None = None) -> list[FrozenTrial]:
    """#0 ok (0.5.10, 4.1 GiB free), #1 best but thin (0.5.23, 0.82 GiB), #2 OOM in cuda_graph, #3 OOM in
    decode, #4 FAIL host_busy, #5 RUNNING."""
    def adir(n: int) -> Path | None:
        return artifacts / str(n) if artifacts is not None else None

    return [
        make_trial(state=TrialState.COMPLETE, mfs=0.8, cgbs=128, algo="Ring", value=2100.0,
                   memory={"gpu_total_gib": 79.19, "weights_gib": 15.3, "kv_tokens": 380000, "kv_gib": 40.2,
                           "graph_gib": 2.1, "free_after_capture_gib": 4.1, "max_total_num_tokens": 380000},
                   levels=[level(1, 180.0), level(16, 2100.0)], artifacts_dir=adir(0),
                   log_tail="The server is fired up and ready to roll!", start_min=0, duration_s=300),
        make_trial(state=TrialState.COMPLETE, mfs=0.88, cgbs=256, version="0.5.23", value=2400.0,
                   memory={"gpu_total_gib": 79.19, "kv_gib": 46.0, "graph_gib": 3.4,
                           "free_after_capture_gib": 0.82, "max_total_num_tokens": 431000},
                   levels=[level(1, 190.0), level(16, 2400.0)], artifacts_dir=adir(1), start_min=6,
                   duration_s=320),
        make_trial(state=TrialState.PRUNED, mfs=0.93, cgbs=256, outcome="oom", phase="cuda_graph",
                   reason="CUDA out of memory in cuda_graph: tried to allocate 3.94 GiB with 2.80 GiB free",
                   memory={"gpu_total_gib": 79.19, "kv_gib": 48.2, "tried_to_allocate_gib": 3.94,
                           "free_at_oom_gib": 2.8},
                   log_tail=OOM_CUDA_GRAPH_TAIL, artifacts_dir=adir(2), start_min=12, duration_s=120),
        make_trial(state=TrialState.PRUNED, mfs=0.9, cgbs=128, outcome="oom", phase="decode",
                   reason="out of memory in decode: Decode out of memory. Try to lower your batch size.",
                   memory={"gpu_total_gib": 79.19, "free_after_capture_gib": 1.2,
                           "smi_peak_used_mib": 80900.0},
                   levels=[level(1, 185.0), level(16, 0.0, failed=64)], log_tail=OOM_DECODE_TAIL,
                   artifacts_dir=adir(3), start_min=15, duration_s=200),
        make_trial(state=TrialState.FAIL, mfs=0.85, cgbs=64, outcome="host_busy", host="gpu-b",
                   reason="GPU 0 on gpu-b is busy: pid 4242 (python3) holds 20480 MiB", recorded=False,
                   start_min=19, duration_s=4),
        make_trial(state=TrialState.RUNNING, mfs=0.86, cgbs=64, outcome="", recorded=False, start_min=20),
    ]


def build_study(storage_url: str, name: str, trials: list[FrozenTrial]) -> optuna.Study:
    study = optuna.create_study(storage=storage_url, study_name=name, direction="maximize")
    for trial in trials:
        study.add_trial(trial)
    return study


# ---- tests ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> optuna.Study:
    url = f"sqlite:///{tmp_path_factory.mktemp('report') / 'optuna.db'}"
    return build_study(url, "qwen-h100", standard_trials())


def test_counts_and_best_configuration(study: optuna.Study) -> None:
    text = report_markdown(study)
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
    text = report_markdown(study)
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
    text = report_markdown(study)
    section = text.split("## Failures by cause", 1)[1].split("## Time spent", 1)[0]
    assert "| oom | PRUNED | 2 | cuda_graph, decode | #2: CUDA out of memory in cuda_graph: tried to " \
           "allocate 3.94 GiB with 2.80 GiB free; #3: out of memory in decode" in section
    assert "| host_busy | FAIL | 1 | - | #4: GPU 0 on gpu-b is busy: pid 4242 (python3) holds 20480 MiB |" \
           in section
    assert "1 FAIL trial(s) were infrastructure trouble" in section


def test_time_spent(study: optuna.Study) -> None:
    section = report_markdown(study).split("## Time spent", 1)[1]
    assert "trials ran for 15m 44s in all, 3m 09s per trial on average (5 measured)" in section
    assert "ok 10m 20s" in section and "host_busy 4.0s" in section
    assert "wall clock: 2026-11-28 22:00:00 to 2026-11-28 22:19:04" in section


def test_status_data(study: optuna.Study) -> None:
    now = T0 + timedelta(minutes=22)
    data = status_data(study, n_trials=10, now=now)
    assert data["trials"] == {"total": 6, "done": 5, "complete": 2, "pruned": 2, "failed": 1, "running": 1,
                              "waiting": 0, "oom": 2}
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
    assert status_data(study)["eta_s"] is None


def test_status_eta_divides_by_workers(tmp_path: Path) -> None:
    done = make_trial(state=TrialState.COMPLETE, mfs=0.8, cgbs=64, value=1.0, levels=[level(16, 1.0)],
                      duration_s=100)
    study = build_study(f"sqlite:///{tmp_path / 'o.db'}", "s", [done])
    data = status_data(study, n_trials=5, workers=2, now=T0 + timedelta(minutes=3))
    assert data["hosts"]["gpu-a"]["state"] == "idle" and data["hosts"]["gpu-a"]["last_outcome"] == "ok"
    assert data["remaining_trials"] == 4 and data["eta_s"] == 200.0


def test_empty_study(tmp_path: Path) -> None:
    study = build_study(f"sqlite:///{tmp_path / 'o.db'}", "empty", [])
    text = report_markdown(study)
    assert "No COMPLETE feasible trial yet." in text
    assert "No trial ran out of memory (0 survived)." in text
    assert "No trial has finished yet." in text


def test_format_duration() -> None:
    assert format_duration(42.5) == "42.5s"
    assert format_duration(125) == "2m 05s"
    assert format_duration(3725) == "1h 02m 05s"
