"""Space files: validation, one-line errors naming the path and the allowed range."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest
import yaml

from runners.errors import ConfigError
from spaces.schema import ENGINE_KINDS, ENGINE_KNOBS, EngineSpec, load_space

ROOT = Path(__file__).resolve().parents[2]

BASE = {
    "name": "t",
    "engine": {"kind": "sglang", "python": "/usr/bin/python3"},
    "model_path": "/models/m",
    "knobs": {"mem_fraction_static": {"low": 0.6, "high": 0.9, "step": 0.01}},
}


def write(tmp_path: Path, data: dict) -> Path:
    p = tmp_path / "space.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def with_(path: str, value: object) -> dict:
    data = yaml.safe_load(yaml.safe_dump(BASE))
    node = data
    keys = path.split(".")
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    return data


def test_shipped_spaces_load() -> None:
    for name in ("demo-sim.yaml", "example-sglang-dsv4-tp4.yaml"):
        space = load_space(ROOT / "spaces" / name)
        assert space.target_level == 64


def test_demo_space_resolves_profile_beside_it() -> None:
    space = load_space(ROOT / "spaces" / "demo-sim.yaml")
    assert space.engine.sim is not None
    assert Path(space.engine.sim.profile).is_absolute()
    assert Path(space.engine.sim.profile).exists()


@pytest.mark.parametrize(
    ("path", "value", "needle"),
    [
        ("knobs.mem_fraction_static", {"low": 0.6, "high": 1.2}, "knobs.mem_fraction_static: range [0.6, 1.2] must lie within (0, 1]"),
        ("knobs.mem_fraction_static", {"low": 0.9, "high": 0.6}, "low (0.9) must be <= high (0.6)"),
        ("knobs.bogus", {"choices": [1]}, "knobs.bogus: unknown key"),
        ("surprise", 1, "surprise: unknown key"),
        ("knobs.nccl", {"NCCL_ALGO": ["unset", "Rnig"]}, "NCCL_ALGO=Rnig"),
        ("knobs.nccl", {"NCCL_PROTO": ["LL", "Fast"]}, "NCCL_PROTO value 'fast' is not one of"),
        ("knobs.nccl", {"NCCL_WHATEVER": ["1"]}, "unknown NCCL variable 'NCCL_WHATEVER'"),
        ("knobs.cuda_graph_max_bs", {"choices": [0, 32]}, "choice 0 must be >= 1"),
        ("workload.concurrency", [16, 1], "distinct and increasing"),
        ("objective.level", 128, "objective.level 128 is not one of workload.concurrency"),
        ("budget.timeout", "eight hours", "is not a duration"),
        ("port", 80, "port: Input should be greater than or equal to 1024"),
        ("engine.kind", "tgi", "engine.kind: Input should be 'sglang', 'vllm' or 'sim'"),
        ("fixed_args", ["--port", "1"], "fixed_args must not set --port"),
        ("knobs.gpu_memory_utilization", {"low": 0.5, "high": 0.9}, "not a sglang knob"),
    ],
)
def test_bad_values_are_one_line_with_path(tmp_path: Path, path: str, value: object, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_space(write(tmp_path, with_(path, value)))
    message = str(info.value)
    assert "\n" not in message
    assert needle in message, message
    assert message.startswith(str(tmp_path))


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such space file"):
        load_space(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_space(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="a space file is a YAML mapping"):
        load_space(bad)


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("Tree", "NCCL_ALGO=Tree leaves every collective without Ring, which fails on NCCL 2.32.3 (assumed: the "
                 "newest servetune knows; set engine.nccl, or the run reads the host's; no fallback to Ring since "
                 "2.24: SGLang's TP AllGather has no algorithm): write ring;allreduce:tree"),
        ("allreduce:NVLSTree", "NVLSTree needs more than one node"),
        ("collnet", "'collnet' is invalid since NCCL 2.14"),
    ],
)
def test_illegal_nccl_algo_is_one_line_at_load(tmp_path: Path, value: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_space(write(tmp_path, with_("knobs.nccl", {"NCCL_ALGO": ["unset", value]})))
    assert "\n" not in str(info.value)
    assert needle in str(info.value), str(info.value)


@pytest.mark.parametrize(
    ("kind", "nccl", "env", "fixed", "needle"),
    [
        ("sglang", {"NCCL_ALGO": ["ring;allreduce:nvls"], "NCCL_PROTO": ["unset", "LL"]}, {"NCCL_NVLS_ENABLE": "1"}, [],
         "runs only with the Simple protocol"),
        ("sglang", {"NCCL_ALGO": ["unset", "ring;allreduce:nvls"]}, {}, [], "needs NCCL_NVLS_ENABLE=1: SGLang sets it to 0"),
        ("sim", {"NCCL_ALGO": ["ring;allreduce:nvls"], "NCCL_NVLS_ENABLE": ["unset", "1"]}, {}, [], "needs NCCL_NVLS_ENABLE=1"),
        ("sglang", {"NCCL_PROTO": ["LL"]}, {"NCCL_ALGO": "ring;allreduce:nvls", "NCCL_NVLS_ENABLE": "1"}, [], "Simple"),
        ("sglang", {"NCCL_PROTO": ["LL"]}, {"NCCL_ALGO": "Tree"}, [], "NCCL_ALGO=Tree leaves every collective without Ring"),
        ("sglang", {"NCCL_ALGO": ["ring;allreduce:nvls"], "NCCL_PROTO": ["unset", "Simple"]}, {"NCCL_NVLS_ENABLE": "1"}, [], None),
        ("sglang", {"NCCL_ALGO": ["ring;allreduce:nvls"]}, {}, ["--enable-nccl-nvls"], None),
        ("vllm", {"NCCL_ALGO": ["ring;allreduce:nvls"]}, {}, [], None),
    ],
)
def test_nvls_needs_simple_and_nvls_enable(tmp_path: Path, kind: str, nccl: dict, env: dict, fixed: list,
                                           needle: str | None) -> None:
    data = with_("knobs.nccl", nccl)
    data["engine"]["kind"] = kind
    if kind == "sim":
        data["engine"]["sim"] = {"profile": "p.yaml"}
    if kind == "vllm":
        data["knobs"] = {"max_num_seqs": {"choices": [8]}}
        data["env"] = {"NCCL_ALGO": "allreduce:nvls"}
    else:
        data["env"] = env
    data["fixed_args"] = fixed
    if needle is None:
        load_space(write(tmp_path, data))
        return
    with pytest.raises(ConfigError) as info:
        load_space(write(tmp_path, data))
    assert "\n" not in str(info.value)
    assert needle in str(info.value), str(info.value)


def test_ll128_is_a_warning_that_says_why(tmp_path: Path) -> None:
    space = load_space(write(tmp_path, with_("knobs.nccl", {"NCCL_PROTO": ["unset", "LL128"]})))
    (warning,) = space.warnings()
    assert "LL128" in warning and "corrupt data" in warning and "\n" not in warning
    assert load_space(write(tmp_path, with_("knobs.nccl", {"NCCL_PROTO": ["unset", "^LL128"]}))).warnings() == []


@pytest.mark.parametrize("kind", sorted(ENGINE_KINDS))
def test_engine_spec_answers_what_a_space_asks_of_its_kind(kind: str) -> None:
    spec = EngineSpec.model_validate({"kind": kind, **({"sim": {"profile": "p.yaml"}} if kind == "sim" else {})})
    assert spec.simulated is (kind == "sim")
    assert spec.knobs == ENGINE_KNOBS[kind]
    # SGLang (and the simulated host, which emulates it) turns NVLS off unless --enable-nccl-nvls is given.
    assert spec.nvls_flag == (None if kind == "vllm" else "--enable-nccl-nvls")


def test_every_kind_the_schema_accepts_has_its_traits() -> None:
    kinds = set(get_args(EngineSpec.model_fields["kind"].annotation))
    assert kinds == set(ENGINE_KINDS) == set(ENGINE_KNOBS)


def test_schema_still_exports_what_moved_out() -> None:
    """spaces.nccl, spaces.objective and spaces.units hold these now; spaces.schema keeps their old names."""
    import spaces.nccl
    import spaces.objective
    import spaces.schema
    import spaces.units

    for module in (spaces.nccl, spaces.objective, spaces.units):
        for name in ("UNSET", "check_nccl", "check_nccl_combinations", "NCCL_VARIABLES", "Objective", "Slo",
                     "RateSearch", "OBJECTIVE_UNITS", "PARETO_METRICS", "parse_duration", "parse_size"):
            if hasattr(module, name):
                assert getattr(spaces.schema, name) is getattr(module, name)
    assert set(spaces.schema.__all__) <= set(dir(spaces.schema))
