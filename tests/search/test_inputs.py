"""Names, files and disks that are not what servetune expects: one line, a non-zero exit, nothing run, and
nothing outside the run and artifact directories written or removed.

* every entry point refuses an unsafe study name before it reads, writes or runs anything (table test over
  names x entry points, the whole sandbox compared byte for byte before and after);
* every bad file (a space file that is not UTF-8 or is a directory, an inventory likewise, a storage or
  settings file with garbage in it, an output path in a missing directory) is one line, exit 1;
* a full artifacts disk (a real tmpfs of a few KiB, filled) keeps the trial's result and stops the run in
  one line before the next trial;
* MLflow that cannot write (a read-only directory, a garbage database) is found once, in a moment, and the
  run goes on without it, saying to run ``sync-mlflow`` later;
* inventory env values expand ``$NAME``/``${NAME}`` and run nothing else, over a real sshd;
  ``--accept-new-host-key`` applies to inventory hosts.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from optuna.trial import TrialState

from runners.errors import ConfigError, HostKeyError, StudyError
from runners.inventory import open_host, parse_inventory
from search.cli import main
from search.driver.hosts import build_hosts, local_host
from search.driver.run import RunOptions, StopReason, run_search
from search.outputs.tracking import MlflowTracker
from search.settings import study_name
from search.trial.records import TrialFacts
from spaces.schema import load_space
from tests.fixtures.sshd import SshServer
from tests.fixtures.trials import build_study, standard_trials
from tests.search.overnight_kit import cli, cli_env, gpu_pids, make_space, trials

BAD_NAMES = ["..", ".", "../x", "a/b", "/tmp/abs", "x\ny", "x\r", "a..b", "-rf", "", " ", "a b", "x" * 129,
             "tab\tx", "é", "a;touch F", "$(touch F)", "`id`", "x\x00"]
GOOD_NAMES = ["ok", "qwen-h100", "A.b_c-1", "x" * 128, "0"]


# ---- the sandbox ---------------------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its content (None for a directory)."""
    out: dict[str, bytes | None] = {}
    for path in sorted(root.rglob("*")):
        out[str(path.relative_to(root))] = None if path.is_dir() else path.read_bytes()
    return out


class Sandbox:
    """``root/work`` is the working directory (storage, runs root, artifacts); ``root`` holds sentinels where
    ``--study ..`` and absolute names used to write (``<runs root>/../0``, ``<artifacts>/../report.md``)."""

    def __init__(self, root: Path, template: Path) -> None:
        self.root = root
        self.wd = root / "work"
        shutil.copytree(template, self.wd)
        (root / "report.md").write_text("not servetune's\n")
        (self.wd / "0").mkdir()
        (self.wd / "0" / "keep").write_text("not servetune's\n")
        self.storage = f"sqlite:///{self.wd / 'servetune.db'}"
        self.space = self.wd / "space.yaml"

    def env(self) -> dict[str, str]:
        return {"SERVETUNE_STORAGE": self.storage, "SERVETUNE_RUNS_ROOT": str(self.wd / "runs"),
                "SERVETUNE_ARTIFACTS_DIR": str(self.wd / "artifacts"), "SERVETUNE_SIM_DIR": str(self.wd / "sim"),
                "SERVETUNE_MLFLOW_URI": f"sqlite:///{self.wd / 'mlruns' / 'mlflow.db'}"}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory with a study "ok" (the standard trials) and a space file, copied for each test."""
    wd = tmp_path_factory.mktemp("template")
    build_study(f"sqlite:///{wd / 'servetune.db'}", "ok", standard_trials())
    make_space(wd / "space.yaml")
    return wd


@pytest.fixture
def sandbox(tmp_path: Path, template: Path, monkeypatch: pytest.MonkeyPatch) -> Sandbox:
    box = Sandbox(tmp_path, template)
    monkeypatch.chdir(box.wd)
    monkeypatch.delenv("SERVETUNE_CONFIG", raising=False)
    for key, value in box.env().items():
        monkeypatch.setenv(key, value)
    return box


def invoke(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``servetune ARGS`` in this process (fast, and a traceback would fail the test): (exit code, out, err)."""
    code: int | str | None = 0
    old = sys.argv
    sys.argv = ["servetune", *args]
    try:
        main()
    except SystemExit as exc:
        code = exc.code
    finally:
        sys.argv = old
    out, err = capsys.readouterr()
    return (code if isinstance(code, int) else 1), out, err


def one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("servetune: error: ") and "Traceback" not in err
    return lines[0]


# ---- study names ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_good_names_pass(name: str) -> None:
    assert study_name(name) == name


