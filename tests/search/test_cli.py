"""The CLI a user expects (issue 13, items 4 and 5), driven through Typer's CliRunner: validate in words,
run --dry-run, did-you-mean, "simulated" on every simulated figure, the final table in 100 columns, help
texts, hosts check's error column, and export --engine sglang for a study tuned on the simulated host."""

from __future__ import annotations

import io
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
import typer
import yaml
from optuna.trial import TrialState
from pydantic import ValidationError
from rich.console import Console
from typer.testing import CliRunner

from runners.errors import ConfigError, HostUnreachable, ServetuneError
from search.cli import app
from search.strategy.view import StudyView
from search.trial.records import DEPLOY_ATTR, TrialFacts
from tests.fixtures.trials import build_study, level, make_trial, store_facts
from tests.search.test_export import bash_n, exec_argv, exports

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "spaces" / "demo-sim.yaml"
SIM_OPTIONS = {"profile": str(ROOT / "runners/simhost/profiles/dsv4-flash-nvfp4-tp4-rtxpro6000.yaml"),
               "speed": 100.0, "version": "0.5.10"}


def invoke(*args: str, width: int = 400) -> tuple[int, str]:
    """Run ``servetune ARGS`` as ``search.cli.commands.main`` does: an expected error is one line and exit 1."""
    result = CliRunner().invoke(app, list(args), terminal_width=width)
    if isinstance(result.exception, ServetuneError):
        return 1, result.output + f"servetune: error: {' '.join(str(result.exception).split())}\n"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def demo_space(tmp_path: Path, **changes: object) -> Path:
    data = yaml.safe_load(DEMO.read_text())
    data["engine"]["sim"]["profile"] = SIM_OPTIONS["profile"]
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# ---- validate ---------------------------------------------------------------------------------------


def test_validate_says_the_space_in_words(tmp_path: Path) -> None:
    code, out = invoke("validate", str(demo_space(tmp_path)))
    assert code == 0, out
    assert "engine sim 0.5.10 (SIMULATED GPU host" in out
    assert "  mem_fraction_static: 0.55 to 0.88 in steps of 0.01 [live]" in out
    assert "  cuda_graph_max_bs: one of 16, 32, 48, 64, 80 [live]" in out
    assert "  num_continuous_decode_steps: one of 1, 2, 4 [inert" in out
    # 34 memory fractions x 5 graph sizes x 3 protocols x 3 algorithms; the inert knob is not searched
    assert "grid: 1530 configuration(s)" in out
    assert "workload: random prompts, 256 input / 96 output tokens; levels C=1 (2 requests), C=16 (16 " \
           "requests), C=64 (64 requests)" in out
    assert "objective: maximise output_throughput (tok/s) at concurrency 64" in out
    assert "budget: 14 trials, no time limit" in out
    probe = next(line for line in out.splitlines() if line.startswith("first launch (the probe): "))
    argv = shlex.split(probe.removeprefix("first launch (the probe): "))
    assert argv[1:3] == ["-m", "runners.simhost.server"]
    # SGLang's default arithmetic with twice its reserve, on the simulated host's 97,887 MiB cards
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.69"
    assert argv[argv.index("--cuda-graph-max-bs") + 1] == "80"


def test_validate_says_a_searched_node_count_and_counts_it_in_the_grid(tmp_path: Path) -> None:
    path = demo_space(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["nodes"] = {"choices": [1, 2]}
    path.write_text(yaml.safe_dump(data))
    code, out = invoke("validate", str(path))
    assert code == 0, out
    assert "nodes: searched over 1, 2; one rank per node" in out
    assert "grid: 3060 configuration(s)" in out  # the demo's 1530, at one node or two


def test_validate_refuses_a_space_with_no_objective(tmp_path: Path) -> None:
    code, out = invoke("validate", str(demo_space(tmp_path, objective=None)))
    assert code == 1
    assert "objective: missing" in out and "output_throughput" in out


def test_validate_refuses_a_missing_simulated_host_profile(tmp_path: Path) -> None:
    path = demo_space(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["engine"]["sim"]["profile"] = "profiles/nowhere.yaml"
    path.write_text(yaml.safe_dump(data))
    code, out = invoke("validate", str(path))
    assert code == 1
    assert "engine.sim.profile: no such simulated-host profile profiles/nowhere.yaml" in out


def test_validate_grid_of_a_continuous_range(tmp_path: Path) -> None:
    path = demo_space(tmp_path, knobs={"mem_fraction_static": {"low": 0.6, "high": 0.8}})
    code, out = invoke("validate", str(path))
    assert code == 0, out
    assert "  mem_fraction_static: any value from 0.6 to 0.8 (continuous) [live]" in out
    assert "grid: continuous" in out


# ---- did you mean -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("section", "bad", "good"), [
    ("workload", "concurency", "concurrency"),
    ("objective", "levle", "level"),
    ("knobs", "mem_fraction_statik", "mem_fraction_static"),
])
def test_a_misspelt_key_in_a_space_file_gets_a_suggestion(tmp_path: Path, section: str, bad: str, good: str) -> None:
    path = demo_space(tmp_path)
    data = yaml.safe_load(path.read_text())
    data[section][bad] = data[section].pop(good)
    path.write_text(yaml.safe_dump(data))
    code, out = invoke("validate", str(path))
    assert code == 1
    assert f"{section}.{bad}: unknown key (did you mean '{good}'?)" in out


