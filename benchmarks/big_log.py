"""A server that logs 300 MB before it is ready: the controller's peak memory, and how soon it sees the server
ready.

Each repeat runs one trial on the simulated host whose server logs ``--flood-mb`` MB of warnings just before its
ready line (``SERVETUNE_SIM_LOG_FLOOD_MB``), twice:

* ``servetune run`` as a real process: its peak RSS (``ru_maxrss`` at exit; target under 200 MB), and the same
  without the flood, for comparison;
* ``run_search`` in this process: the time from the ready line appearing in ``server.log`` (a watcher reads the
  file's last 64 KiB every 5 ms) to the trial's ``ServerReady`` event.

The server and its figures are simulated; the controller's memory and timings are real.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import ROOT, metadata, stats, workdir, write_space
from benchmarks.peak_rss import run_measured
from runners.events import ServerReady
from search.driver.hosts import local_host
from search.driver.run import RunOptions, run_search
from spaces.schema import load_space

READY = b"The server is fired up and ready to roll!"
FAST = {"input_len": 64, "output_len": 16, "concurrency": [1, 4], "requests_per_level": [1, 4], "warmup_requests": 0}


def space_file(wd: Path, flood_mb: float) -> Path:
    overrides: dict[str, Any] = {
        "workload": FAST, "objective.level": 4, "budget.n_trials": 1, "budget.startup_timeout": "120s",
        "knobs.mem_fraction_static": {"low": 0.56, "high": 0.66, "step": 0.01},
    }
    if flood_mb:
        overrides["env"] = {"SERVETUNE_SIM_LOG_FLOOD_MB": str(flood_mb)}
    return write_space(wd, overrides)


def peak_rss_mib(wd: Path, flood_mb: float, study: str) -> float:
    space = space_file(wd, flood_mb)
    env = {**os.environ, "SERVETUNE_RUNS_ROOT": str(wd / "runs"), "SERVETUNE_ARTIFACTS_DIR": str(wd / "artifacts"),
           "SERVETUNE_HOST_DIR": str(wd / "hostdir"), "PYTHONPATH": str(ROOT)}
    res = run_measured(("run", str(space), "--study", study, "--storage", f"sqlite:///{wd}/rss.db", "--no-mlflow",
                        "--no-live", "--confirm-top", "0"), cwd=wd, env=env)
    if res.proc.returncode != 0 or res.peak_kib is None:
        raise SystemExit(f"servetune run failed:\n{res.output()}")
    return res.peak_mib


def ready_delay(wd: Path, flood_mb: float, study: str) -> float:
    """Seconds from the ready line in server.log to the trial's ServerReady event."""
    space = load_space(space_file(wd, flood_mb))
    runs = wd / "runs"
    seen: dict[str, float] = {}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set() and "line" not in seen:
            for log in runs.glob(f"{study}.*/*/server.log"):  # <study>.<study id>/<trial>
                with open(log, "rb") as fh:
                    fh.seek(max(0, os.path.getsize(log) - 65536))
                    if READY in fh.read():
                        seen["line"] = time.time()
            time.sleep(0.005)

    def hook(number: int, event: object) -> None:
        if isinstance(event, ServerReady) and "ready" not in seen:
            seen["ready"] = time.time()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    host = local_host(space, runs_root=str(runs), sim_dir=wd / "sim", host_dir=str(wd / "hostdir"))
    options = RunOptions(study_name=study, storage_url=f"sqlite:///{wd}/ready.db", artifacts_dir=wd / "artifacts",
                         n_trials=1, timeout=None, hook=hook, confirm_k=0)
    try:
        run_search(space, [host], options)
    finally:
        stop.set()
        watcher.join()
        host.close()
    if "line" not in seen or "ready" not in seen:
        raise SystemExit(f"the trial was not seen ready ({sorted(seen)})")
    return seen["ready"] - seen["line"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flood-mb", type=float, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    wd = workdir("big-log")
    os.chdir(wd)
    quiet = [peak_rss_mib(wd, 0, f"quiet{i}") for i in range(args.repeats)]
    flood = [peak_rss_mib(wd, args.flood_mb, f"flood{i}") for i in range(args.repeats)]
    delays = [ready_delay(wd, args.flood_mb, f"ready{i}") for i in range(args.repeats)]
    calm = [ready_delay(wd, 0, f"calm{i}") for i in range(args.repeats)]
    print(json.dumps(metadata()))
    print(f"server log before ready: {args.flood_mb:g} MB (simulated server); repeats: {args.repeats}")
    print(f"controller peak RSS, no flood: max {max(quiet):.0f} MiB ({', '.join(f'{v:.0f}' for v in quiet)})")
    print(f"controller peak RSS, {args.flood_mb:g} MB log: max {max(flood):.0f} MiB "
          f"({', '.join(f'{v:.0f}' for v in flood)}); target under 200 MB")
    print(f"ready line -> trial ready, {args.flood_mb:g} MB log: {stats(delays)}")
    print(f"ready line -> trial ready, no flood: {stats(calm)}")
    print(f"(this process, for scale: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MiB)")


if __name__ == "__main__":
    main()
