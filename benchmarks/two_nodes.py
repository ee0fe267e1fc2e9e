"""A two-node search on the simulated host, as docs/multi-node.md shows it: ``python benchmarks/two_nodes.py``.

Two simulated 8x H100 nodes on this machine (each its own GPUs: its own state directory and nvidia-smi), taken
together by an inventory group; DeepSeek-V3 with ``--tp 16`` over both (profile deepseek-v3-tp16-2x8-h100). Node
1 has 900 MiB of each GPU held by a process nvidia-smi does not list (another container's). Prints the run's own
lines, every trial (node count, hosts, outcome, verdict), the OOM trial's memory ladder per rank, and the exported
per-node launch script (``export --engine sglang``: what each node of a real GPU pair runs), with the git
revision. Every figure is simulated.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import PROFILES, ROOT, metadata, workdir
from search.driver.hosts import sim_env
from search.storage import create_or_load, open_storage
from search.trial.records import TrialFacts
from spaces.schema import load_space

SPACE = {
    "name": "dsv3-two-nodes",
    "engine": {"kind": "sim", "python": "servetune", "version": "0.5.10",
               "sim": {"profile": str(PROFILES / "deepseek-v3-tp16-2x8-h100.yaml"), "speed": 20, "seed": 1}},
    "model_path": "deepseek-ai/DeepSeek-V3",
    "nodes": 2,
    "fixed_args": ["--tp", "16", "--trust-remote-code", "--dist-timeout", "6000"],
    "knobs": {"mem_fraction_static": {"low": 0.85, "high": 0.90, "step": 0.01}},
    "workload": {"input_len": 256, "output_len": 64, "concurrency": [1, 8], "requests_per_level": [2, 16],
                 "warmup_requests": 1},
    "objective": {"metric": "output_throughput", "level": 8},
    "deploy": {"python": "/opt/sglang/bin/python", "model_path": "/models/DeepSeek-V3", "port": 30000},
    "budget": {"n_trials": 3, "startup_timeout": "120s", "benchmark_timeout": "120s", "stop_grace": "5s"},
}
LADDER = ("weights_gib", "kv_tokens", "kv_gib", "avail_after_kv_gib", "graph_gib", "free_after_capture_gib",
          "tried_to_allocate_gib", "free_at_oom_gib")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def servetune(*args: str, cwd: Path) -> str:
    res = subprocess.run([sys.executable, "-m", "search", *args], cwd=cwd, capture_output=True, text=True,
                         check=False, env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}, timeout=1800)
    if res.returncode != 0:
        raise SystemExit(f"servetune {args[0]} failed ({res.returncode}): {res.stderr.strip()[-2000:]}")
    return res.stdout


def main() -> int:
    wd = workdir("two-nodes")
    space_path = wd / "space.yaml"
    space_path.write_text(yaml.safe_dump({**SPACE, "port": free_port()}))
    space = load_space(space_path)
    hosts = []
    for name in ("node-a", "node-b"):
        env = sim_env(space, wd / f"sim-{name}")
        hosts.append({"name": name, "address": "local", "env": env, "server_port": free_port(),
                      "runs_root": str(wd / f"runs-{name}")})
    inventory = wd / "hosts.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": hosts, "groups": [{"name": "pair", "hosts": ["node-a", "node-b"]}]}))
    storage = f"sqlite:///{wd}/servetune.db"
    study = create_or_load(open_storage(storage), "two-nodes")
    study.enqueue_trial({"mem_fraction_static": 0.89})
    study.enqueue_trial({"mem_fraction_static": 0.85})
    study.enqueue_trial({"mem_fraction_static": 0.87})
    hog = subprocess.Popen([sys.executable, "-m", "runners.simhost.hog", "--mib", "900", "--gpus", "0,1,2,3,4,5,6,7",
                            "--state-dir", hosts[1]["env"]["SERVETUNE_SIM_STATE"], "--hidden"],
                           cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert hog.stdout is not None
        hog.stdout.readline()  # registered
        print(f"# two-node search on the simulated host (git {metadata()['git']}); every figure is simulated")
        print("$ servetune run space.yaml --inventory hosts.yaml --study two-nodes --n-trials 3")
        print(servetune("run", str(space_path), "--inventory", str(inventory), "--study", "two-nodes", "--storage",
                        storage, "--n-trials", "3", "--no-mlflow", "--no-live", "--confirm-top", "0",
                        "--artifacts-dir", str(wd / "artifacts"), "--seed", "3", cwd=wd).rstrip())
    finally:
        os.kill(hog.pid, signal.SIGTERM)
        hog.wait(10)
    print("\n# the trials")
    records = [TrialFacts.from_trial(t) for t in create_or_load(open_storage(storage), "two-nodes").trials]
    for rec in records:
        mfs = rec.params.get("mem_fraction_static")
        value = f"{rec.value:.1f} tok/s" if rec.value is not None else "-"
        print(f"trial {rec.number}: mem_fraction_static={mfs} nodes={rec.nodes} on {rec.host}: {rec.state.name} "
              f"{rec.outcome} {value}")
        if rec.reason:
            print(f"  verdict: {rec.reason.splitlines()[0][:300]}")
    oom = next((r for r in records if r.died_first is not None), None)
    if oom is not None:
        print(f"\n# trial {oom.number}: each rank's end and memory ladder (GiB, simulated)")
        for rank in oom.ranks:
            figures = {k: rank.memory.figure(k) for k in LADDER if rank.memory.figure(k) is not None}
            end = f"{rank.outcome} in {rank.phase}" if rank.outcome else "alive until stopped"
            print(f"rank {rank.rank} ({rank.host}): {end}; {json.dumps(figures)}")
    print("\n$ servetune export --study two-nodes --engine sglang -o serve.sh")
    out = wd / "serve.sh"
    servetune("export", "--study", "two-nodes", "--storage", storage, "-o", str(out), "--min-free-gib", "0",
              "--engine", "sglang", cwd=wd)
    print(out.read_text().rstrip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