def test_a_misspelt_top_level_key_and_nccl_variable(tmp_path: Path) -> None:
    code, out = invoke("validate", str(demo_space(tmp_path, budgett={"n_trials": 3})))
    assert code == 1 and "budgett: unknown key (did you mean 'budget'?)" in out
    path = demo_space(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["knobs"]["nccl"]["NCCL_PROT"] = data["knobs"]["nccl"].pop("NCCL_PROTO")
    path.write_text(yaml.safe_dump(data))
    code, out = invoke("validate", str(path))
    assert code == 1 and "unknown NCCL variable 'NCCL_PROT' (did you mean 'NCCL_PROTO'?)" in out


def test_a_misspelt_key_in_an_inventory_gets_a_suggestion(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("hosts:\n  - {name: a, adress: 127.0.0.1}\n")
    code, out = invoke("run", str(demo_space(tmp_path)), "--inventory", str(inventory), "--dry-run")
    assert code == 1
    assert "unknown key 'adress' in hosts[0] (did you mean 'address'?)" in out


# ---- run --dry-run ----------------------------------------------------------------------------------


def test_dry_run_shows_the_first_launches_and_writes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "optuna.db"
    code, out = invoke("run", str(demo_space(tmp_path)), "--dry-run", "--storage", f"sqlite:///{db}",
                       "--host", "gpu-a", "--host", "bob@gpu-b:2222", "-n", "5")
    assert code == 0, out
    assert "dry run: nothing is launched and nothing is written (SIMULATED" in out
    assert "study demo-sim-dsv4; budget 5 trials" in out
    assert "hosts: gpu-a, gpu-b:2222" in out
    labels = [line.split(":")[0] for line in out.splitlines() if re.match(r"^(probe|start-up \d+): ", line)]
    assert labels == ["probe", "start-up 1", "start-up 2"]
    commands = [shlex.split(line) for line in out.splitlines() if line.startswith("  ")]
    assert len(commands) == 3 and all("runners.simhost.server" in c for c in commands)
    # the first start-up launch is the probe's configuration at the fraction the memory model places from the
    # probe's figures: said so, never a placeholder value that would not run as shown
    base = commands[1]
    assert base[base.index("--mem-fraction-static") + 1] == "<set after the probe>"
    assert "mem_fraction_static=<set after the probe>" in out and "None" not in out
    assert "NCCL_ALGO=ring" in commands[2][0]
    assert not db.exists() and not (tmp_path / "artifacts").exists()
    assert "free loopback port" not in out


def test_dry_run_of_a_study_with_trials_says_it_resumes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    build_study(url, "demo-sim-dsv4", [make_trial(state=TrialState.COMPLETE, mfs=0.6, cgbs=64, value=1.0)])
    code, out = invoke("run", str(demo_space(tmp_path)), "--dry-run", "--storage", url)
    assert code == 0, out
    assert "the study holds 1 trial(s): the run resumes it" in out
    assert "probe:" not in out
    # On this machine the built-in host picks its port per launch: the dry run says so (the remote hosts of
    # the test above bind the space's port, and it says nothing there).
    assert "binds a free loopback port for each launch" in out
    after = optuna.load_study(study_name="demo-sim-dsv4", storage=url)
    assert len(after.trials) == 1 and after.user_attrs == {}  # a run would have stored its space's attrs


# ---- "simulated" on every simulated figure; the table in 100 columns ----------------------------------


@pytest.fixture(scope="module")
def sim_study(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, optuna.Study]:
    """A study tuned on the simulated host (TP 4), its python servetune's own, as ``make demo`` leaves one."""
    url = f"sqlite:///{tmp_path_factory.mktemp('sim') / 'optuna.db'}"
    common = {"simulated": True, "engine": "sim", "engine_options": SIM_OPTIONS, "python": sys.executable}
    trials = [
        make_trial(state=TrialState.COMPLETE, mfs=0.62, cgbs=64, value=1500.0, algo="Ring",
                   memory={"free_after_capture_gib": 6.5, "gpu_total_gib": 94.97},
                   levels=[level(1, 100.0), level(16, 1500.0)], **common),  # type: ignore[arg-type]
        make_trial(state=TrialState.PRUNED, mfs=0.88, cgbs=256, outcome="oom", phase="cuda_graph",
                   reason="CUDA out of memory in cuda_graph: tried to allocate 3.94 GiB with 2.80 GiB free "
                          "(simulated)", start_min=6, **common),  # type: ignore[arg-type]
    ]
    study = build_study(url, "demo-sim-dsv4", trials)
    study.set_user_attr(DEPLOY_ATTR, {"python": "/opt/sglang/bin/python", "port": 30000})
    return url, study


@pytest.mark.parametrize(("command", "says"), [
    (["trials"], "servetune trials (simulated host: every figure is simulated)"),
    (["status"], "1500.0 tok/s (output_throughput at C=16) (simulated)"),
    (["report"], "= 1500.0 tok/s at concurrency 16 (simulated)"),
    (["export"], "# NOTE: every figure below is SIMULATED"),
    (["export", "--engine", "sglang"], "# NOTE: every figure below is SIMULATED"),
])
def test_every_simulated_figure_says_so(sim_study: tuple[str, optuna.Study], command: list[str], says: str) -> None:
    url, _ = sim_study
    code, out = invoke(*command, "--study", "demo-sim-dsv4", "--storage", url)
    assert code == 0, out
    assert says in " ".join(out.split()), out


def test_status_head_says_simulated(sim_study: tuple[str, optuna.Study]) -> None:
    url, _ = sim_study
    code, out = invoke("status", "--study", "demo-sim-dsv4", "--storage", url)
    assert code == 0, out
    best = next(line for line in out.splitlines() if line.startswith("best:"))
    assert "1500.0 tok/s (output_throughput at C=16) (simulated)" in best  # the metric and unit with the value


def test_status_counts_search_confirmations_skips_and_deaths_apart(tmp_path: Path) -> None:
    from search.trial.records import FACTS_ATTR

    def tagged(trial: optuna.trial.FrozenTrial, **tags: object) -> optuna.trial.FrozenTrial:
        trial.system_attrs = {**trial.system_attrs, FACTS_ATTR: {**trial.system_attrs[FACTS_ATTR], **tags}}
        return trial

    ok = [make_trial(state=TrialState.COMPLETE, mfs=0.8, cgbs=128, value=2000.0 + i, levels=[level(16, 2000.0)],
                     start_min=i) for i in range(3)]
    confirm = [tagged(make_trial(state=TrialState.COMPLETE, mfs=0.8, cgbs=128, value=2010.0 + i,
                                 levels=[level(16, 2000.0)], start_min=5 + i), confirmation_of=0) for i in range(2)]
    oom = [make_trial(state=TrialState.PRUNED, mfs=0.93, cgbs=256, outcome="oom", phase="cuda_graph", start_min=9)]
    skips = [make_trial(state=TrialState.PRUNED, mfs=0.94, cgbs=256, outcome="predicted_oom", recorded=False,
                        start_min=10 + i) for i in range(5)]
    url = f"sqlite:///{tmp_path / 'c.db'}"
    build_study(url, "counts", ok + confirm + oom + skips)
    code, out = invoke("status", "--study", "counts", "--storage", url, "--n-trials", "14")
    assert code == 0, out
    text = " ".join(out.split())
    assert "total" not in text and "budget" not in text  # no "total 11, budget 14" beside each other
    # 3 launches + 1 death hold a slot of the 14 (a skip does not); 2 confirmations outside it; 5 skips said so
    assert ("trials: search 4 of 14, confirmations 2, died of OOM 1, other deaths 0, skipped as predicted OOM 5, "
            "failed (infrastructure) 0; 11 trials in all") in text
    assert "5 ok / 1 died / 0 failed" in text  # the skips never ran on the host


def test_the_final_table_fits_100_columns_without_breaking_words() -> None:
    """The demo's table (four searched knobs, NCCL values, the longest outcomes and phases) in a 100-column
    console: no line is longer, and every word of every cell and header is printed whole."""
    from search.cli.views import summary_table
    from search.trial.records import TrialFacts

    params = {"mem_fraction_static": 0.62, "cuda_graph_max_bs": 80, "nccl.NCCL_PROTO": "LL128",
              "nccl.NCCL_ALGO": "allreduce:tree"}
    cases = [(TrialState.COMPLETE, 1523.4, "ok", None), (TrialState.PRUNED, None, "oom", "cuda_graph"),
             (TrialState.PRUNED, None, "predicted_oom", "load_weights"),
             (TrialState.FAIL, None, "stopped_from_outside", None)]
    recs = [TrialFacts(number=n + 10, state=state, value=value, outcome=outcome, phase=phase, params=params,
                       simulated=True, memory={"free_after_capture_gib": 6.5} if value else {})
            for n, (state, value, outcome, phase) in enumerate(cases)]
    console = Console(width=100, record=True, file=io.StringIO())
    console.print(summary_table(recs, "output_throughput"))
    text = console.export_text()
    assert all(len(line) <= 100 for line in text.splitlines()), text
    printed = set(text.split())
    words = ["output", "throughput", "(tok/s)", "free", "after", "capture", "(GiB)", "mem", "frac", "graph", "bs", "NCCL_PROTO", "NCCL_ALGO"]
    for rec in recs:
        words += [rec.state.name, rec.label, str(rec.number), *(str(v) for v in params.values())]
        words += [f"({rec.phase.value})"] if rec.phase else []
    assert not [w for w in words if w not in printed], text
    assert "1523.4" in printed and "6.50" in printed
    assert "(simulated host: every figure is simulated)" in text


# ---- help texts, hosts check ------------------------------------------------------------------------


def _commands(group: typer.Typer, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix]
    for info in group.registered_commands:
        out.append((*prefix, info.name or (info.callback.__name__ if info.callback else "")))
    for sub in group.registered_groups:
        assert sub.typer_instance is not None and sub.name is not None
        out += _commands(sub.typer_instance, (*prefix, sub.name))
    return out


def _click(command: tuple[str, ...]) -> Any:
    """The click command (Typer's own click) behind ``servetune COMMAND``."""
    cmd: Any = typer.main.get_command(app)
    for name in command:
        cmd = cmd.commands[name]
    return cmd


@pytest.mark.parametrize("command", _commands(app), ids=lambda c: " ".join(c) or "servetune")
def test_help_has_no_markup_leftovers(command: tuple[str, ...]) -> None:
    code, out = invoke(*command, "--help", width=100)
    assert code == 0, out
    flat = " ".join(out.split())
    for leftover in ("``", "[/", "[bold", "[green", "[yellow", ":func:", ":class:", " .", " ,"):
        assert leftover not in flat, (command, leftover, out)
    # A bracketed part of a help text ("[default: the best]") is printed, not eaten as a markup tag.
    for param in _click(command).params:
        for bracket in re.findall(r"\[[^\]]*\]", getattr(param, "help", None) or ""):
            assert " ".join(bracket.split()) in flat, (command, param.name, bracket)


def test_hosts_check_puts_errors_in_an_error_column(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import search.trial.preflight

    def unreachable(host: object, space: object, engine: object = None) -> object:
        raise HostUnreachable("cannot connect to gpu-z: connection refused")

    monkeypatch.setattr(search.trial.preflight, "preflight", unreachable)
    code, out = invoke("hosts", "check", "--space", str(demo_space(tmp_path)), "--host", "gpu-z")
    assert code == 1
    lines = out.splitlines()
    header = next(line for line in lines if "reachable" in line)
    assert header.split() == ["host", "reachable", "engine", "GPUs", "free", "MiB", "busy", "held", "by", "error"]
    column = header.index("error")
    row = next(i for i, line in enumerate(lines) if line.strip().startswith("gpu-z"))
    assert lines[row].split()[:7] == ["gpu-z", "no", "-", "-", "-", "-", "-"]
    error = " ".join(line[column:].strip() for line in lines[row:] if line.strip())
    assert error.startswith("cannot connect to gpu-z: connection refused"), out


# ---- export --engine sglang ---------------------------------------------------------------------------


def test_export_engine_sglang_renders_the_real_command(sim_study: tuple[str, optuna.Study], tmp_path: Path) -> None:
    url, study = sim_study
    code, script = invoke("export", "--study", "demo-sim-dsv4", "--storage", url, "--engine", "sglang")
    assert code == 0, script
    bash_n(tmp_path, script)
    argv = exec_argv(script)
    assert argv[:3] == ["/opt/sglang/bin/python", "-m", "sglang.launch_server"]
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert argv[argv.index("--port") + 1] == "30000"
    assert argv[argv.index("--model-path") + 1] == "/models/Qwen3-30B-A3B"
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.62"
    assert argv[argv.index("--cuda-graph-max-bs") + 1] == "64"  # SGLang 0.5.10's spelling, as emulated
    assert not any(a.startswith("--sim-") for a in argv)
    assert exports(script) == {"NCCL_P2P_LEVEL": "NVL", "NCCL_ALGO": "Ring", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    # No path of the controller's python or its profiles reaches the script.
    for path in (sys.executable, sys.prefix, str(ROOT)):
        assert path not in script
    header = [line for line in script.splitlines() if line.startswith("# ")]
    gpu = next(line for line in header if line.startswith("# GPU: "))
    assert " x 4 (TP 4; CUDA_VISIBLE_DEVICES=0,1,2,3)" in gpu
    assert any("tuned on sim 0.5.10, SIMULATED" in line for line in header)
    assert any("every figure below is SIMULATED" in line for line in header)
    assert TrialFacts.from_trial(study.trials[0]).value == 1500.0


def test_export_engine_takes_the_space_and_flags(sim_study: tuple[str, optuna.Study], tmp_path: Path) -> None:
    url, _ = sim_study
    space = demo_space(tmp_path, deploy={"python": "/srv/venv/bin/python", "model_path": "/data/m",
                                         "host": "127.0.0.5", "port": 8000, "gpus": [4, 5, 6, 7],
                                         "version": "0.5.23"})
    code, script = invoke("export", "--study", "demo-sim-dsv4", "--storage", url, "--engine", "sglang",
                          "--space", str(space), "--bind", "::")
    assert code == 0, script
    bash_n(tmp_path, script)
    argv = exec_argv(script)
    assert argv[0] == "/srv/venv/bin/python"
    assert argv[argv.index("--host") + 1] == "::"  # --bind beats the space
    assert argv[argv.index("--port") + 1] == "8000"
    assert argv[argv.index("--model-path") + 1] == "/data/m"
    assert argv[argv.index("--cuda-graph-max-bs-decode") + 1] == "64"  # spelled for the deployed 0.5.23
    assert exports(script)["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"


def test_export_engine_refusals(sim_study: tuple[str, optuna.Study], tmp_path: Path) -> None:
    from search.outputs.export import export_script
    from spaces.schema import Deploy

    url, study = sim_study
    with pytest.raises(ConfigError, match="servetune's own: name the GPU box's engine python"):
        export_script(StudyView.of(study), engine="sglang", deploy=Deploy())
    with pytest.raises(ConfigError, match=r"deploy.gpus names 2 GPU\(s\) \[0, 1\] for a TP size of 4"):
        export_script(StudyView.of(study), engine="sglang", deploy=Deploy(python="python3", gpus=[0, 1]))
    with pytest.raises(ConfigError, match="--engine: 'vllm' is not one of sglang"):
        export_script(StudyView.of(study), engine="vllm", deploy=Deploy(python="python3"))
    code, out = invoke("export", "--study", "demo-sim-dsv4", "--storage", url, "--bind", "0.0.0.0")
    assert code == 1 and "go with --engine" in out
    code, out = invoke("export", "--study", "demo-sim-dsv4", "--storage", url, "--engine", "sglang",
                       "--python", "python3; rm -rf /")
    assert code == 1 and "--python: 'python3; rm -rf /' must be one word" in out
    with pytest.raises(ValidationError, match="must be one word"):
        Deploy.model_validate({"python": "python3; rm -rf /"})


def test_no_library_log_line_breaks_the_live_display() -> None:
    """A handler holding the terminal's stream from import time (as optuna's and mlflow's do) writes nothing
    while the display runs; its warning is printed above the display, and the handlers come back after."""
    import io
    import logging

    from search.cli.views import LIBRARY_LOGGERS, Progress

    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100)
    direct = io.StringIO()
    handlers = {name: logging.StreamHandler(direct) for name in LIBRARY_LOGGERS}
    for name, handler in handlers.items():
        logging.getLogger(name).addHandler(handler)
    try:
        with Progress(console, n_trials=3, metric="output_throughput", live=True):
            for name in LIBRARY_LOGGERS:
                logging.getLogger(f"{name}.sub").warning("%s says hello", name)
            logging.getLogger("alembic.runtime.migration").info("Context impl SQLiteImpl.")
        assert direct.getvalue() == ""
        for name in LIBRARY_LOGGERS:
            assert f"{name}.sub: warning: {name} says hello" in screen.getvalue()
        assert "SQLiteImpl" not in screen.getvalue()
        for name, handler in handlers.items():
            assert handler in logging.getLogger(name).handlers
    finally:
        for name, handler in handlers.items():
            logging.getLogger(name).removeHandler(handler)


def test_export_engine_keeps_the_gpus_the_trial_was_given(tmp_path: Path) -> None:
    from search.outputs.export import export_script
    from spaces.schema import Deploy

    trial = make_trial(state=TrialState.COMPLETE, mfs=0.7, cgbs=64, value=10.0, levels=[level(16, 10.0)])
    facts = TrialFacts.from_trial(trial)
    assert facts.launch_config is not None
    launch = facts.launch_config.model_copy(update={"env": {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}})
    store_facts(trial, facts.model_copy(update={"launch_config": launch}))
    study = build_study(f"sqlite:///{tmp_path / 'o.db'}", "real", [trial])
    script = export_script(StudyView.of(study), engine="sglang", deploy=Deploy())
    bash_n(tmp_path, script)
    assert exports(script)["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    argv = exec_argv(script)
    assert argv[0] == "/opt/sglang-venv/bin/python"  # a real engine's trial keeps its python
    assert argv[argv.index("--host") + 1] == "0.0.0.0"


def test_the_live_head_counts_the_search_against_its_budget_and_the_rest_apart(tmp_path: Path) -> None:
    from search.cli.views import Progress
    from search.trial.records import FACTS_ATTR

    def tagged(trial: optuna.trial.FrozenTrial, **tags: object) -> optuna.trial.FrozenTrial:
        trial.system_attrs = {**trial.system_attrs, FACTS_ATTR: {**trial.system_attrs[FACTS_ATTR], **tags}}
        return trial

    trials = [make_trial(state=TrialState.COMPLETE, mfs=0.8, cgbs=128, value=2000.0 + i, levels=[level(16, 2000.0)],
                         start_min=i) for i in range(8)]
    trials += [tagged(make_trial(state=TrialState.COMPLETE, mfs=0.8, cgbs=128, value=2010.0, start_min=9 + i,
                                 levels=[level(16, 2000.0)]), confirmation_of=7) for i in range(3)]
    study = build_study(f"sqlite:///{tmp_path / 'p.db'}", "live", trials)
    view = StudyView.of(study)
    screen = io.StringIO()
    progress = Progress(Console(file=screen, width=200), n_trials=8, metric="output_throughput", live=False)
    for trial in study.trials:
        progress.callback(view, trial)
    head = progress._render().renderables[0].plain
    assert "search 8 of 8" in head and "confirmations 3" in head  # never "done 11 of 8"
    assert "11 of 8" not in head
    assert "tok/s (output_throughput at C=16) (trial " in head  # the best with its metric and unit


def test_an_html_report_without_output_is_a_file_and_its_path(sim_study: tuple[str, optuna.Study],
                                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url, _ = sim_study
    monkeypatch.chdir(tmp_path)
    code, out = invoke("report", "--study", "demo-sim-dsv4", "--storage", url, "--format", "html")
    assert code == 0, out
    written = tmp_path / "demo-sim-dsv4-report.html"
    assert written.is_file() and written.read_text().startswith("<!DOCTYPE html>")
    assert str(written) in out and "<html" not in out and len(out) < 2000  # a path, not megabytes of page
