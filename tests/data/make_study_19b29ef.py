"""Makes ``tests/data/study-19b29ef.db``: a study stored by servetune at commit 19b29ef (the last release before
search/ was split into parts), which the current code must still read (``tests/search/test_stored_study.py``).

Run with that revision's code (``git worktree add /tmp/st 19b29ef``, then from there
``PYTHONPATH=/tmp/st python tests/data/make_study_19b29ef.py OUT.db``; it uses only the library calls both
revisions share): a real search of the demo space on the simulated host, with the probe, the start-up design,
predicted-OOM skips, the sampler, the screening repeats and the final launches. Beside it,
``study-19b29ef.expected.json``: the configuration that revision recommended (its report's verdict and its export
header) and its ``trials --json`` rows, which the current code must reproduce.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any

import optuna
import yaml

STUDY = "stored-19b29ef"
ROOT = Path(__file__).resolve().parents[2]


def main(out: Path) -> None:
    from search import run_study
    from search.settings import load_settings
    from search.spaces import load_checked_space

    out = out.resolve()
    out.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="servetune-stored-") as tmp:
        wd = Path(tmp)
        data = yaml.safe_load((ROOT / "spaces" / "demo-sim.yaml").read_text())
        data["engine"]["sim"]["profile"] = str(ROOT / "runners" / "simhost" / "profiles"
                                               / "dsv4-flash-nvfp4-tp4-rtxpro6000.yaml")
        data["engine"]["sim"]["speed"] = 1000
        (wd / "space.yaml").write_text(yaml.safe_dump(data))
        space = load_checked_space(wd / "space.yaml")
        os.chdir(wd)
        settings = load_settings(storage=f"sqlite:///{out}", artifacts_dir=str(wd / "artifacts"),
                                 runs_root=str(wd / "runs"), sim_dir=str(wd / "sim"), smi_interval=0.2)
        run_study(space, settings, study_name=STUDY, n_trials=10, mlflow=False, seed=7)
        # A configuration a person queues that dies of OOM in eager decode (graphs of 16 at 64 in flight).
        study = optuna.load_study(study_name=STUDY, storage=settings.storage)
        study.enqueue_trial({"mem_fraction_static": 0.86, "cuda_graph_max_bs": 16, "nccl.NCCL_PROTO": "unset",
                             "nccl.NCCL_ALGO": "unset"})
        run_study(space, settings, study_name=STUDY, n_trials=11, mlflow=False, seed=8)


def finish(out: Path) -> None:
    """One self-contained file (no WAL beside it), compacted, once the search's process has ended."""
    out.with_name(out.name + ".servetune-lock").unlink(missing_ok=True)
    with sqlite3.connect(out) as db:
        db.execute("PRAGMA journal_mode=DELETE")
    with sqlite3.connect(out) as db:
        db.execute("VACUUM")


def expected(db: Path) -> dict[str, Any]:
    """What that revision recommended, and its ``trials --json`` rows."""
    from search.export import export_script  # type: ignore[import-not-found]
    from search.records import records  # type: ignore[import-not-found]
    from search.report import report_markdown  # type: ignore[import-not-found]

    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{db}")
    verdict = report_markdown(study).split("## Verdict", 1)[1].split("\n## ", 1)[0]
    header = [line for line in export_script(study).splitlines() if line.startswith("# servetune export")]
    return {
        "verdict_best_line": next(line for line in verdict.splitlines() if line.startswith("- **Best")),
        "export_first_line": header[0],
        "trials_json": json.loads(json.dumps([r.summary() for r in records(study)], default=str)),
    }


if __name__ == "__main__":
    target = Path(sys.argv[1]).resolve()
    searching = multiprocessing.Process(target=main, args=(target,))
    searching.start()
    searching.join()
    if searching.exitcode != 0:
        sys.exit(f"the search failed ({searching.exitcode})")
    finish(target)
    target.with_suffix(".expected.json").write_text(json.dumps(expected(target), indent=1) + "\n")
