"""The search's own plan survives faults (issue 23, row 9), with real processes: the simulated host, a real
foreign process holding its GPUs (``runners.simhost.hog``), ``run_search`` twice on one SQLite study.

The probe "is always launched": a probe that ended FAIL because the host was busy (nothing was learnt about
the configuration) is launched again, with its tag and its params, when the study goes on; so is a start-up
design point. The unit cases below pin the rule: a FAIL point is asked again, a retry Optuna queued for a
stale one counts as its launch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from runners.telemetry import FailureKind
from search.driver.hosts import local_host
from search.driver.run import RunOptions, StopReason, run_search
from search.strategy.design import start_point
from search.trial.records import TrialFacts
from spaces.schema import load_space
from tests.fixtures.hog import start_hog, stop_hog
from tests.fixtures.ports import free_port
from tests.search.overnight_kit import make_space


def _options(wd: Path, **kw: Any) -> RunOptions:
    base: dict[str, Any] = {"study_name": "plan", "storage_url": f"sqlite:///{wd}/s.db",
                            "artifacts_dir": wd / "artifacts", "n_trials": 1, "timeout": None, "seed": 1,
                            "smi_interval": 0.5, "confirm_k": 0}
    base.update(kw)
    return RunOptions(**base)


@pytest.mark.slow  # a real search on the simulated host
def test_a_probe_that_failed_on_a_busy_host_is_launched_again(tmp_path: Path) -> None:
    space = load_space(make_space(tmp_path / "space.yaml", budget={"max_consecutive_failures": 1}))
    host = local_host(space, runs_root=str(tmp_path / "runs"), sim_dir=tmp_path / "sim", server_port=free_port())
    hog = start_hog(tmp_path / "sim/state", 30000, "0,1")
    try:
        first = run_search(space, [host], _options(tmp_path, max_set_asides=1))
    finally:
        stop_hog(hog)
    [probe] = first.study.get_trials()
    facts = TrialFacts.from_trial(probe)
    assert probe.state == TrialState.FAIL and facts.outcome == FailureKind.HOST_BUSY and facts.probe
    assert first.stopped_by == StopReason.NO_HOSTS

    host = local_host(space, runs_root=str(tmp_path / "runs"), sim_dir=tmp_path / "sim", server_port=free_port())
    second = run_search(space, [host], _options(tmp_path, n_trials=1))
    again = second.study.get_trials()[1]
    assert TrialFacts.from_trial(again).probe, "the next launch is the probe again"
    assert again.params == probe.params
    assert again.state == TrialState.COMPLETE


def _record(number: int, state: TrialState, params: dict[str, Any], **tags: Any) -> TrialFacts:
    return TrialFacts(number=number, state=state, params=params, **tags)


def test_a_failed_point_is_asked_again_and_a_stale_retry_counts_as_its_launch(tmp_path: Path) -> None:
    space = load_space(make_space(tmp_path / "space.yaml"))
    first = start_point(space, [], None)
    assert first is not None and first[1] == "probe"
    probe = first[0]
    failed = [_record(0, TrialState.FAIL, probe, probe=True)]
    assert start_point(space, failed, None) == (probe, "probe")
    retried = [*failed, _record(1, TrialState.RUNNING, probe, retried_from=0)]
    point = start_point(space, retried, None)
    assert point is not None and point[1] == "design", "the retry stands for the probe"
    design = point[0]
    done = [*retried, _record(2, TrialState.FAIL, design, design=True)]
    assert start_point(space, done, None) == (design, "design"), "a FAIL design point is asked again"
    ok = [*done, _record(3, TrialState.COMPLETE, design, design=True)]
    later = start_point(space, ok, None)
    assert later is None or later[0] != design
    assert optuna.trial.TrialState.WAITING not in [r.state for r in ok]
