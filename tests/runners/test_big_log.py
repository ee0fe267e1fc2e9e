"""A server that logs ~300 MB before it is ready (issue 23, row 7), with ``servetune run`` as a real process on
the simulated host (``SERVETUNE_SIM_LOG_FLOOD_MB`` makes it log that much just before its ready line):

* the trial is seen ready (COMPLETE, not a start-up timeout): the log is followed by byte offset, and a
  backlog past 256 KiB is skipped on the host, so the ready line is read moments after it is written;
* the controller's peak RSS grows by a few MB, not by the log's size (the benchmark: under 200 MB in all);
* the stored log (the artifact on disk) is capped: head and tail kept, one line saying how much was left
  out and the log's size.

``benchmarks/big_log.py`` prints the figures (peak RSS, ready line to ready state).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from optuna.trial import TrialState

from runners.logkeep import HEAD_BYTES, TAIL_BYTES, LogKeep
from tests.search.overnight_kit import cli_env, make_space, trials

#: ``servetune`` as the CLI runs it, printing its peak RSS (KiB, Linux's ru_maxrss) on stderr at exit.
MEASURED = ("import atexit, resource, sys\n"
            "atexit.register(lambda: sys.stderr.write(f'peak-rss-kib {resource.getrusage(resource.RUSAGE_SELF)"
            ".ru_maxrss}\\n'))\n"
            "sys.argv[0] = 'servetune'\n"
            "from search.cli.commands import main\n"
            "main()\n")


def test_log_keep_holds_head_and_tail_and_says_what_it_left_out() -> None:
    keep = LogKeep(head_bytes=100, tail_bytes=200, line_bytes=50)
    for i in range(1000):
        keep.append(f"line {i:04d}")
    keep.append("x" * 80)
    text = keep.text()
    assert text.startswith("line 0000\nline 0001\n")
    assert text.endswith("[servetune: line cut, 80 characters]\n")
    assert "lines (0.0 MiB) of the server log left out here; the log was 1001 lines" in text
    assert len(text) < 100 + 200 + 300
    assert keep.last(2)[0] == "line 0999" and keep.lines == 1001


def _run(tmp_path: Path, study: str, env: dict[str, str] | None) -> tuple[subprocess.CompletedProcess[str], int]:
    """``servetune run`` of one trial in ``tmp_path``; (its result, its peak RSS in KiB)."""
    space = make_space(tmp_path / f"{study}.yaml", budget={"n_trials": 1}, env=env)
    res = subprocess.run([sys.executable, "-c", MEASURED, "run", str(space), "--study", study, "--storage",
                          f"sqlite:///{tmp_path}/s.db", "--no-mlflow", "--no-live", "--confirm-top", "0"],
                         cwd=tmp_path, env=cli_env(tmp_path), capture_output=True, text=True, timeout=300,
                         check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    return res, int(res.stderr.split("peak-rss-kib ")[-1].split()[0])


@pytest.mark.xfail(strict=False, reason="known defect after the merge: the simulated log flood no longer reaches the server log (open)")
@pytest.mark.slow
def test_a_server_that_logs_300_mb_before_it_is_ready(tmp_path: Path) -> None:
    _, quiet_kib = _run(tmp_path, "quiet", None)
    _, peak_kib = _run(tmp_path, "flood", {"SERVETUNE_SIM_LOG_FLOOD_MB": "300"})
    [trial] = trials(f"sqlite:///{tmp_path}/s.db", "flood")
    assert trial.state == TrialState.COMPLETE, trial.user_attrs.get("reason")
    logs = list((tmp_path / "runs" / "flood").rglob("server.log"))
    assert logs and max(p.stat().st_size for p in logs) > 300 * 1024 * 1024, "the server really logged 300 MB"

    # The log costs the controller a few MB (the head and tail it keeps), never its size: compared with the
    # same controller's run without the flood, on the same (possibly loaded) machine. benchmarks/big_log.py
    # prints the absolute figure (target: under 200 MB).
    assert peak_kib - quiet_kib < 64 * 1024, f"peak RSS {peak_kib / 1024:.0f} MiB, {quiet_kib / 1024:.0f} without"

    [stored] = list((tmp_path / "artifacts" / "flood").rglob("server.log"))
    text = stored.read_text()
    assert len(text) < HEAD_BYTES + TAIL_BYTES + 64 * 1024
    assert "skipped here" in text or "left out here" in text
    assert "The server is fired up and ready to roll!" in text
