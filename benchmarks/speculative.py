#!/usr/bin/env python3
"""The shipped speculative space searched for real on the simulated GPU host (every server figure is simulated).

    .venv/bin/python benchmarks/speculative.py [--trials 12] [--seed 1] [--objective throughput|energy|cost]

Runs ``spaces/sim-speculative.yaml`` through the product (``run_search`` on this machine, the simulated host as a
real process) and prints one row per trial: the knobs it searched (the speculative ones only with EAGLE), its
figure at the target level, its power and energy per output token, the correctness gate's verdict, and the
recommendation, with the git revision. ``--objective cost`` prices the host at 2.50 per GPU-hour.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import ROOT, metadata, workdir
from search.driver.hosts import local_host
from search.driver.run import RunOptions, run_search
from search.spaces import load_checked_space
from search.strategy.view import StudyView
from search.trial.records import records

OBJECTIVES = {"throughput": {"metric": "output_throughput", "level": 4},
              "energy": {"kind": "energy_per_token", "level": 4},
              "cost": {"kind": "cost_per_mtok", "level": 4}}
SHORT = {"--speculative-algorithm": "algo", "--speculative-num-steps": "steps", "--speculative-eagle-topk": "topk",
         "--speculative-num-draft-tokens": "draft", "--kv-cache-dtype": "kv", "--schedule-policy": "policy",
         "mem_fraction_static": "mfs"}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--trials", type=int, default=12)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--objective", choices=sorted(OBJECTIVES), default="throughput")
    a = p.parse_args()
    wd = workdir("speculative")
    data = yaml.safe_load((ROOT / "spaces" / "sim-speculative.yaml").read_text())
    data["engine"]["sim"]["profile"] = str(ROOT / "runners/simhost/profiles/llama31-8b-h100.yaml")
    data["objective"] = OBJECTIVES[a.objective]
    path = wd / "space.yaml"
    path.write_text(yaml.safe_dump(data))
    space = load_checked_space(path)
    host = local_host(space, runs_root=str(wd / "runs"), sim_dir=wd / "sim",
                      price_per_gpu_hour=2.5 if a.objective == "cost" else None)
    options = RunOptions(study_name="speculative", storage_url=f"sqlite:///{wd}/study.db",
                         artifacts_dir=wd / "artifacts", n_trials=a.trials, timeout=None, seed=a.seed,
                         smi_interval=0.2, confirm_k=0)
    study = run_search(space, [host], options).study
    print(f"# spaces/sim-speculative.yaml, objective {space.objective.scored_by}, {a.trials} launches, seed {a.seed} "
          f"(SIMULATED host); {json.dumps(metadata())}")
    print("| trial | knobs | tok/s at C=4 | W | J/token | gate |")
    print("|---:|---|---:|---:|---:|---|")
    for r in records(study):
        knobs = ", ".join(f"{SHORT.get(k, k)}={v}" for k, v in r.params.items()
                          if k != "--speculative-draft-model-path")
        row = next((lv for lv in r.levels if lv.max_concurrency == space.target_level), None)
        tput = f"{row.output_throughput:.1f}" if row and row.output_throughput else "-"
        c = r.correctness
        gate = "-" if c is None else (f"pass ({c.agreement:.2f})" if c.passed else f"REJECTED ({c.reason})")
        if r.outcome == "constraint":
            gate = "not launched: breaks the constraint"
        power = f"{r.power_w:.0f}" if r.power_w is not None else "-"
        energy = f"{r.energy_per_token_j:.3f}" if r.energy_per_token_j is not None else "-"
        print(f"| {r.number} | {knobs} | {tput} | {power} | {energy} | {gate} |")
    choice = StudyView.of(study, space=space).choice
    if choice is not None:
        print(f"\nrecommended: trial {choice.number} ({space.objective.scored_by} = {choice.value:.4g}; "
              f"{choice.why()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
