"""The controller's overhead per trial on a Slurm cluster, beside the SSH runner's.

Starts a throwaway Slurm cluster on loopback (the test suite's fixture, ``tests/fixtures/slurm.py``: needs root
and Debian's slurm-wlm) and a real sshd on 127.0.0.1 (``tests/fixtures/sshd.py``), then runs the same search of
N surviving trials on the simulated host through three runners, one trial at a time:

* ``ssh``: a plain host over SSH (the server a detached process group);
* ``slurm (local)``: the Slurm runner with the controller on the login node (each trial one ``sbatch`` job);
* ``slurm (ssh)``: the Slurm runner reaching the login node over SSH.

Per trial: ``submit -> running`` (``queue_s``: Slurm's scheduling of a job on an idle cluster), ``running ->
ready`` (``startup_s``: the server's own start-up plus how long servetune takes to see it ready), ``stop``
(``stop_s``: SIGTERM to the stopped job), and the controller's overhead: the trial's duration less its queue
wait, start-up and benchmark sweep (preflight, run directory, submit, stop, recording). The server's start-up
is the same simulated replay on every runner, so the difference of the ``running -> ready`` medians is the
readiness-detection cost of the runner (``srun --overlap`` for each ``/health`` look on Slurm).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from _common import ROOT, metadata, stats, workdir, write_space
from optuna.trial import TrialState

sys.path.insert(0, str(ROOT))  # the test suite's fixtures start the cluster and the sshd

from runners.host import Host
from runners.inventory import HostSpec
from runners.placement.registry import open_placements
from search.driver.hosts import sim_env
from search.driver.run import RunOptions, run_search
from search.trial.records import TrialFacts
from spaces.schema import load_space
from tests.fixtures.slurm import start_slurm
from tests.fixtures.sshd import make_key, start_sshd, write_known_hosts

SLURM = {"partition": "gpu", "time_limit": "00:10:00", "poll_interval": 0.5, "max_jobs": 1}


def _run(name: str, wd: Path, space_path: Path, hosts: list[Host], n: int) -> list[dict[str, float]]:
    options = RunOptions(study_name=name.replace(" ", "-").replace("(", "").replace(")", ""),
                         storage_url=f"sqlite:///{wd}/bench.db", artifacts_dir=wd / "artifacts", n_trials=n,
                         timeout=None, seed=1, smi_interval=1.0, confirm_k=0)
    try:
        summary = run_search(load_space(space_path), hosts, options)
    finally:
        for h in hosts:
            h.close()
    rows = []
    for t in summary.study.trials:
        facts = TrialFacts.from_trial(t)
        if t.state != TrialState.COMPLETE or not facts.launched:
            continue
        assert t.datetime_start is not None and t.datetime_complete is not None
        duration = (t.datetime_complete - t.datetime_start).total_seconds()
        queue, startup, bench = facts.queue_s or 0.0, facts.startup_s or 0.0, facts.bench_s or 0.0
        rows.append({"queue_s": queue, "startup_s": startup, "stop_s": facts.stop_s or 0.0,
                     "overhead_s": duration - queue - startup - bench})
    return rows


def _median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows) if rows else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=6)
    args = parser.parse_args()
    wd = workdir("slurm-overhead")
    space_path = write_space(wd, {
        "knobs": {"mem_fraction_static": {"low": 0.58, "high": 0.62, "step": 0.01},
                  "cuda_graph_max_bs": {"choices": [64, 80]}},
        "workload": {"input_len": 64, "output_len": 16, "concurrency": [1, 4], "requests_per_level": [1, 4],
                     "warmup_requests": 0},
        "objective.level": 4, "engine.sim.speed": 200, "budget.n_trials": args.trials,
    })
    space = load_space(space_path)
    key = make_key(wd / "ssh" / "id_ed25519")
    sshd = start_sshd(wd / "sshd", "127.0.0.1", key)
    cluster = start_slurm(nodes=("node1",), gpus_per_node=8, cpus=8)
    results: dict[str, list[dict[str, float]]] = {}
    try:
        known = write_known_hosts(wd / "known_hosts", sshd)
        env = sim_env(space, wd / "sim")
        ssh_spec = sshd.spec(known, env=env, runs_root=str(wd / "runs-ssh"))
        slurm_local = HostSpec.model_validate({"name": "cluster", "address": "local", "env": cluster.env,
                                               "runs_root": str(wd / "runs-slurm"), "slurm": SLURM})
        slurm_ssh = sshd.spec(known, name="cluster-ssh", env=cluster.env, runs_root=str(wd / "runs-slurm-ssh"),
                              slurm=SLURM)
        for name, spec in (("ssh", ssh_spec), ("slurm (local)", slurm_local), ("slurm (ssh)", slurm_ssh)):
            results[name] = _run(name, wd, space_path, open_placements(spec, ssh_config=None), args.trials)
    finally:
        cluster.stop()
        sshd.stop()
    print(json.dumps({**metadata(), "slurm": "slurm-wlm 22.05 on loopback, one node, 8 GPUs declared by count",
                      "load_average_1m": round(os.getloadavg()[0], 1)}))
    print("| runner | trials | submit -> running (median) | running -> ready (median) | stop (median) | "
          "controller overhead per trial |")
    print("|---|---|---|---|---|---|")
    for name in ("ssh", "slurm (local)", "slurm (ssh)"):
        rows = results[name]
        print(f"| {name} | {len(rows)} | {_median(rows, 'queue_s'):.3f} s | {_median(rows, 'startup_s'):.3f} s | "
              f"{_median(rows, 'stop_s'):.3f} s | {stats([r['overhead_s'] for r in rows])} |")
    base = _median(results["ssh"], "startup_s")
    for name in ("slurm (local)", "slurm (ssh)"):
        print(f"{name}: readiness seen {_median(results[name], 'startup_s') - base:+.3f} s later than over SSH "
              "(median; the server's simulated start-up is the same)")


if __name__ == "__main__":
    main()
