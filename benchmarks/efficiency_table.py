"""The docs' efficiency table (Markdown) from the JSON files ``benchmarks/efficiency.py --json`` wrote.

    benchmarks/efficiency_table.py FILE.json [FILE.json ...] [warm-FILE.json ...]

Files whose name holds ``warm-`` are servetune-only runs with ``--warm``: their honest-figure and warm-start lines
are printed under the landscape's own (and replace a main run's warm-start line).

One row per landscape and strategy: launches to 98% of the optimum (median / worst / misses), GPU-minutes to 98%
(median over every seed; a miss counts its whole run), GPU-minutes of the whole run (to the confirmed answer),
the share of launches that died, early stops and the GPU-minutes they saved, and the reported figure over the true
value. Then, per landscape, the issue's targets: GPU-minutes to 98% against TPE and SCOOT, the reported figure's
honesty, and the warm-started second study. Every figure is simulated.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

NAMES = {"grid": "grid (person's order)"}


def _f(v: Any, spec: str = "g") -> str:
    return "-" if v is None else format(v, spec)


def table(reports: list[dict[str, Any]], extra: list[dict[str, Any]] | None = None) -> list[str]:
    """The table of ``reports``; ``extra``: servetune-only runs (``--warm``) whose honest-figure and warm-start
    lines replace those of the same landscape in ``reports``."""
    later = {name: entry for report in (extra or []) for name, entry in report["spaces"].items()}
    revs = sorted({r["metadata"]["git"] for r in reports})
    seeds = sorted({r["seeds"] for r in reports})
    launches = sorted({r["launches"] for r in reports})
    out = [f"Measured at revision `{', '.join(revs)}`: {', '.join(map(str, seeds))} seeds, "
           f"{', '.join(map(str, launches))} launches per search (all figures simulated).", "",
           "| landscape | strategy | to 98%: launches med / worst / misses | GPU-min to 98% (median) | "
           "GPU-min whole run | died | stopped early / GPU-min saved | reported/true |",
           "|---|---|---|---|---|---|---|---|"]
    notes: list[str] = []
    for report in reports:
        for name, entry in report["spaces"].items():
            share = entry["dying"] / entry["configurations"]
            head = (f"`{name}` ({entry['configurations']:,} configurations, {share:.0%} die, "
                    f"{entry['noise_pct']:g}% noise, {entry.get('gpus', '?')} GPUs)")
            for strategy, data in entry["strategies"].items():
                s = data["summary"]
                a = s["to_0.98"]
                over = s["reported_over_true_median"]
                bold = "**" if strategy == "servetune" else ""
                cells = [f"{_f(a['median'])} / {_f(a['worst'])} / {a['misses']}",
                         _f(s["gpu_minutes_to_0.98"]["median"], ".1f"), _f(s["gpu_minutes_median"], ".1f"),
                         f"{s['died_share']:.0%}",
                         f"{s.get('stopped_early_per_seed', 0):.1f} / {s.get('saved_gpu_minutes_per_seed', 0):.1f}",
                         "-" if over is None else f"{over:+.1%}"]
                out.append(f"| {head} | {bold}{NAMES.get(strategy, strategy)}{bold} | "
                           + " | ".join(f"{bold}{c}{bold}" for c in cells) + " |")
                head = ""
            mine = _notes(name, entry, report["seeds"])
            if name in later:  # the later servetune-only run's warm start replaces this run's
                seeds = next(r["seeds"] for r in extra or [] if name in r["spaces"])
                rev = next(r["metadata"]["git"] for r in extra or [] if name in r["spaces"])
                mine = [line for line in mine if not line.startswith("  second study")]
                mine += [f"  servetune alone, {seeds} seeds at `{rev}`:", *_notes(name, later[name], seeds)[1:]]
            notes += mine
    return [*out, "", *notes]


def _notes(name: str, entry: dict[str, Any], seeds: int) -> list[str]:
    out = [f"- `{name}`:"]
    for other, t in entry.get("targets", {}).items():
        out.append(f"  GPU-minutes to 98% servetune / {other} {_f(t['ratio'], '.2f')} "
                   f"({'met' if t['met'] else '**missed**'});")
    st = entry["strategies"].get("servetune", {}).get("summary")
    if st is not None and st.get("reported_worst") is not None:
        iv = st.get("interval_median")
        out.append(f"  reported figure within 3% of the truth in {st['reported_within_3pct']}/{seeds} seeds (worst "
                   f"{st['reported_worst']:+.1%}), stated 90% interval median {'-' if iv is None else f'±{iv:.1%}'}, "
                   f"{_f(st['final_launches_median'])} final launches (median);")
    warm = entry.get("warm_start")
    if warm:
        w, c = warm["warm"], warm["cold"]
        out.append(f"  second study with a new workload, warm-started: first launch within 2% of the optimum in "
                   f"{w['first_within_2pct']}/{seeds} seeds, {w['died']} launches died, "
                   f"{w['gpu_minutes_to_0.98_median']:.1f} GPU-min to 98% (cold: {c['first_within_2pct']}/{seeds}, "
                   f"{c['died']} died, "
                   f"{c['gpu_minutes_to_0.98_median']:.1f} GPU-min).")
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    main_files = [p for p in argv if "warm-" not in Path(p).name]
    extra_files = [p for p in argv if "warm-" in Path(p).name]
    reports = [json.loads(Path(p).read_text()) for p in main_files]
    extra = [json.loads(Path(p).read_text()) for p in extra_files]
    print("\n".join(table(reports, extra)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
