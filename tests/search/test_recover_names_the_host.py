"""The warning about a trial left RUNNING by a stopped controller names that trial's host (its recorded name),
never the last host of the loop over this run's hosts (issue 29)."""

from __future__ import annotations

import logging

import optuna
import pytest

from runners.host import Lease, RunRef
from search.driver.run import _recover
from search.trial.records import TrialFacts, write_facts


class _Host:
    """What recovery asks of a host: its name, its orphans, its hold's live leases, its controller."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.controller_id = "this-controller"

    def cleanup_orphans(self, *, grace: float) -> list[RunRef]:
        return []

    @property
    def hold(self) -> _Host:
        return self

    def live(self) -> list[Lease]:
        return []


def test_the_stale_trial_warning_names_the_trials_own_host(caplog: pytest.LogCaptureFixture) -> None:
    study = optuna.create_study()
    trial = study.ask()
    write_facts(trial, TrialFacts(controller="a-gone-controller", host="gpu-a"))
    hosts = [_Host("gpu-a"), _Host("gpu-b")]  # the loop over the hosts ends on gpu-b
    with caplog.at_level(logging.WARNING):
        _recover(study, hosts, grace=1.0)  # type: ignore[arg-type]
    lines = [r.getMessage() for r in caplog.records if "left RUNNING" in r.getMessage()]
    assert lines == [f"trial {trial.number} was left RUNNING on gpu-a by a controller that stopped: it will be "
                     "failed once its heartbeat is stale, and retried"]
