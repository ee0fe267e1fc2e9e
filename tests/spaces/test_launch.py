"""The launch config is frozen; runners.engines.script renders it (argv/env/script) per engine version, every
value quoted."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pydantic
import pytest

from runners.engines import engine_for
from runners.engines.script import render, render_script
from search.strategy.distributions import distributions
from spaces.launch import LaunchConfig
from spaces.schema import Space

SPACE = Space.model_validate({
    "name": "t",
    "engine": {"kind": "sglang", "python": "/opt/venv/bin/python"},
    "model_path": "/models/My Model",
    "port": 30001,
    "fixed_args": ["--tp", "4", "--trust-remote-code"],
    "env": {"CUDA_VISIBLE_DEVICES": "0,1,2,3"},
    "knobs": {
        "mem_fraction_static": {"low": 0.6, "high": 0.9, "step": 0.01},
        "cuda_graph_max_bs": {"choices": [32, 64]},
        "nccl": {"NCCL_PROTO": ["unset", "LL"], "NCCL_ALGO": ["unset", "Ring"]},
    },
})

PARAMS = {"mem_fraction_static": 0.62, "cuda_graph_max_bs": 64, "nccl.NCCL_PROTO": "LL",
          "nccl.NCCL_ALGO": "unset"}


def test_from_params_is_frozen_and_round_trips() -> None:
    launch = LaunchConfig.from_params(SPACE, PARAMS)
    assert launch.env == {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "NCCL_PROTO": "LL"}  # "unset" left out
    with pytest.raises(pydantic.ValidationError):
        launch.port = 1  # type: ignore[misc]
    again = LaunchConfig.model_validate(launch.model_dump(mode="json"))
    assert again == launch


@pytest.mark.parametrize(
    ("version", "flag"),
    [("0.5.2", "--cuda-graph-max-bs"), ("0.5.10", "--cuda-graph-max-bs"), ("0.5.13", "--cuda-graph-max-bs"),
     ("0.5.14", "--cuda-graph-max-bs-decode"), ("0.5.15", "--cuda-graph-max-bs-decode"), ("0.5.20", "--cuda-graph-max-bs-decode"),
     ("0.5.23", "--cuda-graph-max-bs-decode")],
)
def test_cuda_graph_flag_spelling_follows_version(version: str, flag: str) -> None:
    launch = LaunchConfig.from_params(SPACE, PARAMS)
    argv = render(engine_for(launch), launch, version).argv
    assert argv[:3] == ["/opt/venv/bin/python", "-m", "sglang.launch_server"]
    assert argv[argv.index(flag) + 1] == "64"
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.62"
    assert argv[argv.index("--model-path") + 1] == "/models/My Model"
    assert argv[argv.index("--port") + 1] == "30001"


def test_script_is_quoted_runnable_bash(tmp_path: Path) -> None:
    launch = LaunchConfig.from_params(SPACE, PARAMS)
    script = render_script(engine_for(launch), launch, "0.5.10", header=["study t, trial 3"])
    path = tmp_path / "launch.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], check=False).returncode == 0
    assert "# study t, trial 3" in script
    assert "export NCCL_PROTO=LL" in script
    assert "NCCL_ALGO" not in script
    last = script.strip().splitlines()[-1]
    assert last.startswith("exec ")
    assert shlex.split(last)[1:] == render(engine_for(launch), launch, "0.5.10").argv
    assert "'/models/My Model'" in last


def test_nodes_fixed_or_searched_reach_the_launch_and_the_distributions() -> None:
    fixed = SPACE.model_copy(update={"nodes": 2})
    assert fixed.node_counts == [2] and fixed.max_nodes == 2
    assert LaunchConfig.from_params(fixed, PARAMS).nodes == 2
    assert "nodes" not in distributions(fixed)
    searched = Space.model_validate({**SPACE.model_dump(exclude={"nodes"}), "nodes": {"choices": [1, 2]}})
    assert searched.node_counts == [1, 2] and searched.max_nodes == 2
    assert list(distributions(searched)["nodes"].choices) == [1, 2]
    launch = LaunchConfig.from_params(searched, {**PARAMS, "nodes": 2})
    assert launch.nodes == 2 and "nodes" not in launch.knobs
    assert LaunchConfig.model_validate_json(launch.model_dump_json()) == launch
    assert LaunchConfig.from_params(SPACE, PARAMS).nodes == 1


@pytest.mark.parametrize("nodes", [0, 17, {"choices": [1, None]}])
def test_a_bad_node_count_is_refused(nodes: object) -> None:
    with pytest.raises(pydantic.ValidationError, match="nodes"):
        Space.model_validate({**SPACE.model_dump(exclude={"nodes"}), "nodes": nodes})
