"""``servetune`` as a real process that prints its own peak RSS at exit: one copy for the big-log benchmark
(``benchmarks/big_log.py``) and its test (``tests/runners/test_big_log.py``), so both measure the same way.

The figure is Linux's ``ru_maxrss`` of the controller process itself (KiB), read in an ``atexit`` hook; the
server and the load generator are other processes and do not count.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["MEASURED", "PeakRssRun", "run_measured"]

#: The CLI's entry point run by ``python -c``, printing ``peak-rss-kib N`` on stderr at exit.
MEASURED = ("import atexit, resource, sys\n"
            "atexit.register(lambda: sys.stderr.write(f'peak-rss-kib {resource.getrusage(resource.RUSAGE_SELF)"
            ".ru_maxrss}\\n'))\n"
            "sys.argv[0] = 'servetune'\n"
            "from search.cli.commands import main\n"
            "main()\n")

_MARK = "peak-rss-kib "


class PeakRssRun:
    """One measured ``servetune`` command: its completed process and its peak RSS (None when it printed none:
    it died before ``atexit``)."""

    def __init__(self, proc: subprocess.CompletedProcess[str]) -> None:
        self.proc = proc
        tail = proc.stderr.rsplit(_MARK, 1)
        self.peak_kib: int | None = int(tail[1].split()[0]) if len(tail) == 2 else None

    @property
    def peak_mib(self) -> float:
        if self.peak_kib is None:
            raise ValueError("the command printed no peak RSS (it did not exit normally)")
        return self.peak_kib / 1024

    def output(self) -> str:
        return self.proc.stdout + self.proc.stderr


def run_measured(args: tuple[str, ...] | list[str], *, cwd: Path, env: Mapping[str, str],
                 timeout: float | None = None) -> PeakRssRun:
    """``servetune ARGS`` in ``cwd`` with ``env`` (the whole environment), measured."""
    proc = subprocess.run([sys.executable, "-c", MEASURED, *args], cwd=cwd, env=dict(env), capture_output=True,
                          text=True, timeout=timeout, check=False)
    return PeakRssRun(proc)
