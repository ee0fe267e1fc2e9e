"""One contract for :class:`runners.engines.base.Engine`, run on every registered engine.

The knob vocabulary a space may name (``spaces.schema.ENGINE_KNOBS``) and each engine's knob->flag table must
agree both ways; every knob renders for every release the engine's knowledge covers; the parser is the shared
base and reads the texts every engine shares; a death with no evidence is a CRASH with its exit code.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from runners import loadgen
from runners.engines import engine_names, get_engine
from runners.engines.base import Engine, LogParser
from runners.engines.common import LogParserBase
from runners.engines.nodes import render_node_script, render_nodes
from runners.engines.script import render, render_script
from runners.errors import ConfigError
from runners.simhost.launch import build_parser
from runners.telemetry import FailureKind, Phase
from spaces.launch import LaunchConfig
from spaces.schema import ENGINE_KNOBS, BoolChoices, EngineSpec, FloatRange, Knobs

OPTIONS: dict[str, dict[str, Any]] = {"sim": {"profile": "p.yaml", "version": "0.5.14"}}
VERSIONS = {
    "sglang": ["0.5.2", "0.5.5", "0.5.13", "0.5.14", "0.5.19", "0.5.20", "0.5.23"],
    "sim": ["0.5.2", "0.5.10", "0.5.14", "0.5.23"],
    "vllm": ["0.10.2", "0.11.0", "0.11.1", "0.32.0", "0.33.0"],
}
TORCH_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
             "of 94.97 GiB of which 1.50 GiB is free.")


@pytest.fixture(params=engine_names())
def engine(request: pytest.FixtureRequest) -> Engine:
    return get_engine(request.param, OPTIONS.get(request.param, {}))


def _value(knob: str) -> Any:
    annotation = str(Knobs.model_fields[knob].annotation)
    if FloatRange.__name__ in annotation:
        return 0.8
    if BoolChoices.__name__ in annotation:
        return True
    return 64


def _launch(engine: Engine, knobs: dict[str, Any]) -> LaunchConfig:
    return LaunchConfig(engine=engine.name, python="/opt/venv/bin/python", model_path="/models/m", port=30000,
                        knobs=knobs, engine_options=OPTIONS.get(engine.name, {}))


def test_engine_satisfies_the_protocol(engine: Engine) -> None:
    assert isinstance(engine, Engine)
    assert engine.bench_api in ("sglang", "openai")
    assert engine.health_path.startswith("/") and all(p.startswith("/") for p in engine.info_paths)
    assert "/opt/py" in engine.version_command("/opt/py")


def test_traits_agree_with_the_space_schema_and_the_load_generator(engine: Engine) -> None:
    spec = EngineSpec.model_validate({"kind": engine.name, "sim": OPTIONS.get(engine.name) and {"profile": "p.yaml"}})
    assert engine.simulated is spec.simulated
    assert engine.bench_api in loadgen.APIS
    # The memory model an engine names is the one whose knob its flag table has.
    knob = {"sglang": "mem_fraction_static", "vllm": "gpu_memory_utilization", None: None}[engine.memory_family]
    assert knob is None or knob in engine.knob_flags


def test_tp_size_reads_every_spelling_of_the_engine(engine: Engine) -> None:
    assert engine.tp_flags and engine.tp_size([]) == 1 and engine.tp_flag(["--port", "8"]) is None
    for flag in engine.tp_flags:
        assert engine.tp_flag(["--trust-remote-code", flag, "4"]) == engine.tp_size([flag, "4"]) == 4
        assert engine.tp_size([f"{flag}=2"]) == 2
        assert engine.tp_flag([flag, "auto"]) is None  # not a size
    other = {"--tp", "--tp-size", "--tensor-parallel-size", "-tp"} - set(engine.tp_flags)
    assert all(engine.tp_flag([flag, "4"]) is None for flag in other)


def test_the_simulated_hosts_parser_reads_the_sglang_tp_spellings() -> None:
    """SimEngine (SGLang's flags) and the simulated host's argparse parser agree on every TP spelling."""
    sim = get_engine("sim", OPTIONS["sim"])
    for flag in sim.tp_flags:
        ns = build_parser("0.5.14").parse_args(["--model-path", "m", flag, "4"])
        assert ns.tp_size == sim.tp_size([flag, "4"]) == 4


def test_every_knob_a_space_can_name_has_a_flag_and_back(engine: Engine) -> None:
    vocabulary = ENGINE_KNOBS[engine.name] - {"nccl"}
    table = set(engine.knob_flags) | set(engine.env_knobs)
    assert table == vocabulary, f"space vocabulary and {engine.name}'s flag table differ: {table ^ vocabulary}"
    for version in VERSIONS[engine.name]:
        for knob in vocabulary:
            flag = engine.knob_flag(knob, version)
            assert flag.startswith("--") or flag in engine.env_knobs.values(), (knob, version, flag)
    with pytest.raises(ConfigError):
        engine.knob_flag("no_such_knob", VERSIONS[engine.name][0])


def test_every_knob_renders_in_every_release(engine: Engine) -> None:
    knobs = {k: _value(k) for k in ENGINE_KNOBS[engine.name] - {"nccl"}}
    launch = _launch(engine, knobs)
    for version in VERSIONS[engine.name]:
        rendered = render(engine, launch, version)
        for knob, value in knobs.items():
            flag = engine.knob_flag(knob, version)
            if flag in engine.env_knobs.values():
                assert rendered.env[flag] == str(value)
            else:
                assert flag in rendered.argv, (knob, version)


def test_rendered_script_is_runnable_bash(engine: Engine, tmp_path: Path) -> None:
    launch = _launch(engine, {}).model_copy(update={"env": {"NCCL_ALGO": "allreduce:tree"}})
    script = render_script(engine, launch, VERSIONS[engine.name][-1], header=["contract"])
    path = tmp_path / "launch.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], check=False).returncode == 0
    assert "export NCCL_ALGO=allreduce:tree" in script


def test_two_nodes_render_one_command_per_rank_with_the_total_tp(engine: Engine) -> None:
    """Every engine spans nodes the same way through :func:`render_nodes`: one command per rank, the head's
    address and the dist-init port on every rank, the rank's own port, the TP size left the total."""
    tp = engine.tp_flags[0]
    launch = _launch(engine, {}).model_copy(update={"fixed_args": (tp, "16"), "nodes": 2})
    version = VERSIONS[engine.name][-1]
    ranks = render_nodes(engine, launch, version, ["127.0.0.2", "127.0.0.3"], 29511, ports=[30000, 30001])
    assert len(ranks) == 2
    for rank, node in enumerate(ranks):
        argv = node.argv
        assert argv[argv.index(tp) + 1] == "16"
        assert argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--node-rank") + 1] == str(rank)
        assert argv[argv.index("--port") + 1] == str(30000 + rank)
        assert "127.0.0.2" in " ".join(argv) and "29511" in " ".join(argv)
        assert "127.0.0.3" not in " ".join(argv)
    one = render_nodes(engine, launch, version, ["127.0.0.2"], 29511)
    assert one[0].argv == render(engine, launch, version).argv  # one node: the single-host command
    with pytest.raises(ConfigError, match="does not divide over 3 nodes"):
        render_nodes(engine, launch, version, ["127.0.0.2", "127.0.0.3", "127.0.0.4"], 29511)
    clash = launch.model_copy(update={"fixed_args": (tp, "16", "--nnodes", "2")})
    with pytest.raises(ConfigError, match="--nnodes"):
        render_nodes(engine, clash, version, ["127.0.0.2", "127.0.0.3"], 29511)


def test_the_per_node_script_takes_the_rank_and_runs_each_ranks_command(engine: Engine, tmp_path: Path) -> None:
    """The exported script of a two-node server: ``serve.sh RANK HEAD [PORT]`` execs exactly the command
    :func:`render_nodes` gives that rank (checked by running it with ``exec`` replaced by ``echo``)."""
    tp = engine.tp_flags[0]
    launch = _launch(engine, {}).model_copy(update={"fixed_args": (tp, "16"), "nodes": 2,
                                                    "env": {"NCCL_ALGO": "Ring"}})
    version = VERSIONS[engine.name][-1]
    path = tmp_path / "serve.sh"
    path.write_text(render_node_script(engine, launch, version, 2, header=["contract"]).replace(
        "\nexec ", "\nprintf '%s\\n' "))
    for rank in (0, 1):
        out = subprocess.run(["bash", str(path), str(rank), "127.0.0.42", "29511"], capture_output=True, text=True,
                             check=True).stdout.splitlines()
        want = render_nodes(engine, launch, version, ["127.0.0.42", "127.0.0.42"], 29511)[rank].argv
        assert out == want
    bad = subprocess.run(["bash", str(path), "2", "127.0.0.42"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "RANK must be 0-1" in bad.stderr


def test_inert_knobs_are_knobs_with_a_reason(engine: Engine) -> None:
    names = ENGINE_KNOBS[engine.name] - {"nccl"}
    for version in [None, *VERSIONS[engine.name]]:
        for knob, why in engine.inert_knobs(version).items():
            assert knob in names or knob.startswith("nccl.NCCL_"), knob
            assert why and "\n" not in why


def test_parser_is_the_shared_base(engine: Engine) -> None:
    parser = engine.parser()
    assert isinstance(parser, LogParser) and isinstance(parser, LogParserBase)
    assert (parser.phase, parser.ready_line, parser.fatal) == (Phase.STARTING, False, None)
    parser.feed("\x1b[32m\x1b[0m\r\n")
    assert parser.fatal is None
    parser.feed(TORCH_OOM)
    assert parser.fatal is not None and parser.fatal.kind is FailureKind.OOM
    assert parser.telemetry.tried_to_allocate_gib == 2.0
    assert parser.telemetry.simulated is (engine.name == "sim")


def test_a_death_without_evidence_is_a_crash_with_its_exit_code(engine: Engine) -> None:
    failure = engine.classify(engine.parser(), 1, "")
    assert failure.kind is FailureKind.CRASH and failure.exit_code == 1


def test_a_flag_the_engine_rejects_is_bad_flag(engine: Engine) -> None:
    parser = engine.parser()
    parser.feed("launch_server.py: error: unrecognized arguments: --bogus 1")
    failure = engine.classify(parser, 2, "")
    assert failure.kind is FailureKind.BAD_FLAG and failure.phase is Phase.STARTING


def test_validate_names_an_inert_knob_in_one_line(tmp_path: Path) -> None:
    from search.cli import app

    space = tmp_path / "space.yaml"
    space.write_text(
        "name: t\nengine: {kind: sglang, python: /usr/bin/python3, version: 0.5.10}\nmodel_path: /m\n"
        "knobs:\n  num_continuous_decode_steps: {choices: [1, 4]}\n"
        "  nccl: {NCCL_PROTO: [unset, LL128], NCCL_ALGO: [unset, 'ring;allreduce:tree']}\n"
        "objective: {metric: output_throughput}\n"
    )
    result = CliRunner().invoke(app, ["validate", str(space)], terminal_width=400)
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "warning:" in line]
    assert len(lines) == 2, result.output
    assert "num_continuous_decode_steps has no effect" in lines[0] and "0.5.2-0.5.23" in lines[0]
    assert "LL128" in lines[1] and "corrupt data" in lines[1]


def test_validate_rejects_a_bare_tree_in_one_line(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("name: t\nengine: {kind: sglang}\nmodel_path: /m\nknobs:\n  nccl: {NCCL_ALGO: [unset, Tree]}\n")
    proc = subprocess.run([sys.executable, "-m", "search", "validate", str(space)], capture_output=True, text=True,
                          check=False, timeout=60, env={**os.environ, "COLUMNS": "400"})
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert "allreduce:tree" in output and "AllGather" in output
    assert len([ln for ln in output.splitlines() if ln.strip()]) == 1, output


def test_every_engine_has_a_flag_table_that_knows_the_flags_servetune_owns(engine: Engine) -> None:
    table = engine.flag_table(None)
    assert table is not None, f"{engine.name} ships no flag table (make flag-tables)"
    assert {"--host", "--port"} <= engine.owned_flags and {"--host", "--port"} <= set(table.flags)
    assert {f for f in engine.tp_flags if f.startswith("--")} <= engine.owned_flags
    for knob in engine.knob_flags:  # every named knob's flag is one the newest release has
        assert engine.knob_flag(knob, table.release) in table.flags, (engine.name, knob)
