"""Helpers for the overnight and distributed tests: fast spaces on the simulated host, ``servetune`` as a real
subprocess, process and simulated-GPU checks, a real ``mlflow server``. Everything started here is stopped
by its PID or process group, never by name.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
import sqlalchemy.exc
import yaml
from optuna.trial import FrozenTrial, TrialState

from search.trial.records import TrialFacts
from tests.fixtures.mlflow_server import group_alive
from tests.fixtures.ports import free_port
from tests.fixtures.procs import wait_for as poll

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "runners/simhost/profiles/dsv4-flash-nvfp4-tp4-rtxpro6000.yaml"
# num_continuous_decode_steps is not searched: SGLang 0.5.10 ignores it (search.strategy.distributions.inert_knobs).
BASE = {"nccl.NCCL_PROTO": "unset", "nccl.NCCL_ALGO": "unset"}
DIES = {**BASE, "mem_fraction_static": 0.70, "cuda_graph_max_bs": 32}  # seed 003: eager decode OOM at C=64
SURVIVES = {**BASE, "mem_fraction_static": 0.62, "cuda_graph_max_bs": 64}
#: A fast workload: a trial is about 1.5 s at sim speed 1000.
FAST = {"input_len": 64, "output_len": 16, "concurrency": [1, 4], "requests_per_level": [1, 4],
        "warmup_requests": 0}
#: The seed-003 workload (requests overlap at C=64, so 0.70/32 dies in eager decode): use with speed ~100.
SEED003 = {"input_len": 128, "output_len": 96, "concurrency": [1, 16, 64], "requests_per_level": [1, 16, 64],
           "warmup_requests": 1}
#: The budget of a fast test space (the demo's is 14 trials, 60 s, 120 s and 5 s).
SHORT_BUDGET = {"n_trials": 4, "startup_timeout": "30s", "benchmark_timeout": "60s", "stop_grace": "2s"}
#: Heartbeats fast enough for tests (the defaults are 5 s and 20 s).
HEARTBEAT_ENV = {"SERVETUNE_HEARTBEAT_INTERVAL": "1", "SERVETUNE_HEARTBEAT_GRACE": "5"}


def make_space(path: Path, *, speed: float = 1000, workload: Mapping[str, Any] | None = None,
               budget: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
               knobs: Mapping[str, Any] | None = None, port: int | None = None, safe: bool = True,
               fixed_args: Sequence[str] = (), base_budget: Mapping[str, Any] | None = SHORT_BUDGET) -> Path:
    """A space file on the simulated host (seed 003's profile) with fast trials and short budgets.

    ``safe``: memory fractions that never run out of memory on this profile (so a test's outcomes are the
    faults it injects, not a sampled OOM). ``fixed_args`` are added to the demo's; ``knobs`` replace the
    demo's knobs of those names. The budget is ``base_budget`` (``None``: the demo's) updated by ``budget``."""
    data = yaml.safe_load((ROOT / "spaces/demo-sim.yaml").read_text())
    data["engine"]["sim"]["profile"] = str(PROFILE)
    data["engine"]["sim"]["speed"] = speed
    data["port"] = port or free_port()
    data["workload"] = dict(workload or FAST)
    data["objective"]["level"] = data["workload"]["concurrency"][-1]
    data["budget"] = {**(data["budget"] if base_budget is None else base_budget), **(budget or {})}
    if fixed_args:
        data["fixed_args"] = data["fixed_args"] + list(fixed_args)
    if env:
        data["env"] = dict(env)
    if safe:
        data["knobs"]["mem_fraction_static"] = {"low": 0.56, "high": 0.66, "step": 0.01}
    if knobs:
        data["knobs"].update(knobs)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


def cli_env(wd: Path, **extra: str) -> dict[str, str]:
    """The environment of a ``servetune`` subprocess working in ``wd`` (its own runs root, and its own folder of
    leases and claims, ``wd/hostdir``, where a test's controllers meet)."""
    env = {**os.environ, **HEARTBEAT_ENV, "SERVETUNE_RUNS_ROOT": str(wd / "runs"),
           "SERVETUNE_HOST_DIR": str(wd / "hostdir"),
           "SERVETUNE_ARTIFACTS_DIR": str(wd / "artifacts"), "PYTHONUNBUFFERED": "1"}
    env.pop("SERVETUNE_CONFIG", None)
    env.update(extra)
    return env


def cli(*args: str, cwd: Path, timeout: float = 180, env: Mapping[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    """``servetune ARGS`` in ``cwd``; ``env``: the whole environment (default: :func:`cli_env`)."""
    return subprocess.run([sys.executable, "-m", "search", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False, env=dict(env or cli_env(cwd)))


@dataclass
class Controller:
    """A ``servetune`` subprocess in a session of its own; its output goes to ``log``."""

    proc: subprocess.Popen[str]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log.read_text()

    def finish(self, timeout: float = 120) -> int:
        """Wait for it to exit; killed (by PID) if it overruns."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"controller did not exit within {timeout:g}s:\n{self.output()[-3000:]}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def start_cli(*args: str, cwd: Path, env: Mapping[str, str] | None = None, log: str = "controller.log"
              ) -> Controller:
    """``servetune ARGS`` in the background, in a session of its own."""
    path = cwd / log
    with path.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "search", *args], cwd=cwd, stdout=out,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                env=dict(env or cli_env(cwd)))
    return Controller(proc, path)


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60, interval: float = 0.1) -> Any:
    """The first truthy value of ``check()``; AssertionError naming ``what`` after ``timeout`` seconds."""
    value = poll(check, timeout, interval)
    if not value:
        raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
    return value


def server_groups(runs_root: Path) -> dict[str, int]:
    """Run directory -> process group id of every server ever started under ``runs_root``."""
    out = {}
    for pgid in runs_root.glob("*/*/pgid"):
        text = pgid.read_text().strip()
        if text.isdigit():
            out[str(pgid.parent)] = int(text)
    return out


def study_runs(runs_root: Path, study: str, timeout: float = 60) -> Path:
    """The study's folder of run directories under ``runs_root`` (``<study>.<uid>``), once a launch made it."""
    return Path(wait_for(f"a run folder of study {study} in {runs_root}",
                         lambda: next(iter(runs_root.glob(f"{study}.*")), None), timeout=timeout))


def lease_files(host_dir: Path) -> list[Path]:
    """The lease files under a host_dir (one folder per GPU set)."""
    return sorted(host_dir.glob("gpus-*/leases/*.json"))


def live_servers(runs_root: Path) -> list[str]:
    return [d for d, pg in server_groups(runs_root).items() if group_alive(pg)]


def gpu_pids(sim_dir: Path) -> str:
    """What the simulated nvidia-smi of ``sim_dir`` lists as compute processes ('' when none)."""
    res = subprocess.run(
        ["bash", "-c", f"PATH={sim_dir}/bin:$PATH SERVETUNE_SIM_STATE={sim_dir}/state "
         "nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True)
    return res.stdout.strip()


def trials(storage: str, study: str) -> list[FrozenTrial]:
    """The study's trials; none while it does not exist yet."""
    if not _schema_ready(storage):  # the first controller is still creating Optuna's tables
        return []
    rdb: optuna.storages.RDBStorage | None = None
    try:
        rdb = optuna.storages.RDBStorage(storage, skip_table_creation=True)  # a reader creates nothing
        return optuna.load_study(study_name=study, storage=rdb).get_trials(deepcopy=False)
    except (KeyError, sqlalchemy.exc.SQLAlchemyError):  # not there yet
        return []
    finally:
        if rdb is not None:
            rdb.engine.dispose()  # no connection left open (PostgreSQL)


def _schema_ready(storage: str) -> bool:
    engine = sqlalchemy.create_engine(storage)
    try:
        with engine.connect() as conn:
            versions = conn.execute(sqlalchemy.text("SELECT count(*) FROM version_info")).scalar()
            stamped = conn.execute(sqlalchemy.text("SELECT count(*) FROM alembic_version")).scalar()
            return bool(versions) and bool(stamped)
    except sqlalchemy.exc.SQLAlchemyError:
        return False
    finally:
        engine.dispose()


def counted(ts: list[FrozenTrial]) -> list[FrozenTrial]:
    """The trials the budget counts: COMPLETE and PRUNED, but for skips (``predicted_oom``) and the
    confirmation launches made after the budget (``search.strategy.confirm.search_launches``)."""
    recs = {t.number: TrialFacts.from_trial(t) for t in ts}
    return [t for t in ts if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
            and not recs[t.number].predicted_oom and recs[t.number].confirmation_of is None]


# ---- a real `mlflow server` -----------------------------------------------------------------------
