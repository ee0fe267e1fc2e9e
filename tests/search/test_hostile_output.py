"""Everything read from a host is data (issue 23, row 6), with real processes: ``servetune`` as a subprocess on
the simulated GPU host, an ``nvidia-smi`` that prints garbage, far too much, or terminal escapes.

* a non-CSV ``nvidia-smi`` line with exit status 0 (a GPU that fell off the bus) is one line naming the host,
  never a traceback: in ``hosts check`` and in ``run`` (the host is dropped);
* two million lines from ``nvidia-smi`` are cut on the host: one line, and what travelled back is capped;
* escape sequences (set-title, clear-screen, hyperlink, carriage return) in a server's error line, a GPU
  name and a lease's fields reach no terminal raw: ``run``, ``trials``, ``report`` and ``hosts check`` show
  them escaped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from optuna.trial import TrialState

from runners.errors import HostMisconfigured
from runners.host import Lease
from runners.inventory import HostSpec, open_host
from runners.printable import printable
from runners.smi import MAX_BYTES, MAX_LINES, SmiOutputError, parse_apps, parse_gpus
from search.driver.hosts import sim_env
from search.outputs.text import terminal_safe
from search.trial.records import TrialFacts
from spaces.schema import load_space
from tests.search.overnight_kit import cli, cli_env, make_space, trials

ESC, BEL = "\x1b", "\x07"
#: Set the window title, clear the screen, plant a hyperlink, go back to the line's start.
HOSTILE = f"{ESC}]0;pwned{BEL}{ESC}[2J{ESC}]8;;http://127.0.0.1:1/{ESC}\\click{ESC}]8;;{ESC}\\\r"
OFF_THE_BUS = "Unable to determine the device handle for GPU0000:1B:00.0: Unknown Error"


def raw_controls(text: str) -> list[str]:
    """The terminal control characters in ``text`` (none may reach a terminal)."""
    return sorted({c for c in text if c != "\n" and c != "\t" and (ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F)})


def fake_smi(directory: Path, body: str) -> Path:
    """A directory holding an ``nvidia-smi`` that runs ``body`` (bash)."""
    directory.mkdir(parents=True, exist_ok=True)
    smi = directory / "nvidia-smi"
    smi.write_text("#!/bin/bash\n" + body + "\n")
    smi.chmod(0o755)
    return directory


def inventory(tmp_path: Path, env: dict[str, str], name: str = "gpu-bad") -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump({"hosts": [
        {"name": name, "address": "local", "runs_root": str(tmp_path / "runs"), "host_dir": str(tmp_path / "host"),
         "env": env}]}))
    return path


def run_args(space: Path, study: str, storage: str, *extra: str) -> tuple[str, ...]:
    return ("run", str(space), "--study", study, "--storage", storage, "--no-mlflow", "--no-live",
            "--confirm-top", "0", *extra)


# ---- the sanitiser ------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "shown"), [
    (f"{ESC}]0;title{BEL}", "\\x1b]0;title\\x07"),
    (f"{ESC}[2J{ESC}[H", "\\x1b[2J\\x1b[H"),
    ("ok\rgone", "ok\\x0dgone"),
    ("\x9b31m", "\\x9b31m"),  # C1 CSI
    ("abc\u202edcba", "abc\\u202edcba"),  # right-to-left override
    ("tab\tand\nnewline kept", "tab\tand\nnewline kept"),
    ("plain · ünïcode ✓", "plain · ünïcode ✓"),
])
def test_terminal_safe_escapes_every_control_character(text: str, shown: str) -> None:
    assert terminal_safe(text) == shown
    assert raw_controls(terminal_safe(HOSTILE)) == []
    assert terminal_safe(terminal_safe(HOSTILE)) == terminal_safe(HOSTILE), "escaping twice changes nothing"
    assert printable("a\nb", newlines=False) == "a\\x0ab"


def test_nvidia_smi_output_is_parsed_defensively() -> None:
    with pytest.raises(SmiOutputError, match="not its GPU CSV: 'Unable to determine"):
        parse_gpus(OFF_THE_BUS)
    with pytest.raises(SmiOutputError, match=f"more than {MAX_LINES} lines"):
        parse_gpus("0, H200, 1, 0, 1, 0\n" * (MAX_LINES + 1))
    [gpu] = parse_gpus(f"0, {ESC}]0;x{BEL}H200, 143771, 5, 143766, 0")
    assert gpu.name == "\\x1b]0;x\\x07H200"
    assert parse_apps("No running processes found\n99999999999999999999, 10, GPU-1") == []


# ---- nvidia-smi that lies -----------------------------------------------------------------------


def test_a_gpu_off_the_bus_is_one_line_in_hosts_check_and_run(tmp_path: Path) -> None:
    space = make_space(tmp_path / "space.yaml")
    bad = fake_smi(tmp_path / "bad-bin", f"echo '{OFF_THE_BUS}'; exit 0")
    # A simulated state named: the simulated host's own nvidia-smi is not put in front of the fake.
    hosts = inventory(tmp_path, {"PATH": f"{bad}:$PATH", "SERVETUNE_SIM_STATE": str(tmp_path / "state")})
    check = cli("hosts", "check", "--space", str(space), "--inventory", str(hosts), cwd=tmp_path,
                env=cli_env(tmp_path, COLUMNS="400"))
    assert check.returncode == 1
    assert "Traceback" not in check.stdout + check.stderr
    assert "nvidia-smi printed a line that is not its GPU CSV" in check.stdout and "fix:" in check.stdout

    storage = f"sqlite:///{tmp_path}/s.db"
    res = cli(*run_args(space, "offbus", storage, "--inventory", str(hosts)), cwd=tmp_path)
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("servetune: error: gpu-bad: nvidia-smi printed a line that is not its GPU CSV")
    assert trials(storage, "offbus") == []


def test_two_million_lines_from_nvidia_smi_are_cut_on_the_host(tmp_path: Path) -> None:
    loud = fake_smi(tmp_path / "loud-bin", 'yes "0, NVIDIA H200, 143771, 0, 143771, 0" | head -n 2000000')
    host = open_host(HostSpec(address="local", runs_root=str(tmp_path / "runs"), env={"PATH": f"{loud}:$PATH"}))
    res = host.run("(nvidia-smi | head -c 1000000) | wc -c")
    assert int(res.stdout) == 1000000, "the fake really prints that much"
    with pytest.raises(HostMisconfigured, match="nvidia-smi printed more than") as info:
        host.gpu_state()
    assert info.value.fault == "nvidia_smi_output" and "\n" not in str(info.value)
    # What travels back is capped at the source: the query as run, with its cut.
    from runners.smi import GPU_QUERY, capped
    assert len(host.run(capped(GPU_QUERY)).stdout.encode()) <= MAX_BYTES


# ---- escapes from a host reach no terminal --------------------------------------------------------


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="known defect: its hostile server error comes from an unknown fixed flag, which validate now refuses against the release's flag table (issue 32), so no trial runs; the hostile text needs another way in")
def test_escapes_in_a_server_error_a_gpu_name_and_a_lease_reach_no_terminal(tmp_path: Path) -> None:
    space = make_space(tmp_path / "space.yaml", budget={"n_trials": 1},
                       fixed_args=[f"--bogus-{HOSTILE}"])
    sim = sim_env(load_space(space), tmp_path / "sim")
    sim_bin = sim["PATH"].split(":")[0]
    wrapper = fake_smi(tmp_path / "evil-bin", f'''esc=$(printf '\\033'); bel=$(printf '\\007')
case "$1" in
  --query-gpu*) "{sim_bin}/nvidia-smi" "$@" | sed "s/, /, ${{esc}}]0;pwned${{bel}}${{esc}}[2J/" ;;
  *) exec "{sim_bin}/nvidia-smi" "$@" ;;
esac''')
    evil_env = {"PATH": f"{wrapper}:{sim['PATH']}", "SERVETUNE_SIM_STATE": sim["SERVETUNE_SIM_STATE"]}
    hosts = inventory(tmp_path, evil_env, name="evil")
    storage = f"sqlite:///{tmp_path}/s.db"
    env = cli_env(tmp_path, COLUMNS="400")

    res = cli(*run_args(space, "hostile", storage, "--inventory", str(hosts)), cwd=tmp_path, env=env)
    [trial] = trials(storage, "hostile")
    # A rejected flag is the configuration's fault: PRUNED, with the server's own error line as its reason.
    assert trial.state == TrialState.PRUNED and "--bogus-" in str(trial.user_attrs.get("reason")), res.stderr
    assert ESC in str(trial.user_attrs["reason"]), "the server's error line is stored as it was"
    assert "\\x1b]0;pwned" in str(TrialFacts.from_trial(trial).gpu_name), "the GPU name is escaped as it is read"
    assert raw_controls(res.stdout + res.stderr) == [], res.stdout + res.stderr
    assert "--bogus-\\x1b]0;pwned" in res.stdout + res.stderr

    for command in (("trials",), ("report",), ("status",), ("report", "--format", "html")):
        out = cli(*command, "--study", "hostile", "--storage", storage, cwd=tmp_path, env=env)
        assert out.returncode == 0, out.stderr
        assert raw_controls(out.stdout + out.stderr) == [], (command, out.stdout)
    report = cli("report", "--study", "hostile", "--storage", storage, cwd=tmp_path, env=env).stdout
    assert "\\x1b]0;pwned\\x07" in report

    # Another controller holds the host; beside its lease lie two that no controller wrote: one whose text
    # fields hold escapes, one whose file name does. Both are ignored (as any broken lease file), each with
    # one line naming the file, escaped; none of their text reaches the terminal.
    other = open_host(HostSpec(address="local", runs_root=str(tmp_path / "runs"), env=evil_env,
                               host_dir=str(tmp_path / "host")))
    other.controller_id = "ctl-other"
    other.renew_lease(Lease("ctl-other", os.getpid(), "box", "study-other", "postgresql://u:***@pg/db", 600))
    assert other.claim().ok
    [leases] = (tmp_path / "host").glob("gpus-*/leases")
    forged = {**json.loads((leases / "ctl-other.json").read_text()), "controller": "ctl-forged",
              "hostname": f"box{ESC}]0;forged{BEL}", "study": f"study{HOSTILE}"}
    (leases / "ctl-forged.json").write_text(json.dumps(forged))
    (leases / f"ctl{ESC}]0;named{BEL}.json").write_text("{}")
    check = cli("hosts", "check", "--space", str(space), "--inventory", str(hosts), cwd=tmp_path, env=env)
    assert "study-other" in "".join(check.stdout.split()), check.stdout  # the valid lease's holder is named
    assert "ctl-forged.json on evil: hostname holds control characters" in check.stderr
    assert "forged" not in check.stdout and "forged\\x07" not in check.stderr
    assert "ctl\\x1b]0;named\\x07.json" in check.stdout + check.stderr
    assert raw_controls(check.stdout + check.stderr) == [], check.stdout
