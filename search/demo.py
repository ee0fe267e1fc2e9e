"""``make demo``: a real search on the built-in simulated host, then the exported launch script.

Runs ``servetune run spaces/demo-sim.yaml`` (resuming the study if it exists), exports the best trial's
launch script to ``demo-out/``, checks it with ``bash -n``, and says how to browse the results.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from optuna.trial import TrialState

from runners.errors import ServetuneError
from search.cli import _open
from search.cli import main as cli_main
from search.settings import study_name

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str) -> None:
    sys.argv = ["servetune", *args]
    try:
        cli_main()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise


def _resume_budget(study: str) -> int | None:
    """A study that already exists is resumed with 6 more trials; a new one gets the space's budget.

    The study is looked up where ``servetune run`` keeps it (``SERVETUNE_STORAGE``, ``servetune.toml``).
    """
    import optuna

    try:
        existing = _open(study)
    except ServetuneError:
        return None
    done = len(existing.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print(f"resuming study {study}: {done} trials so far, adding 6")
    return done + 6


def _study(value: str) -> str:
    try:
        return study_name(value)
    except ServetuneError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--study", default="demo-sim-dsv4", type=_study)
    parser.add_argument("--n-trials", default=None)
    args = parser.parse_args()
    space = ROOT / "spaces" / "demo-sim.yaml"
    run_args = ["run", str(space), "--study", args.study, "--seed", "7"]
    n_trials = args.n_trials or _resume_budget(args.study)
    if n_trials:
        run_args += ["--n-trials", str(n_trials)]
    _cli(*run_args)
    out = ROOT / "demo-out"
    out.mkdir(exist_ok=True)
    script = out / f"serve_{args.study}.sh"
    _cli("export", "--study", args.study, "-o", str(script))
    check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    verdict = "bash -n: ok" if check.returncode == 0 else f"bash -n FAILED: {check.stderr.strip()}"
    print(f"\nexported the best configuration to {script.relative_to(ROOT)} ({verdict})")
    print(f"\nlist the trials:  .venv/bin/servetune trials --study {args.study}")
    print("browse the study: .venv/bin/servetune dashboard            # optuna-dashboard on http://127.0.0.1:8080")
    print("MLflow UI:        .venv/bin/mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db "
          "--host 127.0.0.1 --port 5000")
    print("run it again to resume the study with 6 more trials: make demo")
    if check.returncode != 0:
        sys.exit(1)


if __name__ == "__main__":
    main()
