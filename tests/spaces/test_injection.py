"""Space files never reach the shell: env keys, fixed args and header text, as table tests.

A refused space is one ConfigError line at load time (so ``validate`` and ``run`` both stop before any
trial). An accepted one renders a launch.sh that, run by a real bash, passes every value through
literally: a recorder stands in for the engine's python, and no marker file appears.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

from runners.engines import engine_for
from runners.engines.script import comment_text, render
from runners.errors import ConfigError
from search.spaces import load_checked_space as load_space
from spaces.guards import bind_flag
from spaces.launch import LaunchConfig

SGLANG = "0.5.10"


def space_data(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "inj",
        "engine": {"kind": "sglang", "python": "/opt/venv/bin/python", "version": SGLANG},
        "model_path": "/models/m",
        "port": 30001,
        "fixed_args": ["--tp", "2"],
        "env": {},
        "knobs": {"mem_fraction_static": {"low": 0.6, "high": 0.9, "step": 0.01},
                  "cuda_graph_max_bs": {"choices": [32, 64]},
                  "nccl": {"NCCL_ALGO": ["unset", "Ring"]}},
    }
    data.update(changes)
    return data


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def refused(tmp_path: Path, data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        load_space(write(tmp_path, data))
    message = str(info.value)
    assert "\n" not in message
    return message


# ---- env keys ------------------------------------------------------------------------------------

BAD_KEYS = ["A B; touch F; X", "A$(touch F)", "1A", "A-B", "A=B", "", "A\nB", "A`id`", "É"]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_env_key_must_be_a_shell_identifier(tmp_path: Path, key: str) -> None:
    message = refused(tmp_path, space_data(env={key: "1"}))
    assert "env" in message and "shell identifier" in message
    assert not (tmp_path / "F").exists()


def test_env_value_with_nul_is_refused(tmp_path: Path) -> None:
    assert "NUL" in refused(tmp_path, space_data(env={"A": "x\0y"}))


def test_env_setting_a_searched_nccl_variable_is_refused(tmp_path: Path) -> None:
    message = refused(tmp_path, space_data(env={"NCCL_ALGO": "allreduce:tree"}))
    assert "NCCL_ALGO" in message and "knob" in message


# ---- fixed args ----------------------------------------------------------------------------------

BIND_SPELLINGS = [
    (["--host=127.0.0.2"], "--host"), (["--host", "127.0.0.2"], "--host"), (["--hos", "127.0.0.2"], "--host"),
    (["--ho=127.0.0.2"], "--host"), (["--h", "x"], "--host"),
    (["--port=1"], "--port"), (["--port", "1"], "--port"), (["--por", "1"], "--port"), (["--po=1"], "--port"),
    (["--p", "1"], "--port"),
    (["--model-path=/other"], "--model-path"), (["--model-pa", "/other"], "--model-path"),
    (["--model", "/other"], "--model"), (["--model=/other"], "--model"), (["--model_path=/other"], "--model-path"),
]


@pytest.mark.parametrize(("args", "flag"), BIND_SPELLINGS)
def test_bind_and_model_flags_are_refused_in_every_spelling(tmp_path: Path, args: list[str], flag: str) -> None:
    message = refused(tmp_path, space_data(fixed_args=["--tp", "2", *args]))
    assert f"fixed_args must not set {flag}" in message, message


@pytest.mark.parametrize("arg", ["--hicache-ratio", "--pp-size", "--page-size=16", "--model-impl", "--mem",
                                 "--host-ip", "-p", "--", "--trust-remote-code", "--served-model-name=$(id)"])
def test_other_flags_are_not_taken_for_bind_flags(arg: str) -> None:
    assert bind_flag(arg) is None


@pytest.mark.parametrize(("args", "needle"), [
    ([""], "empty argument"),
    (["--tp", ""], "empty argument"),
    (["a\0b"], "NUL"),
    (["--mem-fraction-static", "0.7"], "knob 'mem_fraction_static'"),
    (["--mem-fraction-static=0.7"], "knob 'mem_fraction_static'"),
    (["--mem_fraction_static=0.7"], "knob 'mem_fraction_static'"),
    (["--cuda-graph-max-bs", "8"], "knob 'cuda_graph_max_bs'"),
    (["--cuda-graph-max-bs-decode", "8"], "knob 'cuda_graph_max_bs'"),  # the 0.5.14+ spelling of that knob
])
def test_fixed_args_every_trial_would_die_of(tmp_path: Path, args: list[str], needle: str) -> None:
    assert needle in refused(tmp_path, space_data(fixed_args=args))


def test_vllm_knob_flags_in_every_version_spelling(tmp_path: Path) -> None:
    vllm = {"engine": {"kind": "vllm", "python": "python3"},
            "knobs": {"cuda_graph_sizes": {"choices": [8, 16]}, "kv_cache_space_gib": {"choices": [1, 2]}}}
    for flag in ("--cuda-graph-sizes", "--max-cudagraph-capture-size"):
        assert "knob 'cuda_graph_sizes'" in refused(tmp_path, space_data(**vllm, fixed_args=[flag, "8"]))
    assert "VLLM_CPU_KVCACHE_SPACE" in refused(tmp_path, space_data(**vllm, env={"VLLM_CPU_KVCACHE_SPACE": "4"}))


def test_a_flag_of_a_knob_not_searched_is_allowed(tmp_path: Path) -> None:
    space = load_space(write(tmp_path, space_data(fixed_args=["--max-running-requests", "64"])))
    assert space.fixed_args == ["--max-running-requests", "64"]


# ---- what reaches bash is literal ----------------------------------------------------------------

RECORDER = """#!/usr/bin/env bash
printf '%s\\n' "$@" > "$(dirname "$0")/argv"
printf '%s' "$INJ_VALUE" > "$(dirname "$0")/env"
"""


def test_launch_script_passes_hostile_values_literally(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text(RECORDER)
    fake.chmod(0o755)
    hostile = "$(touch M1) `touch M2` ; touch M3 'q\" \\ \n$HOME"
    data = space_data(engine={"kind": "sglang", "python": str(fake), "version": SGLANG},
                      model_path=f"/models/{hostile}",
                      fixed_args=["--served-model-name", hostile, f"--chat-template={hostile}"],
                      env={"INJ_VALUE": hostile})
    space = load_space(write(tmp_path, data))
    launch = LaunchConfig.from_params(space, {"mem_fraction_static": 0.7, "cuda_graph_max_bs": 32,
                                              "nccl.NCCL_ALGO": "Ring"})
    header = ["servetune trial 0 of study x\ntouch M4", "host h\r\ntouch M5\x1b[2J", "gpu\u2028touch M6"]
    rendered = render(engine_for(launch), launch, SGLANG, header=header)
    script = rendered.script
    path = tmp_path / "launch.sh"
    path.write_text(script)
    result = subprocess.run(["bash", str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=30,
                            check=False, env={"PATH": os.environ["PATH"], "HOME": "/nonexistent"})
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "argv").read_text() == "".join(f"{a}\n" for a in rendered.argv[1:])
    assert (tmp_path / "env").read_text() == hostile
    assert sorted(p.name for p in tmp_path.iterdir()) == ["argv", "env", "launch.sh", "python", "space.yaml"]
    lines = script.split("\n")
    assert lines[1:4] == [f"# {comment_text(h)}" for h in header] and lines[4] == "set -euo pipefail"


@pytest.mark.parametrize("text", ["a\nb", "a\rb", "a\x00b", "a\x1bb", "a\u2028b", "a\u2029b", "a\x85b"])
def test_comment_text_is_one_line(text: str) -> None:
    assert comment_text(text) == "a b"
    assert len(f"# {comment_text(text)}".splitlines()) == 1


def test_a_stored_launch_config_with_a_hostile_env_key_is_refused() -> None:
    launch = LaunchConfig(engine="sglang", python="python3", model_path="/m", port=30001, env={"OK": "1"})
    data = launch.model_dump(mode="json")
    data["env"] = {"A B; touch F; X": "1"}
    with pytest.raises(pydantic.ValidationError, match="not a shell identifier"):
        LaunchConfig.model_validate(data)