ENTRY_POINTS = {
    "run": ["run", "{space}", "--study", "{name}", "--no-mlflow", "--no-live", "-n", "1"],
    "worker": ["worker", "{space}", "--study", "{name}", "--no-mlflow", "--no-live", "-n", "1"],
    "trials": ["trials", "--study", "{name}"],
    "status": ["status", "--study", "{name}"],
    "report": ["report", "--study", "{name}", "-o", "{wd}/r.md"],
    "export": ["export", "--study", "{name}", "-o", "{wd}/x.sh"],
    "sync-mlflow": ["sync-mlflow", "--study", "{name}"],
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_every_entry_point_refuses_an_unsafe_study_name(
        sandbox: Sandbox, capsys: pytest.CaptureFixture[str], entry: str, name: str) -> None:
    before = snapshot(sandbox.root)
    args = [a.format(space=sandbox.space, name=name, wd=sandbox.wd) for a in ENTRY_POINTS[entry]]
    code, _, err = invoke(capsys, *args)
    assert code == 1
    assert "study name" in one_error_line(err) and "is not allowed" in err
    assert snapshot(sandbox.root) == before


def test_the_same_commands_work_with_a_good_name(sandbox: Sandbox, capsys: pytest.CaptureFixture[str]) -> None:
    # The control of the table above: in this harness the commands run, and write only where told.
    for entry in ("trials", "status", "report", "export"):
        args = [a.format(space=sandbox.space, name="ok", wd=sandbox.wd) for a in ENTRY_POINTS[entry]]
        code, _, err = invoke(capsys, *args)
        assert code == 0, (entry, err)
    assert (sandbox.wd / "r.md").read_text().startswith("#")
    assert (sandbox.wd / "x.sh").read_text().startswith("#!/usr/bin/env bash")


@pytest.mark.parametrize("name", ["..", "a/b", "x\ny"], ids=repr)
def test_a_space_name_is_a_study_name_too(sandbox: Sandbox, capsys: pytest.CaptureFixture[str], name: str) -> None:
    data = yaml.safe_load(sandbox.space.read_text())
    data["name"] = name
    sandbox.space.write_text(yaml.safe_dump(data))
    before = snapshot(sandbox.root)
    code, _, err = invoke(capsys, "run", str(sandbox.space), "--no-mlflow", "--no-live")
    assert code == 1 and "name" in one_error_line(err) and "is not allowed" in err
    assert snapshot(sandbox.root) == before


def test_the_library_and_the_demo_refuse_it_too(sandbox: Sandbox, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    before = snapshot(sandbox.root)
    options = RunOptions(study_name="../escape", storage_url=sandbox.storage, artifacts_dir=sandbox.wd / "a",
                         n_trials=1, timeout=None)
    with pytest.raises(ConfigError, match="is not allowed"):
        run_search(load_space(sandbox.space), [], options)
    from search.cli import demo

    demo_out = demo.ROOT / "demo-out"
    existed = demo_out.exists()
    monkeypatch.setattr(sys, "argv", ["demo", "--study", "../escape"])
    with pytest.raises(SystemExit) as info:
        demo.main()
    assert info.value.code == 2 and "is not allowed" in capsys.readouterr().err
    assert demo_out.exists() == existed
    assert snapshot(sandbox.root) == before


# ---- bad files -----------------------------------------------------------------------------------


def _bad_files(box: Sandbox) -> dict[str, tuple[list[str], str, dict[str, str]]]:
    """case -> (argv, needle in the error line, extra environment)."""
    wd = box.wd
    (wd / "binary.yaml").write_bytes(b"name: \xff\xfe\x00bad\n")
    (wd / "a-dir.yaml").mkdir()
    (wd / "garbage.db").write_text("this is not a database " * 20)
    (wd / "garbage.toml").write_bytes(b"storage = \xff\n[[[")
    (wd / "out-dir").mkdir()
    (wd / "a-file").write_text("x")
    space = str(box.space)
    run = ["run", space, "--no-mlflow", "--no-live", "-n", "1"]
    return {
        "space not UTF-8": (["validate", str(wd / "binary.yaml")], "not a text file", {}),
        "space is a directory": (["validate", str(wd / "a-dir.yaml")], "cannot read the space file", {}),
        "run: space is a directory": (["run", str(wd / "a-dir.yaml")], "cannot read the space file", {}),
        "inventory not UTF-8": ([*run, "--inventory", str(wd / "binary.yaml")], "not a text file", {}),
        "inventory is a directory": ([*run, "--inventory", str(wd / "a-dir.yaml")], "cannot read inventory", {}),
        "storage with garbage": (["trials", "--study", "ok", "--storage", f"sqlite:///{wd / 'garbage.db'}"],
                                 "storage", {}),
        "settings with garbage": (["trials", "--study", "ok"], "settings file",
                                  {"SERVETUNE_CONFIG": str(wd / "garbage.toml")}),
        "export into a missing directory": (["export", "--study", "ok", "-o", str(wd / "missing" / "x.sh")],
                                            "No such file or directory", {}),
        "export onto a directory": (["export", "--study", "ok", "-o", str(wd / "out-dir")], "cannot write", {}),
        "report into a missing directory": (["report", "--study", "ok", "-o", str(wd / "missing" / "r.md")],
                                            "No such file or directory", {}),
        "artifacts dir is a file": (["run", space, "--no-mlflow", "--no-live", "-n", "1", "--artifacts-dir",
                                     str(wd / "a-file")], "artifacts directory", {}),
    }


BAD_FILE_CASES = ["space not UTF-8", "space is a directory", "run: space is a directory", "inventory not UTF-8",
                  "inventory is a directory", "storage with garbage", "settings with garbage",
                  "export into a missing directory", "export onto a directory", "report into a missing directory",
                  "artifacts dir is a file"]


@pytest.mark.parametrize("case", BAD_FILE_CASES)
def test_every_bad_file_is_one_line(sandbox: Sandbox, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    args, needle, env = _bad_files(sandbox)[case]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    code, _, err = invoke(capsys, *args)
    assert code == 1
    assert needle in one_error_line(err), err
    assert not (sandbox.wd / "runs").exists()  # nothing was launched
    assert not (sandbox.wd / "missing").exists()
    assert (sandbox.wd / "out-dir").is_dir() and not any((sandbox.wd / "out-dir").iterdir())


# ---- a full disk ---------------------------------------------------------------------------------


@contextlib.contextmanager
def tiny_fs(path: Path, *, size: str = "64k", read_only: bool = False, fill: bool = True) -> Iterator[Path]:
    """A real tmpfs of ``size`` at ``path``, filled to the last byte (or mounted read-only); needs root."""
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size}" + (",ro" if read_only else "")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True,
                             text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        if fill and not read_only:
            with open(path / "filler", "wb", buffering=0) as fh, contextlib.suppress(OSError):
                while True:
                    fh.write(b"\0" * 4096)
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.slow
def test_a_full_artifacts_disk_keeps_the_result_and_stops_in_one_line(tmp_path: Path) -> None:
    wd = tmp_path / "wd"
    wd.mkdir()
    space = make_space(wd / "space.yaml")
    with tiny_fs(tmp_path / "full") as full:
        (full / "optuna-artifacts").mkdir()  # what a previous run left: the disk filled up since
        env = cli_env(wd, SERVETUNE_ARTIFACTS_DIR=str(full), SERVETUNE_SIM_DIR=str(wd / "sim"))
        res = cli("run", str(space), "--study", "full", "--no-mlflow", "--no-live", "-n", "3", "--seed", "1",
                  cwd=wd, env=env)
        assert res.returncode == 1, res.stdout + res.stderr
        assert "Traceback" not in res.stderr
        last = res.stderr.strip().splitlines()[-1]
        assert last.startswith(f"servetune: error: stopped before the next trial: {StopReason.ARTIFACTS}: "), res.stderr
        assert "No space left on device" in last
    done = trials(f"sqlite:///{wd / 'servetune.db'}", "full")
    assert len(done) == 1  # the run stopped before the next trial
    trial = done[0]
    assert trial.state in (TrialState.COMPLETE, TrialState.PRUNED), trial.user_attrs
    facts = TrialFacts.from_trial(trial)
    assert facts.label in ("ok", "oom") and facts.levels
    assert "No space left on device" in (facts.artifacts_error or "")
    assert gpu_pids(wd / "sim") == ""  # its server was stopped all the same


@pytest.mark.slow
def test_a_storage_disk_that_fills_up_keeps_the_told_trials_and_stops_in_one_line(tmp_path: Path) -> None:
    space = load_space(make_space(tmp_path / "space.yaml"))
    with tiny_fs(tmp_path / "db", size="4m", fill=False) as fs:
        url = f"sqlite:///{fs / 'servetune.db'}"

        def fill_the_disk(study: object, trial: object) -> None:  # after the first trial is told
            with open(fs / "filler", "ab", buffering=0) as fh, contextlib.suppress(OSError):
                while True:
                    fh.write(b"\0" * 4096)

        host = local_host(space, runs_root=str(tmp_path / "runs"), sim_dir=tmp_path / "sim")
        options = RunOptions(study_name="dbfull", storage_url=url, artifacts_dir=tmp_path / "artifacts",
                             n_trials=3, timeout=None, callbacks=[fill_the_disk], smi_interval=0.2)
        try:
            with pytest.raises(StudyError) as info:
                run_search(space, [host], options)
        finally:
            host.close()
        message = str(info.value)
        assert "\n" not in message and "disk is full" in message and "the run stopped" in message, message
        told = [t for t in trials(url, "dbfull") if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(told) == 1 and TrialFacts.from_trial(told[0]).levels  # the trial before the disk filled is kept
    assert gpu_pids(tmp_path / "sim") == ""


# ---- MLflow that cannot write ---------------------------------------------------------------------


def test_an_unwritable_mlflow_sqlite_is_found_at_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    garbage = tmp_path / "mlflow.db"
    garbage.write_text("not a database " * 50)
    with caplog.at_level(logging.WARNING):
        with pytest.raises(StudyError, match="cannot be written: file is not a database"):
            MlflowTracker(f"sqlite:///{garbage}").check("s")
        with tiny_fs(tmp_path / "ro", read_only=True) as ro, pytest.raises(StudyError, match="cannot be written"):
            MlflowTracker(f"sqlite:///{ro / 'mlflow.db'}").check("s")
    # MLflow's own engine retries (ten, ~100 s in all) never started.
    assert not [r for r in caplog.records if "will be retried" in r.getMessage()]


@pytest.mark.slow
def test_a_run_with_a_broken_mlflow_says_so_once_and_goes_on(tmp_path: Path) -> None:
    wd = tmp_path / "wd"
    wd.mkdir()
    garbage = wd / "mlflow.db"
    garbage.write_text("not a database " * 50)
    space = make_space(wd / "space.yaml")
    res = cli("run", str(space), "--study", "mlf", "--mlflow-uri", f"sqlite:///{garbage}", "--no-live", "-n", "2",
              "--confirm-top", "0", cwd=wd)  # exactly the two trials: no confirmation launches
    assert res.returncode == 0, res.stderr
    mlflow_lines = [line for line in res.stderr.splitlines() if "mlflow" in line.lower()]
    assert len(mlflow_lines) == 1, res.stderr
    assert "cannot be written" in mlflow_lines[0] and "servetune sync-mlflow --study mlf" in mlflow_lines[0]
    assert len([t for t in trials(f"sqlite:///{wd / 'servetune.db'}", "mlf") if t.state.is_finished()]) == 2


# ---- inventory hosts -------------------------------------------------------------------------------


ENV_VALUES = [
    ("$(touch {m})", "$(touch {m})"),
    ("`touch {m}`", "`touch {m}`"),
    ("${{X:-$(touch {m})}}", "${{X:-$(touch {m})}}"),
    ("a'b\"c\\d $1 $$ $", "a'b\"c\\d $1 $$ $"),
    ("/opt/bin:$HOME", "/opt/bin:{home}"),
    ("${{HOME}}/x;touch {m}", "{home}/x;touch {m}"),
]


@pytest.mark.parametrize(("value", "expected"), ENV_VALUES)
def test_inventory_env_values_expand_references_and_run_nothing(
        sshd: SshServer, known_hosts: Path, tmp_path: Path, value: str, expected: str) -> None:
    marker = tmp_path / "marker"
    spec = sshd.spec(known_hosts, env={"V": value.format(m=marker)})
    host = open_host(spec, ssh_config=None)
    try:
        home = host.run('printf %s "$HOME"').stdout
        got = host.run('printf %s "$V"').stdout
    finally:
        host.close()
    assert got == expected.format(m=marker, home=home)
    assert not marker.exists()


@pytest.mark.parametrize("key", ["A B; touch F; X", "1A", "A-B", "A$(touch F)"])
def test_inventory_env_keys_must_be_identifiers(tmp_path: Path, key: str) -> None:
    with pytest.raises(ConfigError, match="not a shell identifier"):
        parse_inventory({"hosts": [{"name": "a", "address": "local", "env": {key: "1"}}]})


def test_accept_new_host_key_applies_to_inventory_hosts(sshd: SshServer, tmp_path: Path) -> None:
    known = tmp_path / "kh" / "known_hosts"
    inventory = tmp_path / "inventory.yaml"
    entry = sshd.spec(known).model_dump(exclude_defaults=True)
    inventory.write_text(yaml.safe_dump({"hosts": [entry]}))
    space = load_space(make_space(tmp_path / "space.yaml"))
    kwargs = {"inventory": inventory, "runs_root": str(tmp_path / "runs"), "sim_dir": tmp_path / "sim"}
    (without,) = build_hosts(space, **kwargs)  # type: ignore[arg-type]
    try:
        with pytest.raises(HostKeyError):
            without.run("true")
    finally:
        without.close()
    (host,) = build_hosts(space, accept_new_host_key=True, **kwargs)  # type: ignore[arg-type]
    try:
        assert host.run("echo ok").stdout == "ok\n"
    finally:
        host.close()
    assert known.read_text().split() == sshd.known_hosts_line.split()

