"""The controller's own overhead per trial: everything but the server's start-up and the benchmark traffic.

Runs a search of N trials on the simulated host (every trial survives: a safe memory fraction and graph
size), then for each trial: overhead = trial duration - (launch -> ready) - (benchmark sweep). Also the
per-trial wall overhead of the whole run, which includes the MLflow and dashboard-note callbacks.
Target: under 1 s.
"""

from __future__ import annotations

import argparse
import json

from _common import metadata, run, stats, workdir, write_space
from optuna.trial import TrialState

from search.trial.records import TrialFacts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=8)
    args = parser.parse_args()
    wd = workdir("overhead")
    space = write_space(wd, {
        "knobs": {"mem_fraction_static": {"low": 0.58, "high": 0.62, "step": 0.01},
                  "cuda_graph_max_bs": {"choices": [64, 80]},
                  "num_continuous_decode_steps": {"choices": [1, 2, 4]}},
        "budget.n_trials": args.trials,
    })
    study, wall = run(space, wd, args.trials)
    trials = [t for t in study.trials if t.state == TrialState.COMPLETE and TrialFacts.from_trial(t).launched]
    in_trial = []
    served = 0.0
    for t in trials:
        duration = (t.datetime_complete - t.datetime_start).total_seconds()
        facts = TrialFacts.from_trial(t)
        server = (facts.startup_s or 0.0) + (facts.bench_s or 0.0)
        served += server
        in_trial.append(duration - server)
    ran = [t for t in study.trials if TrialFacts.from_trial(t).launched]
    per_trial_wall = (wall - served) / max(len(trials), 1) if len(trials) == len(ran) else float("nan")
    print(json.dumps(metadata()))
    print(f"trials: {len(trials)} complete of {len(study.trials)}")
    print(f"controller overhead inside a trial (preflight, start, stop, recording): {stats(in_trial)}")
    print(f"controller overhead per trial incl. callbacks (MLflow, notes): {per_trial_wall:.3f} s")


if __name__ == "__main__":
    main()
