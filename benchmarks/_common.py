"""Shared set-up for the benchmark scripts: a temp work dir, a space on the simulated host, a run."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
PROFILES = ROOT / "runners" / "simhost" / "profiles"


def metadata() -> dict[str, Any]:
    """pyperf-style metadata printed with every figure."""
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                         check=False).stdout.strip()
    return {
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "git": rev or "unknown",
        "host": "simulated GPU host (figures of the server are simulated; controller timings are real)",
    }


def write_space(workdir: Path, overrides: dict[str, Any]) -> Path:
    base = yaml.safe_load((ROOT / "spaces" / "demo-sim.yaml").read_text())
    base["engine"]["sim"]["profile"] = str(PROFILES / "dsv4-flash-nvfp4-tp4-rtxpro6000.yaml")
    for key, value in overrides.items():
        node = base
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    path = workdir / "space.yaml"
    path.write_text(yaml.safe_dump(base))
    return path


def workdir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"servetune-bench-{prefix}-"))


def run(space_path: Path, wd: Path, n_trials: int, *, mlflow: bool = True, seed: int = 1) -> tuple[Any, float]:
    """Run a search in ``wd`` (chdir) and return (study, wall seconds).

    ``mlflow``: with the study callbacks of ``servetune run`` (MLflow, dashboard notes)."""
    from search.driver.hosts import local_host
    from search.driver.run import RunOptions, run_search
    from search.settings import load_settings
    from spaces.schema import load_space

    os.chdir(wd)
    space = load_space(space_path)
    settings = load_settings()
    callbacks: list[Any] = []
    if mlflow:
        from search.outputs.notes import notes_callback
        from search.outputs.tracking import MlflowTracker

        callbacks.append(MlflowTracker(settings.mlflow_uri).callback(background=True))
        callbacks.append(notes_callback())
    host = local_host(space, runs_root=str(wd / "runs"), sim_dir=wd / "sim")
    options = RunOptions(study_name="bench", storage_url=f"sqlite:///{wd}/bench.db",
                         artifacts_dir=wd / "artifacts", n_trials=n_trials, timeout=None, seed=seed,
                         callbacks=callbacks, smi_interval=settings.smi_interval)
    t0 = time.perf_counter()
    summary = run_search(space, [host], options)
    for cb in callbacks:
        if hasattr(cb, "drain"):
            cb.drain()  # the MLflow logging still queued counts too
    return summary.study, time.perf_counter() - t0


def stats(values: list[float]) -> str:
    import statistics

    if not values:
        return "n/a"
    mean = statistics.fmean(values)
    spread = statistics.pstdev(values) if len(values) > 1 else 0.0
    warn = "  (WARNING: runs disagree by >=10%)" if mean and spread / mean >= 0.10 else ""
    median = statistics.median(values)
    return f"mean {mean:.3f} s, median {median:.3f} s, max {max(values):.3f} s, n={len(values)}{warn}"


if __name__ == "__main__":
    sys.exit("import me")
