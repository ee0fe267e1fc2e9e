"""Soak: many fast trials in one controller on the simulated host, and proof that nothing leaks.

Runs one search of ``--trials`` trials (default 200) on the simulated GPU host with the callbacks of an
overnight run (MLflow on a local store, dashboard notes), the whole knob range (so some trials die of OOM
and take the crash paths too) and a tiny workload. It prints:

* trials per hour (wall clock of the whole search, callbacks included);
* the controller's peak RSS, and its RSS after the warm-up and at the end;
* before/after counts of processes in the controller's session, threads, open file descriptors, live
  server process groups under the runs root and the simulated GPUs' compute processes and used memory.

"Before" is taken after ``--warmup`` trials (connection pools, the MLflow logger and imports are set up by
then), "after" once the search has returned. It exits 1 when anything is left over: a process in the
session, a thread, a file descriptor, a server, or GPU memory. The benchmark runs in a session of its own
(it re-executes itself with ``start_new_session`` when it is not a session leader), so the processes it
counts are its own.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _common import metadata, workdir, write_space

from search.trial.records import TrialFacts


def proc_stats() -> Iterator[tuple[int, list[str]]]:
    """``(pid, fields)`` of every process: the fields of ``/proc/PID/stat`` after the command name
    (``fields[0]`` state, ``[2]`` process group, ``[3]`` session)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        yield int(entry.name), fields


def session_processes() -> list[int]:
    """PIDs in this process's session other than itself (zombies included: an unreaped child is a leak)."""
    me, sid = os.getpid(), os.getsid(0)
    return [pid for pid, fields in proc_stats() if pid != me and int(fields[3]) == sid]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def group_alive(pgid: int) -> bool:
    return any(fields[0] != "Z" and int(fields[2]) == pgid for _, fields in proc_stats())


def live_servers(runs_root: Path) -> list[str]:
    out = []
    for pgid_file in runs_root.glob("*/*/pgid"):
        text = pgid_file.read_text().strip()
        if text.isdigit() and group_alive(int(text)):
            out.append(str(pgid_file.parent))
    return out


def snapshot(host: Any, runs_root: Path) -> dict[str, Any]:
    gpus, apps = host.gpu_state()  # one nvidia-smi round trip
    return {
        "session_processes": len(session_processes()),
        "threads": threading.active_count(),
        "open_fds": open_fds(),
        "live_servers": len(live_servers(runs_root)),
        "gpu_compute_processes": len(apps),
        "gpu_used_mib": round(sum(g.used_mib or 0.0 for g in gpus), 1),
        "rss_mib": round(rss_mib(), 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200, help="trials in the search (default 200)")
    parser.add_argument("--warmup", type=int, default=10, help="trials before the 'before' snapshot")
    parser.add_argument("--no-mlflow", action="store_true", help="leave MLflow out")
    parser.add_argument("--speed", type=float, default=1000, help="simulated seconds per wall second")
    args = parser.parse_args()
    if os.getsid(0) != os.getpid():  # count only our own processes: run in a session of our own
        return subprocess.call([sys.executable, *sys.argv], start_new_session=True)
    warmup = max(1, min(args.warmup, args.trials - 1))

    from search.driver.hosts import local_host
    from search.driver.run import RunOptions, run_search
    from search.outputs.notes import notes_callback
    from search.outputs.tracking import MlflowTracker
    from search.settings import load_settings
    from spaces.schema import load_space

    wd = workdir("soak")
    space_path = write_space(wd, {
        "engine.sim.speed": args.speed,
        "workload": {"input_len": 64, "output_len": 16, "concurrency": [1, 4], "requests_per_level": [1, 4],
                     "warmup_requests": 0},
        "objective.level": 4,
        "budget": {"n_trials": args.trials, "startup_timeout": "30s", "benchmark_timeout": "60s",
                   "stop_grace": "2s", "max_consecutive_failures": 3},
        "port": 30000 + os.getpid() % 20000,
    })
    os.chdir(wd)
    space = load_space(space_path)
    settings = load_settings()
    runs_root = wd / "runs"
    host = local_host(space, runs_root=str(runs_root), sim_dir=wd / "sim")
    baseline = snapshot(host, runs_root)
    marks: dict[str, Any] = {}
    callbacks: list[Any] = []
    mlflow_callback = None
    tracker = None
    if not args.no_mlflow:
        tracker = MlflowTracker(settings.mlflow_uri)
        mlflow_callback = tracker.callback(background=True)
        callbacks.append(mlflow_callback)
    callbacks.append(notes_callback())

    finished = 0  # trials finished so far: the study is new, and this one controller runs them all

    def mark(study: Any, trial: Any) -> None:
        nonlocal finished
        finished += 1
        if finished == warmup and "before" not in marks:
            if mlflow_callback is not None:
                mlflow_callback.drain()
            marks["before"] = snapshot(host, runs_root)
            marks["t_before"] = time.perf_counter()

    callbacks.append(mark)
    options = RunOptions(study_name="soak", storage_url=f"sqlite:///{wd}/soak.db", artifacts_dir=wd / "artifacts",
                         n_trials=args.trials, timeout=None, seed=7, smi_interval=settings.smi_interval,
                         callbacks=callbacks)
    started = time.perf_counter()
    summary = run_search(space, [host], options)
    if tracker is not None:
        tracker.finish_study(summary.study)
    wall = time.perf_counter() - started
    after = snapshot(host, runs_root)
    host.close()
    before = marks.get("before", baseline)

    ts = summary.study.get_trials(deepcopy=False)
    states: dict[str, int] = {}
    for t in ts:
        states[t.state.name] = states.get(t.state.name, 0) + 1
    reused = sum(1 for t in ts if not TrialFacts.from_trial(t).launched)
    ooms = sum(1 for t in ts if TrialFacts.from_trial(t).outcome == "oom")
    after_warmup = len(ts) - warmup
    steady = time.perf_counter() - marks["t_before"] if "t_before" in marks else float("nan")

    print(json.dumps(metadata()))
    print(f"workdir: {wd}")
    print(f"trials: {len(ts)} ({', '.join(f'{k} {v}' for k, v in sorted(states.items()))}; {ooms} OOM, "
          f"{reused} reused a measured configuration); stopped by: {summary.stopped_by}")
    print(f"wall: {wall:.1f} s; trials per hour: {len(ts) / wall * 3600:.0f} "
          f"(after the warm-up: {after_warmup / steady * 3600:.0f})")
    print(f"controller peak RSS: {peak_rss_mib():.1f} MiB (after {warmup} trials {before['rss_mib']} MiB, "
          f"at the end {after['rss_mib']} MiB)")
    print(f"{'':24}{'baseline':>10}{'before':>10}{'after':>10}")
    leaks = []
    for key in ("session_processes", "threads", "open_fds", "live_servers", "gpu_compute_processes",
                "gpu_used_mib"):
        print(f"{key:24}{baseline[key]:>10}{before[key]:>10}{after[key]:>10}")
        reference = baseline[key] if key in ("live_servers", "gpu_compute_processes", "gpu_used_mib") \
            else before[key]
        if after[key] > reference:
            leaks.append(f"{key}: {reference} -> {after[key]}")
    if len([t for t in ts if t.state.name in ("COMPLETE", "PRUNED")]) != args.trials:
        leaks.append(f"budget: {args.trials} trials asked, the study holds {states}")
    if leaks:
        print("LEAK: " + "; ".join(leaks))
        return 1
    print("no leak: no process, thread, file descriptor, server or GPU memory left over")
    return 0


if __name__ == "__main__":
    sys.exit(main())
