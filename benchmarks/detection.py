"""Delay from a server's death to its trial being stored as PRUNED.

Runs trials that die of OOM on the simulated host (seed 003: --cuda-graph-max-bs 32 at C=64 dies in eager
decode; and a capture OOM at start-up), and for each: the time between the process's exit (the run
wrapper writes ``exit_code`` the moment the server exits) and ``datetime_complete`` of the PRUNED trial.
Target: under 0.5 s.
"""

from __future__ import annotations

import argparse
import json
import os

from _common import metadata, run, stats, workdir, write_space
from optuna.trial import TrialState

from search.trial.records import TrialFacts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=8)
    args = parser.parse_args()
    wd = workdir("detection")
    space = write_space(wd, {
        "knobs": {"mem_fraction_static": {"low": 0.66, "high": 0.90, "step": 0.01},
                  "cuda_graph_max_bs": {"choices": [16, 24, 32]}},
        "budget.n_trials": args.trials,
    })
    study, _ = run(space, wd, args.trials, mlflow=False)
    delays = []
    phases: dict[str, int] = {}
    for t in study.trials:
        if t.state != TrialState.PRUNED or not TrialFacts.from_trial(t).launched:
            continue
        found = sorted((wd / "runs").glob(f"bench.*/{t.number}/exit_code"))  # <study>.<study id>/<trial>
        if not found:
            continue
        exit_file = found[0]
        died = os.stat(exit_file).st_mtime
        stored = t.datetime_complete.timestamp()
        delays.append(stored - died)
        phase = str(TrialFacts.from_trial(t).phase)
        phases[phase] = phases.get(phase, 0) + 1
    print(json.dumps(metadata()))
    print(f"pruned OOM trials measured: {len(delays)} (by phase: {phases})")
    print(f"death -> PRUNED stored: {stats(delays)}")


if __name__ == "__main__":
    main()
