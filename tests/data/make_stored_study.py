"""Makes ``tests/data/study-0.1.0.db``: a small study stored by servetune 0.1.0 (commit 36b4833), which the
current code must still read (``tests/search/test_stored_study.py``).

Run with that release's code (``git worktree add /tmp/st 36b4833``, then from there
``python tests/data/make_stored_study.py OUT.db``): a real search on the simulated host, trials enqueued
so that the outcomes are known — an eager-decode OOM (PRUNED), a survivor (COMPLETE), an NCCL error
(PRUNED) and the survivor again (reused, ``duplicate_of``) — with the dashboard notes written. Beside it,
``study-0.1.0.expected.json``: what that release's report, export, notes, ``trials --json`` and MLflow
params/metrics/tags made of it, which the current code must reproduce.
"""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import optuna

STUDY = "stored-0.1.0"


def main(out: Path) -> None:
    # That release's module paths (search/ was one flat package then): imported here, so that the test can
    # import this file's constants with today's code.
    from search.hosts import local_host  # type: ignore[import-not-found]
    from search.notes import notes_callback  # type: ignore[import-not-found]
    from search.run import RunOptions, run_search  # type: ignore[import-not-found]
    from search.study import create_or_load, open_storage  # type: ignore[import-not-found]

    from spaces.schema import load_space
    from tests.search.overnight_kit import DIES, SEED003, SURVIVES
    from tests.search.overnight_kit import make_space as kit_make_space

    out = out.resolve()
    out.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="servetune-stored-") as tmp:
        wd = Path(tmp)
        space = load_space(kit_make_space(
            wd / "space.yaml", speed=1000, workload=SEED003, safe=False, base_budget=None,
            knobs={"nccl": {"NCCL_PROTO": ["unset", "LL"], "NCCL_ALGO": ["unset", "Ring", "NVLS"]}}))
        url = f"sqlite:///{out}"
        study = create_or_load(open_storage(url), STUDY)
        for params in (DIES, SURVIVES, {**SURVIVES, "nccl.NCCL_ALGO": "NVLS"}, SURVIVES):
            study.enqueue_trial(params)
        host = local_host(space, runs_root=str(wd / "runs"), sim_dir=wd / "sim")
        options = RunOptions(study_name=STUDY, storage_url=url, artifacts_dir=wd / "artifacts", n_trials=4,
                             timeout=None, seed=3, callbacks=[notes_callback()], smi_interval=0.2)
        run_search(space, [host], options)
        host.close()


def finish(out: Path) -> None:
    """One self-contained file (no WAL beside it), compacted; run once the search's process has ended, so
    that no connection of it holds the file."""
    out.with_name(out.name + ".servetune-lock").unlink(missing_ok=True)
    with sqlite3.connect(out) as db:  # one self-contained file: no WAL beside it
        db.execute("PRAGMA journal_mode=DELETE")
    with sqlite3.connect(out) as db:
        db.execute("VACUUM")


#: The moment the expected export was rendered at (its header says when).
EXPORTED_AT = datetime(2026, 12, 1, 3, 0, 0, tzinfo=UTC)


def expected(db: Path) -> dict[str, Any]:
    """What servetune made of the stored study (report, export, notes, ``trials --json``, MLflow content)."""
    from search.export import export_script
    from search.notes import note_markdown
    from search.report import report_markdown

    from search import tracking

    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{db}")
    trials = study.get_trials()
    try:
        from search.records import TrialFacts as Record  # type: ignore[attr-defined]
    except ImportError:
        from search.records import TrialRecord as Record  # type: ignore[attr-defined,no-redef]
    recs = [Record.from_trial(t) for t in trials]
    return {
        "report": report_markdown(study),
        "export": export_script(study, now=EXPORTED_AT),
        "notes": [note_markdown(t) for t in trials],
        "trials_json": json.loads(json.dumps([r.summary() for r in recs], default=str)),
        "mlflow_params": [tracking._params(r) for r in recs],
        "mlflow_metrics": [sorted([k, v, step] for k, v, step in tracking._metrics(r)) for r in recs],
        "mlflow_tags": [tracking._tags(STUDY, r) for r in recs],
    }


if __name__ == "__main__":
    target = Path(sys.argv[1])
    searching = multiprocessing.Process(target=main, args=(target,))
    searching.start()
    searching.join()
    if searching.exitcode != 0:
        sys.exit(f"the search failed ({searching.exitcode})")
    finish(target.resolve())
    target.with_suffix(".expected.json").write_text(json.dumps(expected(target), indent=1) + "\n")
