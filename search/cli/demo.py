"""``make demo``: a real search on the built-in simulated host, then the exported launch script.

Runs the search of ``spaces/demo-sim.yaml`` through :func:`search.run_study` (resuming the study if it
exists), exports the best trial's launch script to ``demo-out/`` (as tuned, and for real SGLang on a GPU box),
checks both with ``bash -n``, and says how to browse the results.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import optuna
from optuna.trial import TrialState
from rich.console import Console

from runners.errors import ServetuneError
from search.api import run_study
from search.cli.safe import SafeConsole, safe_write
from search.cli.views import Progress, print_plan, print_run
from search.outputs.export import export_script, write_script
from search.outputs.tracking import MlflowTracker, experiment_url
from search.settings import Settings, load_settings, study_name
from search.spaces import load_checked_space, sim_calibration
from search.storage import open_study

ROOT = Path(__file__).resolve().parents[2]
#: The sampler's seed, so that a first demo samples the same configurations each time.
SEED = 7


def _resume_budget(settings: Settings, study: str) -> int | None:
    """A study that already exists is resumed with 6 more trials; a new one gets the space's budget.

    The study is looked up where the search keeps it (``SERVETUNE_STORAGE``, ``servetune.toml``).
    """
    try:
        existing = open_study(settings.storage, study)
    except ServetuneError:
        return None
    done = len(existing.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))
    print(f"resuming study {study}: {done} trials so far, adding 6")
    return done + 6


def demo(study: str, n_trials: int | None, console: Console, err_console: Console) -> int:
    """The demo; returns the exit status."""
    settings = load_settings()
    space = load_checked_space(ROOT / "spaces" / "demo-sim.yaml")
    budget = n_trials or _resume_budget(settings, study)
    calibration = sim_calibration(space)
    if calibration is not None:  # absolute figures read as broken unless one knows what set them
        print(f"the simulated host is calibrated to {calibration}")
    summary = run_study(space, settings, study_name=study, n_trials=budget, seed=SEED,
                        progress=Progress(console, n_trials=None, metric=space.objective.scored_by, simulated=True),
                        on_start=lambda plan: print_plan(console, plan, simulated=True))
    print_run(console, err_console, summary, space)
    if summary.stopped_by.interrupted:
        return 130
    out = ROOT / "demo-out"
    out.mkdir(exist_ok=True)
    script = out / f"serve_{study}.sh"
    write_script(script, export_script(summary.view))
    # The same configuration for real SGLang on a GPU box (the space's deploy section).
    sglang = out / f"serve_{study}_sglang.sh"
    write_script(sglang, export_script(summary.view, engine="sglang", deploy=space.deploy))
    checks = {path: subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
              for path in (script, sglang)}
    for path, check in checks.items():
        verdict = "bash -n: ok" if check.returncode == 0 else f"bash -n FAILED: {check.stderr.strip()}"
        what = "to serve with real SGLang on a GPU box" if path == sglang else "on the simulated host"
        print(f"\nexported the best configuration {what} to {path.relative_to(ROOT)} ({verdict})")
    print(f"\nlist the trials:  .venv/bin/servetune trials --study {study}")
    print("browse the study: .venv/bin/servetune dashboard            # optuna-dashboard on http://127.0.0.1:8080;"
          " servetune's choice and why: the study's Note page (the URL it prints)")
    print("MLflow UI:        .venv/bin/mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db "
          "--host 127.0.0.1 --port 5000")
    try:
        experiment = MlflowTracker(settings.mlflow_uri).experiment_id(study)
        print(f"  then open {experiment_url('http://127.0.0.1:5000', experiment)}  # the runs table, sorted by the "
              "objective (MLflow 3 opens a plain experiment link on its GenAI overview)")
    except ServetuneError as exc:
        print(f"  (the study's MLflow experiment is not readable: {exc})")
    print("run it again to resume the study with 6 more trials: make demo")
    return 0 if all(check.returncode == 0 for check in checks.values()) else 1


def _study(value: str) -> str:
    try:
        return study_name(value)
    except ServetuneError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--study", default="demo-sim-dsv4", type=_study)
    parser.add_argument("--n-trials", type=int, default=None)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        code = demo(args.study, args.n_trials, SafeConsole(), SafeConsole(stderr=True))
    except ServetuneError as exc:
        safe_write(f"servetune: error: {' '.join(str(exc).split())}\n", sys.stderr)
        code = 1
    sys.exit(code)


if __name__ == "__main__":
    main()
