"""The host's GPUs are the host's: a process that appears on them during a trial makes the trial FAIL
``host_busy`` (never PRUNED, never a verdict on the configuration), with the evidence in its reason.

Every process started here is stopped by its PID or process group.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from optuna.trial import TrialState

from runners.telemetry import FailureKind
from search.trial.records import TrialFacts
from tests.fixtures.hog import start_hog, stop_hog
from tests.search.overnight_kit import (
    cli_env,
    live_servers,
    make_space,
    start_cli,
    study_runs,
    trials,
    wait_for,
)

GATED_PYTHON = """#!/usr/bin/env bash
# The engine's python, but a server waits for the test's gate file before it starts (the preflight and the
# version checks run at once): the test puts a foreign process on the GPUs in between.
if [ "$1 $2" = "-m runners.simhost.server" ]; then
  while [ ! -e {gate} ]; do sleep 0.05; done
fi
exec {python} "$@"
"""


@pytest.mark.slow
def test_a_process_that_appears_on_the_gpus_during_a_trial_is_host_busy_never_pruned(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    python = tmp_path / "gated-python"
    python.write_text(GATED_PYTHON.format(gate=gate, python=sys.executable))
    python.chmod(0o755)
    space = make_space(tmp_path / "space.yaml")
    (tmp_path / "hosts.yaml").write_text(yaml.safe_dump({"hosts": [
        {"name": "local", "address": "local", "runs_root": str(tmp_path / "runs"), "python": str(python)}]}))
    storage = f"sqlite:///{tmp_path}/s.db"
    ctl = start_cli("run", str(space), "--study", "hog", "--storage", storage, "--no-mlflow", "--no-live",
                    "--confirm-top", "0", "--n-trials", "1", "--inventory", "hosts.yaml", cwd=tmp_path,
                    env=cli_env(tmp_path))
    hog = None
    try:
        wait_for("the first server's run directory", lambda: (study_runs(tmp_path / "runs", "hog") / "0" / "pgid")
                 .exists(), timeout=60)
        # After the preflight found the GPUs free, before the server looks at them: 80 GiB on GPU 0.
        hog = start_hog(tmp_path / ".servetune/simhost/state", 80 * 1024, gpus="0")
        gate.touch()
        first = wait_for("trial 0 to end", lambda: next((t for t in trials(storage, "hog")
                                                         if t.number == 0 and t.state.is_finished()), None),
                         timeout=120)
        stop_hog(hog)
        assert ctl.finish(240) == 0, ctl.output()
    finally:
        if hog is not None:
            stop_hog(hog)
        ctl.kill()
    facts = TrialFacts.from_trial(first)
    assert first.state == TrialState.FAIL, (first.state, facts.reason)
    assert facts.outcome == FailureKind.HOST_BUSY
    assert "another process appeared on the GPUs" in facts.reason and f"pid {hog.pid}" in facts.reason
    assert "out of memory" in facts.reason.lower(), "the engine's own error is kept"
    ts = trials(storage, "hog")
    assert not [t for t in ts if t.state == TrialState.PRUNED], "nothing is blamed on a configuration"
    assert ts[-1].state == TrialState.COMPLETE, "once the GPUs are free again the search goes on"
    assert live_servers(tmp_path / "runs") == []
