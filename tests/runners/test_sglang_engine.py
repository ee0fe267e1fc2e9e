"""SGLang and simulated-host engines: version probe, argv per version, environment, registry."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from runners.engines import engine_names, get_engine
from runners.engines.base import Engine, LaunchLike
from runners.engines.common import parse_version
from runners.engines.sglang import SGLangEngine
from runners.engines.sim import SimEngine
from runners.errors import ConfigError


@dataclass(frozen=True)
class Launch:
    engine: str = "sglang"
    python: str = "/opt/venv/bin/python"
    model_path: str = "Qwen/Qwen3-8B"
    host: str = "127.0.0.1"
    port: int = 30000
    knobs: Mapping[str, Any] = field(default_factory=dict)
    flags: Mapping[str, Any] = field(default_factory=dict)
    fixed_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    engine_options: Mapping[str, Any] = field(default_factory=dict)


BASE = ["/opt/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B",
        "--host", "127.0.0.1", "--port", "30000"]


def test_fake_launch_and_engines_satisfy_the_protocols() -> None:
    assert isinstance(Launch(), LaunchLike)
    assert isinstance(SGLangEngine(), Engine)
    assert isinstance(SimEngine("p.yaml"), Engine)


def test_engine_attributes() -> None:
    e = SGLangEngine()
    assert (e.name, e.bench_api, e.health_path, e.needs_ready_line) == ("sglang", "sglang", "/health", True)
    assert e.scratch_vars == ("TMPDIR",)
    s = SimEngine("p.yaml")
    assert (s.name, s.bench_api, s.health_path, s.needs_ready_line) == ("sim", "sglang", "/health", True)


@pytest.mark.parametrize(("text", "expected"), [
    ("0.5.10.post1", (0, 5, 10)), ("0.5.2", (0, 5, 2)), ("0.5.23", (0, 5, 23)), ("0.5.3rc0", (0, 5, 3)),
    ("0.5.15.dev12+g1234abc", (0, 5, 15)), ("v0.5.20", (0, 5, 20)), ("0.5", (0, 5, 0)),
    (" 0.5.13\n", (0, 5, 13)),
])
def test_parse_version(text: str, expected: tuple[int, int, int]) -> None:
    assert parse_version(text) == expected


@pytest.mark.parametrize("text", ["", "sglang", "five", "None"])
def test_unparseable_version_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match="version"):
        parse_version(text)
    with pytest.raises(ConfigError):
        SGLangEngine().argv(Launch(), text)


def test_version_command() -> None:
    assert SGLangEngine().version_command("/opt/venv/bin/python") == (
        '/opt/venv/bin/python -c "import sglang; print(sglang.__version__)"')
    assert SGLangEngine().version_command("/opt/my env/python").startswith("'/opt/my env/python' -c ")


@pytest.mark.parametrize(("version", "flag"), [
    ("0.5.2", "--cuda-graph-max-bs"),
    ("0.5.10.post1", "--cuda-graph-max-bs"),
    ("0.5.13", "--cuda-graph-max-bs"),
    ("0.5.15", "--cuda-graph-max-bs-decode"),
    ("0.5.20", "--cuda-graph-max-bs-decode"),
    ("0.5.23", "--cuda-graph-max-bs-decode"),
])
def test_cuda_graph_flag_per_version(version: str, flag: str) -> None:
    argv = SGLangEngine().argv(Launch(knobs={"cuda_graph_max_bs": 32}), version)
    assert argv == [*BASE, flag, "32"]


def test_all_knobs_in_order_floats_short_none_omitted_fixed_args_last() -> None:
    launch = Launch(
        knobs={"mem_fraction_static": 0.7, "cuda_graph_max_bs": None, "num_continuous_decode_steps": 4,
               "max_running_requests": 64.0, "chunked_prefill_size": -1},
        fixed_args=("--tp-size", "2", "--enable-metrics"),
    )
    assert SGLangEngine().argv(launch, "0.5.10") == [
        *BASE, "--mem-fraction-static", "0.7", "--num-continuous-decode-steps", "4",
        "--max-running-requests", "64", "--chunked-prefill-size", "-1", "--tp-size", "2", "--enable-metrics",
    ]


@pytest.mark.parametrize(("value", "text"), [(0.7, "0.7"), (0.62, "0.62"), (0.123456, "0.1235"),
                                             (0.8500000001, "0.85"), (1, "1.0"), (0.1 + 0.2, "0.3")])
def test_float_rendering(value: float, text: str) -> None:
    argv = SGLangEngine().argv(Launch(knobs={"mem_fraction_static": value}), "0.5.2")
    assert argv[-2:] == ["--mem-fraction-static", text]


def test_unknown_knob_names_it_and_the_allowed_ones() -> None:
    with pytest.raises(ConfigError) as err:
        SGLangEngine().argv(Launch(knobs={"gpu_memory_utilization": 0.9}), "0.5.10")
    message = str(err.value)
    assert "gpu_memory_utilization" in message
    assert "mem_fraction_static" in message and "cuda_graph_max_bs" in message


@pytest.mark.parametrize(("knob", "value"), [("max_running_requests", 1.5), ("cuda_graph_max_bs", "16"),
                                             ("mem_fraction_static", True)])
def test_bad_knob_values(knob: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=knob):
        SGLangEngine().argv(Launch(knobs={knob: value}), "0.5.10")


def test_fixed_args_may_not_repeat_a_searched_flag() -> None:
    launch = Launch(knobs={"mem_fraction_static": 0.8}, fixed_args=("--mem-fraction-static=0.9",))
    with pytest.raises(ConfigError, match="--mem-fraction-static"):
        SGLangEngine().argv(launch, "0.5.10")


def test_environment_is_the_launch_env() -> None:
    env = {"NCCL_P2P_DISABLE": "1", "NCCL_PROTO": "Simple"}
    got = SGLangEngine().environment(Launch(env=env), "0.5.10")
    assert got == env and got is not env


def test_sim_argv_prepends_sim_flags() -> None:
    engine = SimEngine("/profiles/h100.yaml", speed=200, version="0.5.23", extra={"sim-seed": "7"})
    argv = engine.argv(Launch(knobs={"mem_fraction_static": 0.85, "cuda_graph_max_bs": 16}), "0.5.23")
    assert argv == [
        "/opt/venv/bin/python", "-m", "runners.simhost.server",
        "--sim-profile", "/profiles/h100.yaml", "--sim-speed", "200.0", "--sim-version", "0.5.23",
        "--sim-seed", "7",
        "--model-path", "Qwen/Qwen3-8B", "--host", "127.0.0.1", "--port", "30000",
        "--mem-fraction-static", "0.85", "--cuda-graph-max-bs-decode", "16",
    ]


@pytest.mark.parametrize("kwargs", [{"profile": ""}, {"profile": "p", "speed": 0},
                                    {"profile": "p", "version": "x"}])
def test_sim_bad_options(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        SimEngine(**kwargs)


def test_sim_version_command_fails_without_the_simhost_and_prints_the_version_with_it(tmp_path: Path) -> None:
    engine = SimEngine("p.yaml", version="0.5.15")
    res = subprocess.run(["bash", "-c", engine.version_command(sys.executable)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "0.5.15"
    # A python that cannot import the simulated host: this one without site-packages (where servetune is
    # installed), run outside the repository and without PYTHONPATH.
    bare = tmp_path / "python-without-servetune"
    bare.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -S "$@"\n')
    bare.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    res = subprocess.run(["bash", "-c", engine.version_command(str(bare))], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path, env=env)
    assert res.returncode != 0
    assert "No module named 'runners'" in res.stderr
    assert "0.5.15" not in res.stdout
    missing = SimEngine("p.yaml").version_command("/nonexistent/python")
    assert subprocess.run(["bash", "-c", missing], capture_output=True, timeout=60).returncode != 0


def test_registry() -> None:
    assert engine_names() == ["sglang", "sim", "vllm"]
    assert isinstance(get_engine("sglang", {}), SGLangEngine)
    sim = get_engine("sim", {"profile": "p.yaml", "speed": 50, "seed": 3, "version": "0.5.13"})
    assert isinstance(sim, SimEngine)
    assert (sim.profile, sim.speed, sim.version, sim.extra) == ("p.yaml", 50.0, "0.5.13", {"sim-seed": "3"})
    with pytest.raises(ConfigError, match="allowed: sglang, sim, vllm"):
        get_engine("tgi", {})
    with pytest.raises(ConfigError, match="profile"):
        get_engine("sim", {})
    with pytest.raises(ConfigError, match="unknown option"):
        get_engine("sglang", {"profile": "p.yaml"})


def test_launch_config_renders_through_the_engine() -> None:
    from runners.engines import engine_for
    from runners.engines.script import render, render_script
    from spaces.launch import LaunchConfig

    launch = LaunchConfig(engine="sglang", python="/opt/venv/bin/python", model_path="Qwen/Qwen3-8B",
                          port=30000,
                          knobs={"mem_fraction_static": 0.62, "cuda_graph_max_bs": 8},
                          env={"NCCL_P2P_DISABLE": "1"})
    engine = engine_for(launch)
    assert render(engine, launch, "0.5.20").argv[-4:] == ["--mem-fraction-static", "0.62", "--cuda-graph-max-bs-decode", "8"]
    script = render_script(engine, launch, "0.5.2")
    assert "export NCCL_P2P_DISABLE=1" in script
    assert script.rstrip().endswith("--mem-fraction-static 0.62 --cuda-graph-max-bs 8")
