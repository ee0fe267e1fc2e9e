"""Score ``servetune diagnose`` on the log corpus: outcome, phase and OOM figures, per set, with the git revision.

The sets (``tests/data/logs/SOURCES.md``): ``original`` (the logs the parsers were first written against),
``tuning`` (real pastes the parsers may be fixed on) and ``measuring`` (real pastes held out: scored, never tuned
on). A case's figures count when its label states the OOM sizes (``tried_to_allocate_gib``/``free_at_oom_gib``);
every labelled figure is scored apart as ``all figures``. Misses are listed for the sets tuned on; the measuring
set's misses only with ``--show-measuring-misses`` (read them after a change, never to make one).

    .venv/bin/python benchmarks/diagnose_corpus.py [--json FILE] [--show-measuring-misses]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._common import metadata  # noqa: E402
from runners.diagnose import diagnose_file  # noqa: E402

CORPUS = ROOT / "tests" / "data" / "logs"
SETS = {"original": CORPUS, "tuning": CORPUS / "tuning", "measuring": CORPUS / "measuring"}
OOM_FIGURES = ("tried_to_allocate_gib", "free_at_oom_gib")
TUNED_ON = ("original", "tuning")


def figure_matches(expected: Any, got: Any) -> bool:
    """A labelled figure against the verdict's: ``"present"`` = any value; numbers within 1% (or 0.005)."""
    if expected == "present":
        return got is not None
    if not isinstance(got, int | float):
        return False
    return math.isclose(float(got), float(expected), rel_tol=0.01, abs_tol=0.005)


@dataclass
class CaseResult:
    name: str
    outcome_ok: bool
    phase_ok: bool
    states_oom_figures: bool
    oom_figures_ok: bool
    figures_total: int
    figures_ok: int
    misses: list[str] = field(default_factory=list)


def score_case(log: Path) -> CaseResult:
    """Diagnose one corpus log and compare the verdict with its ``.expected.json``."""
    expected = json.loads(log.with_name(log.name.removesuffix(".log") + ".expected.json").read_text())
    result = diagnose_file(log, **expected.get("options", {})).to_dict()
    misses = []
    outcome_ok = result["outcome"] == expected["outcome"]
    phase_ok = result["phase"] == expected["phase"]
    if not outcome_ok:
        misses.append(f"outcome {result['outcome']} (want {expected['outcome']})")
    if not phase_ok:
        misses.append(f"phase {result['phase']} (want {expected['phase']})")
    memory = expected.get("memory", {})
    oom_keys = [key for key in OOM_FIGURES if key in memory]
    oom_ok = all(figure_matches(memory[key], result["memory"].get(key)) for key in oom_keys)
    figures_ok = 0
    for key, value in memory.items():
        if figure_matches(value, result["memory"].get(key)):
            figures_ok += 1
        else:
            misses.append(f"{key} {result['memory'].get(key)} (want {value})")
    return CaseResult(log.name.removesuffix(".log"), outcome_ok, phase_ok, bool(oom_keys), oom_ok,
                      len(memory), figures_ok, misses)


def score_set(directory: Path) -> list[CaseResult]:
    return [score_case(log) for log in sorted(directory.glob("*.log"))]


def summary(results: list[CaseResult]) -> dict[str, Any]:
    """Counts and shares of one set: outcome, phase, OOM figures (of the logs stating them), all figures."""
    n = len(results)
    oom = [r for r in results if r.states_oom_figures]
    total = sum(r.figures_total for r in results)

    def share(k: int, m: int) -> dict[str, Any]:
        return {"right": k, "of": m, "share": round(k / m, 4) if m else None}

    return {
        "logs": n,
        "outcome": share(sum(r.outcome_ok for r in results), n),
        "phase": share(sum(r.phase_ok for r in results), n),
        "oom_figures": share(sum(r.oom_figures_ok for r in oom), len(oom)),
        "all_figures": share(sum(r.figures_ok for r in results), total),
    }


def _cell(part: dict[str, Any]) -> str:
    if not part["of"]:
        return "-"
    return f"{part['right']}/{part['of']} ({100 * part['share']:.0f}%)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the scores and misses to this file")
    parser.add_argument("--show-measuring-misses", action="store_true",
                        help="list the measuring set's misses too (after a change, never to make one)")
    args = parser.parse_args(argv)
    meta = metadata()
    scores: dict[str, Any] = {"metadata": meta, "sets": {}}
    print(f"servetune diagnose on the log corpus, git {meta['git']}")
    print(f"{'set':<10} {'logs':>4}  {'outcome':<13} {'phase':<13} {'OOM figures':<13} {'all figures':<13}")
    results_by_set = {name: score_set(directory) for name, directory in SETS.items()}
    for name, results in results_by_set.items():
        s = summary(results)
        scores["sets"][name] = {**s, "misses": {r.name: r.misses for r in results if r.misses}}
        print(f"{name:<10} {s['logs']:>4}  {_cell(s['outcome']):<13} {_cell(s['phase']):<13} "
              f"{_cell(s['oom_figures']):<13} {_cell(s['all_figures']):<13}")
    print("tuned on: original, tuning; measuring is held out")
    for name, results in results_by_set.items():
        if name not in TUNED_ON and not args.show_measuring_misses:
            continue
        for r in results:
            if r.misses:
                print(f"  miss [{name}] {r.name}: {'; '.join(r.misses)}")
    if args.json:
        args.json.write_text(json.dumps(scores, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
