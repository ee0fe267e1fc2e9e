"""A two-node search through a real Slurm cluster on the simulated host, as docs/multi-node.md shows it:
``python benchmarks/slurm_two_nodes.py`` (as root: the cluster's daemons run as root).

Starts the test suite's throwaway Slurm cluster (``tests/fixtures/slurm.py``: munged, slurmctld and two slurmd
nodes on loopback, 8 GPUs declared on each) and runs ``servetune run`` with an inventory whose one host is that
cluster (``address: local``: the controller on the login node). DeepSeek-V3 with ``--tp 16`` over two simulated
8x H100 nodes (profile deepseek-v3-tp16-2x8-h100): each trial is one job of two nodes, rank 0 in the batch script,
rank 1 a step of the same job (``srun --overlap --nodelist``). Both nodes are this machine, so each node's
simulated GPUs are told apart by its name (``$SERVETUNE_NODE`` in the inventory's env); node 2 has 900 MiB of
every GPU held by a process nvidia-smi does not list, so at ``--mem-fraction-static 0.89`` rank 1 alone runs out
in CUDA-graph capture while 0.85 and 0.87 complete.

Prints, with the git revision: the run's own lines, ``servetune trials``, the rank-1 OOM trial's verdict line,
each rank's memory ladder, the OOM trial's Slurm job script and rank 1's command, and ``servetune export`` of
the best trial (the one script every node runs with its rank). Stops the memory hog (its process group) and the
cluster (every daemon by its recorded PID) before it returns. Every figure is simulated.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the test suite's fixture starts the cluster

from benchmarks._common import PROFILES, ROOT, metadata, workdir
from benchmarks.two_nodes import LADDER
from runners.slurm.jobs import ACTIVE
from search.driver.hosts import sim_env
from search.storage import create_or_load, open_storage
from search.trial.records import TrialFacts
from spaces.schema import load_space
from tests.fixtures.ports import free_port
from tests.fixtures.slurm import start_slurm

STUDY = "two-nodes-slurm"
SPACE = {
    "name": "dsv3-two-nodes-slurm",
    "engine": {"kind": "sim", "python": sys.executable, "version": "0.5.10",
               "sim": {"profile": str(PROFILES / "deepseek-v3-tp16-2x8-h100.yaml"), "speed": 20, "seed": 1}},
    "model_path": "deepseek-ai/DeepSeek-V3",
    "nodes": 2,
    "fixed_args": ["--tp", "16", "--trust-remote-code", "--dist-timeout", "600"],
    "knobs": {"mem_fraction_static": {"low": 0.85, "high": 0.90, "step": 0.01}},
    "correctness": {"enabled": False},
    "workload": {"input_len": 256, "output_len": 64, "concurrency": [1, 8], "requests_per_level": [2, 16],
                 "warmup_requests": 1},
    "objective": {"metric": "output_throughput", "level": 8},
    "deploy": {"python": "/opt/sglang/bin/python", "model_path": "/models/DeepSeek-V3", "port": 30000},
    "budget": {"n_trials": 3, "startup_timeout": "300s", "benchmark_timeout": "300s", "stop_grace": "5s"},
}
# The order the trials run in: one that dies on rank 1, then two that complete.
ENQUEUED = (0.89, 0.85, 0.87)


def servetune(*args: str, cwd: Path, env: dict[str, str]) -> str:
    res = subprocess.run([sys.executable, "-m", "search", *args], cwd=cwd, capture_output=True, text=True,
                         check=False, env={**os.environ, **env, "PYTHONPATH": str(ROOT), "COLUMNS": "120"},
                         timeout=1800)
    if res.returncode != 0:
        raise SystemExit(f"servetune {args[0]} failed ({res.returncode}): {res.stderr.strip()[-2000:]}")
    return res.stdout


def scrub(text: str, wd: Path, cluster_root: Path) -> str:
    """The temporary directories as WORKDIR and SLURMDIR and this checkout as REPO, so the printed output reads
    the same on every run."""
    return text.replace(str(cluster_root), "SLURMDIR").replace(str(wd), "WORKDIR").replace(str(ROOT), "REPO")


def main() -> int:
    wd = workdir("slurm-two-nodes")
    space_path = wd / "space.yaml"
    space_path.write_text(yaml.safe_dump({**SPACE, "port": free_port()}))
    space = load_space(space_path)
    sim = wd / "sim"
    for where in ("", "node1", "node2"):  # the login node's (the preflight's), then each node's own GPUs
        sim_env(space, sim / where)
    storage = f"sqlite:///{wd}/servetune.db"
    study = create_or_load(open_storage(storage), STUDY)
    for mfs in ENQUEUED:
        study.enqueue_trial({"mem_fraction_static": mfs})
    cluster = start_slurm(nodes=("node1", "node2"), gpus_per_node=8, cpus=8)
    hog: subprocess.Popen[str] | None = None
    try:
        env = {**cluster.env, "PATH": f"{sim}/$SERVETUNE_NODE/bin:$PATH",
               "SERVETUNE_SIM_STATE": f"{sim}/$SERVETUNE_NODE/state"}
        inventory = wd / "hosts.yaml"
        inventory.write_text(yaml.safe_dump({"hosts": [{
            "name": "cluster", "address": "local", "runs_root": str(wd / "runs"), "env": env,
            "python": sys.executable,
            "slurm": {"partition": "gpu", "time_limit": "00:20:00", "poll_interval": 0.5, "max_jobs": 1,
                      "gpu_memory_mib": 81559}}]}))
        hog = subprocess.Popen([sys.executable, "-m", "runners.simhost.hog", "--mib", "900", "--gpus",
                                "0,1,2,3,4,5,6,7", "--state-dir", str(sim / "node2" / "state"), "--hidden"],
                               cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert hog.stdout is not None
        hog.stdout.readline()  # registered on node 2's GPUs
        print(f"# two-node search through Slurm on the simulated host (git {metadata()['git']}); "
              "every figure is simulated")
        print("# slurm-wlm on loopback: slurmctld and two slurmd nodes (node1, node2), 8 GPUs declared on each")
        print("$ cat hosts.yaml")
        print(scrub(inventory.read_text().rstrip(), wd, cluster.root))
        print(f"\n$ servetune run space.yaml --inventory hosts.yaml --study {STUDY} --n-trials {len(ENQUEUED)}")
        out = servetune("run", str(space_path), "--inventory", str(inventory), "--study", STUDY, "--storage",
                        storage, "--n-trials", str(len(ENQUEUED)), "--no-mlflow", "--no-live", "--confirm-top", "0",
                        "--artifacts-dir", str(wd / "artifacts"), "--seed", "3", cwd=wd, env=cluster.env)
        print(scrub(out.rstrip(), wd, cluster.root))
        left = [job for job, state, comment in cluster.jobs() if state in ACTIVE and comment.startswith("servetune,")]
        print(f"# servetune's jobs still active on the cluster after the run: {', '.join(left) or 'none'}")
    finally:
        if hog is not None:
            os.killpg(hog.pid, signal.SIGTERM)  # its own process group (start_new_session)
            hog.wait(10)
            if hog.stdout is not None:
                hog.stdout.close()
        cluster.stop()

    print(f"\n$ servetune trials --study {STUDY}")
    print(scrub(servetune("trials", "--study", STUDY, "--storage", storage, cwd=wd, env={}).rstrip(),
                wd, cluster.root))
    records = [TrialFacts.from_trial(t) for t in create_or_load(open_storage(storage), STUDY).trials]
    oom = next((r for r in records if r.died_first is not None), None)
    if oom is None:
        raise SystemExit("no trial died on a rank: the rank-1 OOM this demo shows did not happen")
    print(f"\n# trial {oom.number}'s verdict ({oom.state.name} {oom.outcome}; rank {oom.died_first} died first)")
    print((oom.reason or "").splitlines()[0])
    print(f"\n# trial {oom.number}: each rank's end and memory ladder (GiB, simulated)")
    for rank in oom.ranks:
        figures = {k: rank.memory.figure(k) for k in LADDER if rank.memory.figure(k) is not None}
        end = f"{rank.outcome} in {rank.phase}" if rank.outcome else "alive until stopped"
        print(f"rank {rank.rank} ({rank.host}): {end}; {json.dumps(figures)}")
    print(f"\n# the Slurm job of trial {oom.number}: job.sbatch (head) and the rank-1 step's launch command")
    trial_dirs = sorted(p for p in (wd / "runs").rglob("job.sbatch"))
    head = next(p.parent for p in trial_dirs if p.parent.name == str(oom.number))
    for line in (head / "job.sbatch").read_text().splitlines():
        if line.startswith("#SBATCH"):
            print(scrub(re.sub(r"(controller|pid)=[^,]+", r"\1=...", line), wd, cluster.root))
    rank1 = head.parent / f"{oom.number}-rank1" / "launch.sh"
    launch = next((ln for ln in rank1.read_text().splitlines() if "--node-rank" in ln), "")
    print("rank 1: " + scrub(launch.strip(), wd, cluster.root))

    print(f"\n$ servetune export --study {STUDY} --engine sglang -o serve.sh")
    script = wd / "serve.sh"
    servetune("export", "--study", STUDY, "--storage", storage, "-o", str(script), "--min-free-gib", "0",
              "--engine", "sglang", cwd=wd, env={})
    print(scrub(script.read_text().rstrip(), wd, cluster.root))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
