"""The open knob vocabulary and coupled knobs: free flags and variables checked against the engine release's own
flag table, conditional knobs, constraints, and how a sampled point becomes a launch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from runners.engines import get_engine
from runners.engines.flags import flag_table, tabled_releases
from runners.errors import ConfigError
from search.cli.describe import describe_space, grid_size
from search.spaces import load_checked_space
from search.strategy.distributions import sample
from search.strategy.memory import memory_class
from spaces.launch import LaunchConfig
from spaces.schema import load_space

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, knobs: dict[str, Any], *, kind: str = "sglang", version: str | None = "0.5.10",
          **extra: Any) -> Path:
    engine: dict[str, Any] = {"kind": kind, "version": version}
    if kind == "sim":
        engine["sim"] = {"profile": str(ROOT / "runners/simhost/profiles/llama31-8b-h100.yaml")}
    data = {"name": "t", "engine": engine, "model_path": "/m", "knobs": knobs,
            "objective": {"metric": "output_throughput", "level": 1}, "workload": {"concurrency": [1]}, **extra}
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def refused(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_checked_space(path)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_tables_ship_for_every_release_servetune_spells_flags_for() -> None:
    assert tabled_releases("sglang") == ["0.5.2", "0.5.5", "0.5.10", "0.5.14", "0.5.20", "0.5.23"]
    assert tabled_releases("vllm") == ["0.10.2", "0.11.0", "0.11.1", "0.33.0"]
    table = flag_table("sglang", "0.5.12")  # between two tabled releases: the older one answers
    assert table is not None and table.release == "0.5.10"
    assert table.flags["--schedule-policy"].choices is not None
    assert table.flags["--enable-torch-compile"].kind == "switch"
    assert flag_table("vllm", None).release == "0.33.0"  # type: ignore[union-attr]


def test_a_free_flag_and_variable_are_searched(tmp_path: Path) -> None:
    space = load_checked_space(write(tmp_path, {
        "flags": {"--schedule-policy": ["lpm", "fcfs"], "--enable-torch-compile": [False, True],
                  "--max-prefill-tokens": {"low": 2048, "high": 8192, "step": 2048}},
        "env": {"SGLANG_ENABLE_TORCH_COMPILE": ["unset", "0"]}}))
    assert set(space.knobs.searched()) == {"--schedule-policy", "--enable-torch-compile", "--max-prefill-tokens",
                                           "env.SGLANG_ENABLE_TORCH_COMPILE"}
    launch = LaunchConfig.from_params(space, {"--schedule-policy": "lpm", "--enable-torch-compile": True,
                                              "--max-prefill-tokens": 4096, "env.SGLANG_ENABLE_TORCH_COMPILE": "0"})
    argv = get_engine("sglang").argv(launch, "0.5.10")
    assert argv[argv.index("--schedule-policy") + 1] == "lpm" and "--enable-torch-compile" in argv
    assert argv[argv.index("--max-prefill-tokens") + 1] == "4096"
    assert launch.env["SGLANG_ENABLE_TORCH_COMPILE"] == "0"
    off = LaunchConfig.from_params(space, {"--enable-torch-compile": False, "env.SGLANG_ENABLE_TORCH_COMPILE": "unset"})
    assert "--enable-torch-compile" not in get_engine("sglang").argv(off, "0.5.10")
    assert "SGLANG_ENABLE_TORCH_COMPILE" not in off.env


@pytest.mark.parametrize("knobs, needle", [
    ({"flags": {"--schedule-polcy": ["lpm"]}}, "--schedule-polcy is not a flag of sglang 0.5.10 (did you mean "
                                                "'--schedule-policy'?)"),
    ({"flags": {"--schedule-policy": ["lpm", "fastest"]}}, "--schedule-policy='fastest': not one of its choices"),
    ({"flags": {"--enable-torch-compile": ["yes"]}}, "a switch takes true (given) or false (left out)"),
    ({"flags": {"--port": [30000, 30001]}}, "servetune sets --port itself"),
    ({"flags": {"--model-path": ["/a", "/b"]}}, "servetune sets --model-path itself"),
    ({"flags": {"--mem-fraction-static": [0.8]}}, "is the named knob mem_fraction_static; search it there"),
    ({"env": {"SGLANG_ENABLE_TORCH_COMPIL": ["1"]}}, "SGLANG_ENABLE_TORCH_COMPIL is not an environment variable "
                                                     "sglang 0.5.10 reads (did you mean 'SGLANG_ENABLE_TORCH_COMPILE'?)"),
    ({"env": {"TMPDIR": ["/tmp"]}}, "servetune sets TMPDIR itself"),
])
def test_what_the_release_would_refuse_is_one_line(tmp_path: Path, knobs: dict[str, Any], needle: str) -> None:
    assert needle in refused(write(tmp_path, knobs))


def test_a_flag_is_checked_against_the_release_on_the_host(tmp_path: Path) -> None:
    # --cuda-graph-max-bs-decode appears in 0.5.14 (its table): refused for 0.5.10, taken for 0.5.14.
    knobs = {"flags": {"--cuda-graph-backend-decode": ["full", "breakable"]}}
    assert "is not a flag of sglang 0.5.10" in refused(write(tmp_path, knobs))
    load_checked_space(write(tmp_path, knobs, version="0.5.14"))
    assert "is not a flag of vllm 0.11.0" in refused(write(tmp_path, {"flags": {"--schedule-policy": ["lpm"]}},
                                                           kind="vllm", version="0.11.0"))


@pytest.mark.parametrize("kind, other", [("sglang", "gpu_memory_utilization"), ("vllm", "mem_fraction_static")])
def test_an_unknown_named_knob_lists_only_that_engines_knobs(tmp_path: Path, kind: str, other: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_space(write(tmp_path, {"schedule_policy": {"choices": [1]}}, kind=kind, version=None))
    message = str(info.value)
    assert f"knobs.schedule_policy: unknown key: not a {kind} knob" in message
    assert "knobs.flags.--schedule-policy" in message and other not in message


SPEC = {"--speculative-algorithm": [None, "EAGLE"],
        "--speculative-num-steps": {"low": 1, "high": 3, "when": {"--speculative-algorithm": "EAGLE"}},
        "--speculative-eagle-topk": {"values": [1, 2], "when": {"--speculative-algorithm": "EAGLE"}},
        "--speculative-num-draft-tokens": {"values": [2, 8], "when": {"--speculative-algorithm": "EAGLE"}}}
CONSTRAINT = "--speculative-num-draft-tokens <= --speculative-num-steps * --speculative-eagle-topk + 1"


def test_conditional_knobs_are_sampled_define_by_run(tmp_path: Path) -> None:
    space = load_checked_space(write(tmp_path, {"flags": SPEC, "constraints": [CONSTRAINT]}, kind="sim"))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    seen = set()
    for _ in range(30):
        trial = study.ask()
        params = sample(trial, space)
        on = params["--speculative-algorithm"] == "EAGLE"
        assert set(trial.params) == set(params)
        assert ("--speculative-num-steps" in params) == on and ("--speculative-eagle-topk" in params) == on
        seen.add(on)
        study.tell(trial, 1.0)
    assert seen == {True, False}
    [constraint] = space.knobs.parsed_constraints()
    assert constraint.holds({"--speculative-num-draft-tokens": 2, "--speculative-num-steps": 1,
                             "--speculative-eagle-topk": 1})
    assert not constraint.holds({"--speculative-num-draft-tokens": 8, "--speculative-num-steps": 1,
                                 "--speculative-eagle-topk": 2})
    assert constraint.holds({"--speculative-algorithm": None})  # knobs left out: it holds
    # 1 without EAGLE + the EAGLE branches that keep the constraint: steps x topk x draft tokens is 12, and 8
    # draft tokens need steps x topk >= 7 (at most 3 x 2): the 6 with 2 draft tokens are kept
    assert grid_size(space) == 1 + 6
    text = "\n".join(describe_space(space))
    assert "  --speculative-algorithm: one of left out (engine default), EAGLE [live]\n" \
           "    when --speculative-algorithm = EAGLE:\n      --speculative-eagle-topk: one of 1, 2 [live]\n" in text
    assert "\n      --speculative-num-steps: 1 to 3 [live]\n" in text
    assert f"constraint: {CONSTRAINT}" in text and "correctness gate: on" in text
    launch = LaunchConfig.from_params(space, {"--speculative-algorithm": None, "--speculative-num-steps": 3})
    assert launch.flags == {"--speculative-algorithm": None}  # a knob its condition switches off is left out


@pytest.mark.parametrize("knobs, needle", [
    ({"flags": {"--speculative-num-steps": {"low": 1, "high": 3, "when": {"--speculative-algo": "EAGLE"}}}},
     "when names --speculative-algo, which is not a searched knob"),
    ({"flags": {**SPEC, "--speculative-eagle-topk": {"values": [1], "when": {"--speculative-algorithm": "MEDUSA"}}}},
     "'MEDUSA' is not one of its values"),
    ({"flags": {"--a": {"values": [1], "when": {"--b": 1}}, "--b": {"values": [1], "when": {"--a": 1}}}},
     "form a cycle"),
    ({"flags": SPEC, "constraints": ["--speculative-num-steps <="]}, "is not LEFT OP RIGHT"),
    ({"flags": SPEC, "constraints": ["--speculative-num-steps < --nope"]}, "--nope is not a searched knob"),
    ({"env": {"NCCL_PROTO": ["LL"]}}, "search NCCL variables under knobs.nccl"),
])
def test_bad_coupling_is_one_line(tmp_path: Path, knobs: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_space(write(tmp_path, knobs))
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_memory_moving_flags_split_the_memory_model() -> None:
    assert memory_class({"mem_fraction_static": 0.8, "--schedule-policy": "lpm"}) == ()
    assert memory_class({"--kv-cache-dtype": "fp8_e5m2", "--speculative-algorithm": None}) == \
        (("--kv-cache-dtype", "fp8_e5m2"),)


def test_the_shipped_speculative_space_validates() -> None:
    space = load_checked_space(ROOT / "spaces" / "sim-speculative.yaml")
    assert space.knobs.conditions() and space.knobs.constraints and space.gate_on
    assert "--schedule-policy" in space.knobs.flags
