"""The morning summary of a study (``servetune report``) and the live figures of ``servetune status``.

Both read the trial records of :mod:`search.records` only. :func:`report_markdown` says what was tried and
what was learned: counts, the best configuration with its figures per concurrency level, the OOM boundary
(which ``mem_fraction_static`` x ``cuda_graph_max_bs`` combinations died, where, with how much headroom, and
which survived), failures by cause, and the time spent. :func:`study_status` is a typed summary: trials
done/running/pruned/failed, each host's state, the best so far and an estimate of the time left.

:func:`report_html` is the same report as one self-contained HTML file (no network, no other file: plotly.js
is inlined) with the study's figures (:mod:`search.figures`) after the verdict; :func:`publish` writes both
files next to the trial artifacts and attaches the HTML to the study (an optuna-dashboard study artifact).

The Markdown helpers (:func:`levels_table`, :func:`memory_table`) are shared with the dashboard notes.
"""

from __future__ import annotations

import html
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeGuard

import optuna
from optuna.trial import TrialState
from pydantic import BaseModel

from search.confirm import chosen_record, confirmed_best, launches_of, origin
from search.front import Goal, front, pick_record
from search.records import LevelResult, TrialFacts, records, value_text

if TYPE_CHECKING:
    import plotly.graph_objects as go
    from optuna.artifacts._protocol import ArtifactStore

    from search.figures import Boundary

__all__ = [
    "THIN_HEADROOM_GIB",
    "Published",
    "StudyStatus",
    "format_duration",
    "levels_table",
    "memory_table",
    "publish",
    "report_html",
    "report_markdown",
    "study_best",
    "study_status",
]

#: Free GPU memory after CUDA graph capture below which a configuration is called thin (seed 001: 0.82 GB
#: of headroom was a crash waiting for a prefill burst).
THIN_HEADROOM_GIB = 2.0

FRACTION_KNOBS = ("mem_fraction_static", "gpu_memory_utilization")
GRAPH_KNOBS = ("cuda_graph_max_bs", "cuda_graph_sizes", "max_num_seqs")

MEMORY_LABELS: dict[str, str] = {
    "gpu_total_gib": "GPU total (GiB)",
    "mem_fraction_static": "mem_fraction_static (as run)",
    "cuda_graph_max_bs": "cuda_graph_max_bs (as run)",
    "avail_before_weights_gib": "available before weights (GiB)",
    "weights_gib": "weights (GiB)",
    "avail_after_weights_gib": "available after weights (GiB)",
    "kv_tokens": "KV cache tokens",
    "kv_gib": "KV cache (GiB)",
    "avail_after_kv_gib": "available after KV pool (GiB)",
    "graph_gib": "CUDA graphs (GiB)",
    "free_after_capture_gib": "free after CUDA graph capture (GiB)",
    "max_total_num_tokens": "max_total_num_tokens",
    "max_running_requests": "max_running_requests",
    "chunked_prefill_size": "chunked_prefill_size",
    "context_len": "context_len",
    "oom_phase": "OOM phase",
    "tried_to_allocate_gib": "OOM: tried to allocate (GiB)",
    "free_at_oom_gib": "OOM: free at the time (GiB)",
    "smi_peak_used_mib": "nvidia-smi peak used (MiB)",
}

#: Outcomes that say the host, not the configuration, could not take a trial: the host is shown unavailable.
_INFRA_TROUBLE = frozenset({"host_unreachable", "host_busy", "host_config", "port_in_use"})


# ---- the report ----------------------------------------------------------------------------------


def report_markdown(study: optuna.Study) -> str:
    """The study's summary as Markdown (see the module docstring for what it holds)."""
    recs = records(study)
    head, body = _report_parts(study, recs)
    return "\n".join([*head, *body]).rstrip() + "\n"


def _report_parts(study: optuna.Study, recs: Sequence[TrialFacts]) -> tuple[list[str], list[str]]:
    """(title, objective and verdict; the rest): the HTML report puts the figures between the two."""
    head: list[str] = [f"# servetune report: {study.study_name}", ""]
    target = _objective_text(study, recs)
    if target:
        head += [target, ""]
    if any(r.simulated for r in recs):
        head += ["> Figures marked simulated come from the simulated GPU host, not from real hardware.", ""]
    head += _verdict_section(study, recs)
    body = _counts_section(recs)
    body += _front_section(study, recs)
    body += _best_section(study, recs)
    body += _rate_search_section(recs)
    body += _boundary_section(recs)
    body += _failures_section(recs)
    body += _skipped_section(recs)
    body += _trials_section(recs)
    body += _time_section(recs)
    return head, body


#: What bound a configuration, by the phase its neighbours died in.
LIMIT_WORDS = {
    "kv_pool": "the KV pool (too little memory left for the KV cache)",
    "cuda_graph": "the CUDA graph pool (graph capture ran out of memory)",
    "prefill": "prefill activations (a prefill batch ran out of memory)",
    "decode": "the eager fallback (a decode batch above the graph batch size ran without graphs and out of "
              "memory)",
}


def study_best(study: optuna.Study, recs: Sequence[TrialFacts]) -> TrialFacts | None:
    """The trial the study's summary leads with: the best COMPLETE feasible one, or in a ``pareto`` study the
    knee of the front (:mod:`search.front`; its ``values`` are the medians over its launches)."""
    goal = Goal.of(study)
    if goal.pareto:
        return pick_record(recs, goal)
    # The configuration chosen on its repeated launches, with the figure `run` and `export` report (not the
    # best single launch, which is the luckiest).
    return chosen_record(recs, study.direction)


def _figures_text(rec: TrialFacts, goal: Goal, *, units: bool = True) -> str:
    """```metric` = value unit`` for the study's objective(s)."""
    pairs: list[tuple[str, float | None]]
    if goal.pareto and rec.values:
        pairs = list(zip(goal.metrics, rec.values, strict=False))
    else:
        pairs = [(rec.objective_metric or "objective", rec.value)]
    return ", ".join(f"`{m}` = {_fmt(v)}" + (f" {_unit(m)}" if units and _unit(m) else "") for m, v in pairs)


def _verdict_section(study: optuna.Study, recs: Sequence[TrialFacts]) -> list[str]:
    out = ["## Verdict", ""]
    goal = Goal.of(study)
    best = study_best(study, recs)
    if best is None:
        return [*out, "No configuration survived yet: there is no verdict.", ""]
    level = best.objective_level
    knobs = ", ".join(f"`{k}={_fmt(v)}`" for k, v in sorted(best.params.items()))
    at = f" at concurrency {level}" if level is not None else ""
    sim = " (simulated)" if best.simulated else ""
    if goal.pareto:
        points = front(recs, goal)
        out.append(f"- **Front:** {len(points)} configuration(s) that no other beats on every metric "
                   f"({goal.describe()}); see *Pareto front* below, and pick one with `servetune export --pick`.")
        out.append(f"- **Knee of the front: trial {best.number}**, {_figures_text(best, goal)}{at}{sim}: "
                   f"{knobs or 'no searched knob'}.")
    else:
        out.append(f"- **Best: trial {best.number}**, {_figures_text(best, goal)}{at}{sim}: "
                   f"{knobs or 'no searched knob'}.")
    same = [r.number for r in recs if r.duplicate_of == best.number]
    confirmed = f"one benchmark sweep on host `{best.host}`" if best.host else "one benchmark sweep"
    runs = launches_of(recs, best.number)
    if goal.pareto and len(runs) > 1:
        confirmed = (f"{len(runs)} launches (trials {', '.join(f'#{r.number}' for r in runs)}); the figures are "
                     "their medians")
    elif len(runs) > 1 and (chosen := confirmed_best(recs, study.direction)) is not None:
        which = (f"the median of the {chosen.final} launches made after it was chosen" if chosen.final
                 else "the median of its repeats")
        confirmed = (f"{len(runs)} launches (trials {', '.join(f'#{r.number}' for r in runs)}), spread "
                     f"{chosen.spread:.1%}; the figure is {which}")
    if best.simulated:
        confirmed += " of the simulated GPU host (not real hardware: confirm on a GPU before serving)"
    if same:
        confirmed += f"; trial(s) {', '.join(f'#{n}' for n in same)} asked for it again and reused that result"
    out.append(f"- **Confirmed by:** {confirmed}.")
    free = best.free_after_capture_gib
    if free is None:
        out.append("- **Headroom:** free GPU memory after CUDA graph capture not measured.")
    else:
        thin = f" (**thin**: below {THIN_HEADROOM_GIB:g} GiB)" if free < THIN_HEADROOM_GIB else ""
        out.append(f"- **Headroom:** {free:.2f} GiB free per GPU after CUDA graph capture{thin}.")
    out.append(f"- **What bound it:** {_bound_text(best, recs)}")
    return [*out, ""]


def _bound_text(best: TrialFacts, recs: Sequence[TrialFacts]) -> str:
    ooms = [r for r in recs if r.label == "oom" and r.measured]
    if not ooms:
        return "no trial ran out of memory, so no memory limit was reached within the searched space."
    nearest = min(ooms, key=lambda r: _distance(best, r, recs))
    phases = Counter(r.phase.value if r.phase else "unknown" for r in ooms)
    by_phase = ", ".join(f"{p} x{n}" for p, n in phases.most_common())
    where = nearest.phase.value if nearest.phase else ""
    limit = LIMIT_WORDS.get(where, f"an OOM in {where or 'an unknown phase'}")
    return (f"{limit}: the nearest configuration that died (trial {nearest.number}) died there. "
            f"Deaths by phase: {by_phase}.")


def _distance(a: TrialFacts, b: TrialFacts, recs: Sequence[TrialFacts]) -> float:
    """Distance of two trials over their numeric knobs, each scaled to the range the study tried."""
    total = 0.0
    for name in sorted(set(a.params) | set(b.params)):
        va, vb = a.params.get(name), b.params.get(name)
        if _is_number(va) and _is_number(vb):
            seen = [float(r.params[name]) for r in recs if _is_number(r.params.get(name))]
            span = (max(seen) - min(seen)) or 1.0
            total += ((float(va) - float(vb)) / span) ** 2
        elif va != vb:
            total += 0.25
    return math.sqrt(total)


def _rate_search_section(recs: Sequence[TrialFacts]) -> list[str]:
    """``max_rate_under_slo``: per trial, the rate found and each step of its search in the order measured
    (held, or what broke); nothing for other objectives."""
    searched = sorted((r for r in recs if r.slo_rate_search), key=lambda r: r.number)
    if not searched:
        return []
    limits = next((r.slo_limits for r in searched if r.slo_limits), None) or {}
    held = ", ".join(f"`{k}` <= {v:g}" for k, v in limits.items())
    out = ["## SLO rate search", "",
           f"Each trial searched the highest request rate (Poisson arrivals) at which {held or 'the SLO'} held: "
           "it bracketed, then bisected; steps in the order measured.", "",
           "| trial | rate found (req/s) | steps: rate (req/s) and verdict |", "|---:|---:|---|"]
    for rec in searched:
        steps = "; ".join(f"{step.rate:g} " + ("held" if step.holds else "broke: " + ", ".join(step.violations))
                          for step in rec.slo_rate_search)
        found = f"{rec.slo_rate:g}" if rec.slo_rate is not None else "none held"
        out.append(f"| #{rec.number} | {found} | {_escape(steps)} |")
    return [*out, ""]


def _skipped_section(recs: Sequence[TrialFacts]) -> list[str]:
    out = ["## Skipped and why", ""]
    rows: list[str] = []
    for rec in sorted(recs, key=lambda r: r.number):
        why = ""
        if rec.duplicate_of is not None:
            why = f"same configuration as trial {rec.duplicate_of}: its result was reused, nothing ran"
        elif rec.label == "predicted_oom":
            why = "the memory model predicted an OOM: not launched" + (f" ({_short(rec.reason, 100)})"
                                                                       if rec.reason else "")
        elif rec.state == TrialState.FAIL:
            why = (f"infrastructure trouble ({rec.label}): not counted, the sampler learns nothing from it"
                   + (f"; {_short(rec.reason, 100)}" if rec.reason else ""))
        elif rec.state == TrialState.WAITING:
            why = "queued, not run yet"
        elif rec.state == TrialState.RUNNING:
            why = "still running when the report was made"
        if why:
            rows.append(f"| #{rec.number} | {rec.state.name} | {_escape(why)} |")
    if not rows:
        return [*out, "Nothing: every trial launched its configuration and finished.", ""]
    return [*out, "| trial | state | why |", "|---:|---|---|", *rows, ""]


def _trials_section(recs: Sequence[TrialFacts]) -> list[str]:
    knobs: list[str] = []
    for rec in recs:
        knobs += [k for k in rec.params if k not in knobs]
    out = ["## All trials", "",
           "| # | state | outcome | value | " + " | ".join(f"`{k}`" for k in knobs)
           + " | free after capture (GiB) | reason |",
           "|---:|---|---|---:|" + "---:|" * len(knobs) + "---:|---|"]
    for rec in sorted(recs, key=lambda r: r.number):
        outcome = rec.label + (f" in {rec.phase.value}" if rec.phase and rec.label != "ok" else "")
        cells = [f"#{rec.number}", rec.state.name, outcome, _value_cell(rec),
                 *(_fmt(rec.params.get(k)) for k in knobs), _fmt(rec.free_after_capture_gib),
                 _short(rec.reason, 100) or "-"]
        out.append("| " + " | ".join(_escape(c) for c in cells) + " |")
    return [*out, ""]


def _value_cell(rec: TrialFacts) -> str:
    """A trial's value, or a pareto trial's values (`` / ``-joined)."""
    return value_text(rec, "{:.2f}") if rec.values is not None else _fmt(rec.value)


def _unit(metric: str) -> str:
    if metric.endswith("_ms"):
        return "ms"
    if metric == "request_throughput":
        return "req/s"
    if metric.endswith("_throughput"):
        return "tok/s"
    return ""


# ---- the HTML report --------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; }
th { background: #f3f3f3; }
blockquote { border-left: 4px solid #e0a000; margin: 0.5em 0; padding: 0.3em 1em; background: #fff8e0; }
code { background: #f3f3f3; padding: 0 0.2em; }
.figure { margin: 1em 0 2em; }
"""


def report_html(study: optuna.Study, *, figures: dict[str, go.Figure] | None = None,
                boundary: Boundary | None = None) -> str:
    """The report as one self-contained HTML page: the verdict, the figures (``figures``, default
    :func:`search.figures.study_figures`), then the rest of :func:`report_markdown`. plotly.js is inlined, so
    the page loads nothing from anywhere."""
    import markdown
    from plotly.offline import get_plotlyjs

    from search.figures import study_figures

    recs = records(study)
    figures = figures if figures is not None else study_figures(study, boundary=boundary, recs=recs)
    head, body = _report_parts(study, recs)

    def render(lines: list[str]) -> str:
        return markdown.markdown("\n".join(lines), extensions=["tables"], output_format="html")

    config = {"displaylogo": False, "responsive": True}
    divs = ['<div class="figure">'
            + fig.to_html(full_html=False, include_plotlyjs=False, div_id=graph_id, config=config,
                          default_height="560px") + "</div>"
            for graph_id, fig in figures.items()]
    title = html.escape(f"servetune report: {study.study_name}")
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        # An inline favicon: without one the browser asks the file's folder for favicon.ico.
        '<link rel="icon" href="data:,">',
        f"<title>{title}</title>", f"<style>{_CSS}</style>",
        f'<script type="text/javascript">{get_plotlyjs()}</script>', "</head>", "<body>",
        render(head), "<h2>Figures</h2>", *divs, render(body), "</body>", "</html>", "",
    ])


@dataclass(frozen=True)
class Published:
    """What :func:`publish` wrote: the two report files and the figures it drew."""

    markdown: Path
    html: Path
    figures: dict[str, go.Figure]


def publish(study: optuna.Study, directory: Path, *, artifact_store: ArtifactStore | None = None,
            boundary: Boundary | None = None) -> Published:
    """Write ``report.md`` and ``report.html`` into ``directory``, refresh the dashboard figures, and (with
    an ``artifact_store``) attach the HTML report to the study as an optuna-dashboard study artifact.

    Raises ConfigError when a file cannot be written (a full disk, a directory in the way)."""
    from search.figures import save_to_dashboard, study_figures
    from search.files import write_file

    figures = study_figures(study, boundary=boundary)
    md_path, html_path = directory / "report.md", directory / "report.html"
    write_file(md_path, report_markdown(study), parents=True)
    write_file(html_path, report_html(study, figures=figures))
    save_to_dashboard(study, figures)
    if artifact_store is not None:
        from optuna.artifacts import upload_artifact

        upload_artifact(artifact_store=artifact_store, file_path=str(html_path), study_or_trial=study,
                        mimetype="text/html", encoding="utf-8")
    return Published(markdown=md_path, html=html_path, figures=figures)


def _objective_text(study: optuna.Study, recs: Sequence[TrialFacts]) -> str:
    metric = next((r.objective_metric for r in recs if r.objective_metric), None)
    level = next((r.objective_level for r in recs if r.objective_level), None)
    if metric is None:
        return ""
    at = f" at concurrency {level}" if level is not None else ""
    goal = Goal.of(study)
    if goal.pareto:
        return f"Objective: the pareto front of {goal.describe()}{at}."
    return f"Objective: {study.direction.name.lower()} `{metric}`{at}."


def _counts(recs: Iterable[TrialFacts]) -> Counter[str]:
    return Counter(r.state.name for r in recs)


def _counts_section(recs: Sequence[TrialFacts]) -> list[str]:
    counts = _counts(recs)
    out = ["## Trials", "", "| complete | pruned | failed | running | waiting | total |",
           "|---:|---:|---:|---:|---:|---:|",
           f"| {counts['COMPLETE']} | {counts['PRUNED']} | {counts['FAIL']} | {counts['RUNNING']} | "
           f"{counts['WAITING']} | {len(recs)} |", ""]
    duplicates = sum(1 for r in recs if not r.measured)
    if duplicates:
        out += [f"{duplicates} trial(s) repeated a measured configuration and reused its result.", ""]
    return out


def _front_section(study: optuna.Study, recs: Sequence[TrialFacts]) -> list[str]:
    """A ``pareto`` study's front as a table (nothing for one objective)."""
    goal = Goal.of(study)
    if not goal.pareto:
        return []
    out = ["## Pareto front", ""]
    points = front(recs, goal)
    if not points:
        return [*out, "No COMPLETE feasible configuration yet: no front.", ""]
    knee = pick_record(recs, goal)
    by_number = {r.number: r for r in recs}
    knobs = sorted({k for p in points for k in by_number[p.number].params})
    out += [f"{goal.describe()}; each configuration's figures are the medians over its launches (its repeats "
            "included). Pick one with `servetune export --pick knee` (the default) or conditions such as "
            f"`--pick \"{goal.metrics[-1]}<=X\"` (then the best `{goal.metrics[0]}`).", "",
            "| trial | " + " | ".join(f"`{m}`" for m in goal.metrics) + " | launches | "
            + " | ".join(f"`{k}`" for k in knobs) + " |",
            "|---:|" + "---:|" * (len(goal.metrics) + 1) + "---:|" * len(knobs)]
    launches = Counter(origin(r) for r in recs if r.state == TrialState.COMPLETE and r.measured)
    for p in sorted(points, key=lambda p: p.values[0]):
        rec = by_number[p.number]
        tag = " (knee)" if knee is not None and knee.number == p.number else ""
        cells = [f"#{p.number}{tag}", *(_fmt(v) for v in p.values), str(launches.get(p.number, 1)),
                 *(_fmt(rec.params.get(k)) for k in knobs)]
        out.append("| " + " | ".join(_escape(c) for c in cells) + " |")
    return [*out, ""]


def _best_section(study: optuna.Study, recs: Sequence[TrialFacts]) -> list[str]:
    goal = Goal.of(study)
    best = study_best(study, recs)
    out = ["## Knee of the front" if goal.pareto else "## Best configuration", ""]
    if best is None:
        return [*out, "No COMPLETE feasible trial yet.", ""]
    level = best.objective_level
    at = f" at concurrency {level}" if level is not None else ""
    where = ", ".join(x for x in (
        f"host `{best.host}`" if best.host else "",
        f"{best.gpu_name} x {best.gpu_count}" if best.gpu_name else "",
        f"{best.engine} {best.engine_version}" if best.engine else "",
        "simulated" if best.simulated else "",
    ) if x)
    out += [f"Trial {best.number}: {_figures_text(best, goal, units=goal.pareto)}{at} ({where}).", ""]
    out += [_headroom_line(best.free_after_capture_gib, THIN_HEADROOM_GIB), ""]
    if best.params:
        out += ["| knob | value |", "|---|---|"]
        out += [f"| `{k}` | {_cell(v)} |" for k, v in sorted(best.params.items())]
        out.append("")
    if best.levels:
        out += ["### Figures per concurrency level", "", *levels_table(best.levels), ""]
    return out


def _headroom_line(free: float | None, bar: float) -> str:
    if free is None:
        return "Free GPU memory after CUDA graph capture: not measured."
    line = f"Free GPU memory after CUDA graph capture: {free:.2f} GiB."
    if free < bar:
        line += (f" **Thin** (below {bar:g} GiB): a prefill burst may run out of memory; "
                 f"consider `servetune export --min-free-gib {bar:g}`.")
    return line


def _boundary_section(recs: Sequence[TrialFacts]) -> list[str]:
    out = ["## OOM boundary", ""]
    measured = [r for r in recs if r.state in (TrialState.COMPLETE, TrialState.PRUNED) and r.measured]
    if not any(r.label == "oom" for r in measured):
        survivors = sum(1 for r in measured if r.label == "ok")
        return [*out, f"No trial ran out of memory ({survivors} survived).", ""]
    fraction_name = graph_name = None
    groups: dict[tuple[Any, Any], list[TrialFacts]] = defaultdict(list)
    for rec in measured:
        if rec.label not in ("ok", "oom"):
            continue
        fraction = rec.knob(FRACTION_KNOBS)
        graph = rec.knob(GRAPH_KNOBS)
        fraction_name = fraction_name or (fraction[0] if fraction else None)
        graph_name = graph_name or (graph[0] if graph else None)
        groups[(fraction[1] if fraction else None, graph[1] if graph else None)].append(rec)
    fname, gname = fraction_name or "mem_fraction_static", graph_name or "cuda_graph_max_bs"
    keys = sorted(groups, key=lambda k: (_sort_key(k[0]), _sort_key(k[1])))
    fractions = sorted({k[0] for k in keys}, key=_sort_key)
    graphs = sorted({k[1] for k in keys}, key=_sort_key)
    if len(fractions) > 1 and len(graphs) > 1 and len(fractions) * len(graphs) <= 400:
        out += [f"`{fname}` down, `{gname}` across: ok = survived the benchmark, OOM = died (phase).", ""]
        out.append(f"| {fname} \\ {gname} | " + " | ".join(_cell(g) for g in graphs) + " |")
        out.append("|---:|" + "---|" * len(graphs))
        for fraction in fractions:
            cells = [_verdict(groups.get((fraction, g), [])) for g in graphs]
            out.append(f"| {_cell(fraction)} | " + " | ".join(cells) + " |")
        out.append("")
    out += [f"| {fname} | {gname} | outcome | phase | free after capture (GiB) | tried to allocate (GiB) "
            "| free at OOM (GiB) | trials |", "|---:|---:|---|---|---:|---:|---:|---|"]
    for key in keys:
        by_outcome: dict[tuple[str, str], list[TrialFacts]] = defaultdict(list)
        for rec in groups[key]:
            by_outcome[(rec.label, rec.phase.value if rec.phase else "")].append(rec)
        for (outcome, phase), group in sorted(by_outcome.items(), key=lambda kv: (kv[0][0] != "oom", kv[0])):
            out.append(
                f"| {_cell(key[0])} | {_cell(key[1])} | {'OOM' if outcome == 'oom' else outcome} | "
                f"{phase or '-'} | {_span(group, 'free_after_capture_gib')} | "
                f"{_span(group, 'tried_to_allocate_gib')} | {_span(group, 'free_at_oom_gib')} | "
                + ", ".join(f"#{r.number}" for r in group) + " |"
            )
    out.append("")
    thin = [r for r in measured if r.label == "ok" and r.free_after_capture_gib is not None
            and r.free_after_capture_gib < THIN_HEADROOM_GIB]
    if thin:
        out += [f"{len(thin)} surviving trial(s) kept less than {THIN_HEADROOM_GIB:g} GiB free after capture "
                f"({', '.join(f'#{r.number}' for r in thin)}): they may still die of a prefill burst.", ""]
    return out


def _verdict(group: Sequence[TrialFacts]) -> str:
    if not group:
        return ""
    labels = Counter("ok" if r.label == "ok" else f"OOM {r.phase.value if r.phase else '?'}" for r in group)
    return ", ".join(label if n == 1 else f"{label} x{n}" for label, n in sorted(labels.items()))


def _span(group: Sequence[TrialFacts], figure: str) -> str:
    values = sorted(float(r.memory[figure]) for r in group if _is_number(r.memory.get(figure)))
    if not values:
        return "-"
    if values[0] == values[-1]:
        return f"{values[0]:.2f}"
    return f"{values[0]:.2f}-{values[-1]:.2f}"


def _failures_section(recs: Sequence[TrialFacts]) -> list[str]:
    out = ["## Failures by cause", ""]
    failed = [r for r in recs if r.state in (TrialState.PRUNED, TrialState.FAIL) and r.measured]
    if not failed:
        return [*out, "None.", ""]
    by_cause: dict[str, list[TrialFacts]] = defaultdict(list)
    for rec in failed:
        by_cause[rec.label].append(rec)
    out += ["| cause | state | count | phases | example reasons |", "|---|---|---:|---|---|"]
    for cause, group in sorted(by_cause.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        states = "/".join(sorted({r.state.name for r in group}))
        phases = Counter(r.phase.value for r in group if r.phase)
        phase_text = ", ".join(f"{p} x{n}" if n > 1 else p for p, n in phases.most_common()) or "-"
        seen: set[str] = set()
        examples: list[str] = []
        for rec in group:
            reason = _short(rec.reason, 120)
            if reason and reason not in seen and len(examples) < 2:
                seen.add(reason)
                examples.append(f"#{rec.number}: {reason}")
        example_text = _escape("; ".join(examples) or "-")
        out.append(f"| {cause} | {states} | {len(group)} | {phase_text} | {example_text} |")
    out.append("")
    infra = sum(1 for r in failed if r.state == TrialState.FAIL)
    if infra:
        out += [f"{infra} FAIL trial(s) were infrastructure trouble: the sampler learns nothing from them.",
                ""]
    return out


def _time_section(recs: Sequence[TrialFacts]) -> list[str]:
    durations = _durations(recs)
    starts = [_seconds(r.datetime_start) for r in recs if r.datetime_start]
    ends = [_seconds(r.datetime_complete) for r in recs if r.datetime_complete]
    out = ["## Time spent", ""]
    if not durations:
        return [*out, "No trial has finished yet.", ""]
    total = sum(durations)
    out.append(f"- trials ran for {format_duration(total)} in all, {format_duration(total / len(durations))} "
               f"per trial on average ({len(durations)} measured)")
    by_outcome: dict[str, float] = defaultdict(float)
    for rec in recs:
        if rec.duration_s is not None and rec.measured:
            by_outcome[rec.label] += rec.duration_s
    out.append("- by outcome: " + ", ".join(
        f"{k} {format_duration(v)}" for k, v in sorted(by_outcome.items(), key=lambda kv: -kv[1])))
    if starts and ends:
        out.append(f"- wall clock: {min(starts).isoformat(sep=' ')} to {max(ends).isoformat(sep=' ')} "
                   f"({format_duration((max(ends) - min(starts)).total_seconds())})")
    out.append("")
    return out


# ---- servetune status ----------------------------------------------------------------------------


class TrialCounts(BaseModel):
    """Trials of a study by state (``done``: COMPLETE+PRUNED+FAIL; ``oom``: trials that ran out of memory)."""

    total: int
    done: int
    complete: int
    pruned: int
    failed: int
    running: int
    waiting: int
    oom: int


class RunningTrial(BaseModel):
    number: int
    host: str | None
    params: dict[str, Any]
    elapsed_s: float | None


class HostActivity(BaseModel):
    """A host as the study's trials show it (``unavailable``: its last trial found it unreachable or busy)."""

    state: Literal["idle", "running", "unavailable"]
    trial: int | None
    elapsed_s: float | None
    trials: int
    complete: int
    pruned: int
    failed: int
    last_outcome: str | None
    last_reason: str | None
    gpu_name: str | None


class BestTrial(BaseModel):
    """The best trial (a ``pareto`` study: the knee of its front, with ``values`` one per metric)."""

    number: int
    value: float | None
    values: list[float] | None = None
    params: dict[str, Any]
    host: str | None
    free_after_capture_gib: float | None
    simulated: bool


class StudyStatus(BaseModel):
    """Where a study stands (``servetune status``; ``model_dump()`` is its JSON)."""

    study: str
    direction: str
    trials: TrialCounts
    running: list[RunningTrial]
    hosts: dict[str, HostActivity]
    best: BestTrial | None
    state: Literal["running", "idle"]
    """``running`` while a trial runs or waits; ``idle`` otherwise (the clock then stops at the last end)."""
    elapsed_s: float | None
    mean_trial_s: float | None
    n_trials: int | None
    remaining_trials: int | None
    workers: int
    eta_s: float | None


def study_status(study: optuna.Study, *, n_trials: int | None = None, workers: int | None = None,
                 now: datetime | None = None) -> StudyStatus:
    """Live figures for ``servetune status``.

    ``n_trials`` is the study's whole budget in COMPLETE+PRUNED trials (as ``servetune run --n-trials``: a
    FAIL trial is infrastructure trouble and is run again). The time left is the mean duration of a finished
    (not reused) trial x the trials left / ``workers`` (default: the trials running now, at least 1).
    ``now`` is for tests; Optuna stores local naive times.
    """
    now = now or datetime.now()
    recs = records(study)
    counts = _counts(recs)
    finished = counts["COMPLETE"] + counts["PRUNED"] + counts["FAIL"]
    running = [r for r in recs if r.state == TrialState.RUNNING]
    durations = _durations(recs)
    mean = sum(durations) / len(durations) if durations else None
    remaining = max(0, n_trials - counts["COMPLETE"] - counts["PRUNED"]) if n_trials is not None else None
    parallel = max(1, workers if workers is not None else len(running))
    eta = mean * remaining / parallel if mean is not None and remaining is not None else None
    best = study_best(study, recs)
    starts = [_seconds(r.datetime_start) for r in recs if r.datetime_start]
    goal = Goal.of(study)
    return StudyStatus.model_validate({
        "study": study.study_name,
        "direction": f"pareto: {goal.describe()}" if goal.pareto else study.direction.name.lower(),
        "trials": {
            "total": len(recs),
            "done": finished,
            "complete": counts["COMPLETE"],
            "pruned": counts["PRUNED"],
            "failed": counts["FAIL"],
            "running": counts["RUNNING"],
            "waiting": counts["WAITING"],
            "oom": sum(1 for r in recs if r.label == "oom"),
        },
        "running": [
            {"number": r.number, "host": r.host, "params": r.params,
             "elapsed_s": _elapsed(r, now)}
            for r in running
        ],
        "hosts": _hosts(recs, now),
        "best": None if best is None else {
            "number": best.number,
            "value": best.value,
            "values": best.values,
            "params": best.params,
            "host": best.host,
            "free_after_capture_gib": best.free_after_capture_gib,
            "simulated": best.simulated,
        },
        # The clock stops when the study does: with nothing running or queued, at the last trial's end.
        "state": "running" if counts["RUNNING"] or counts["WAITING"] else "idle",
        "elapsed_s": round((_clock_end(recs, now) - min(starts)).total_seconds(), 1) if starts else None,
        "mean_trial_s": round(mean, 1) if mean is not None else None,
        "n_trials": n_trials,
        "remaining_trials": remaining,
        "workers": parallel,
        "eta_s": round(eta, 1) if eta is not None else None,
    })


def _clock_end(recs: Sequence[TrialFacts], now: datetime) -> datetime:
    if any(r.state in (TrialState.RUNNING, TrialState.WAITING) for r in recs):
        return now
    ends = [r.datetime_complete for r in recs if r.datetime_complete is not None]
    return max(ends) if ends else now


def _durations(recs: Iterable[TrialFacts]) -> list[float]:
    """Durations of finished trials that ran (a reused duplicate took no time)."""
    return [r.duration_s for r in recs
            if r.duration_s is not None and r.state != TrialState.RUNNING and r.measured]


def _seconds(when: datetime) -> datetime:
    """``when`` to the second, as the report has always printed it."""
    return when.replace(microsecond=0)


def _elapsed(rec: TrialFacts, now: datetime) -> float | None:
    if rec.datetime_start is None:
        return None
    return round((now - _seconds(rec.datetime_start)).total_seconds(), 1)


def _hosts(recs: Sequence[TrialFacts], now: datetime) -> dict[str, dict[str, Any]]:
    hosts: dict[str, dict[str, Any]] = {}
    for rec in sorted(recs, key=lambda r: r.number):
        if not rec.host:
            continue
        entry = hosts.setdefault(rec.host, {
            "state": "idle", "trial": None, "elapsed_s": None, "trials": 0, "complete": 0, "pruned": 0,
            "failed": 0, "last_outcome": None, "last_reason": None, "gpu_name": None,
        })
        entry["trials"] += 1
        entry["gpu_name"] = rec.gpu_name or entry["gpu_name"]
        if rec.state == TrialState.RUNNING:
            entry.update(state="running", trial=rec.number, elapsed_s=_elapsed(rec, now))
            continue
        key = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned", TrialState.FAIL: "failed"}.get(
            rec.state)
        if key is None:
            continue
        entry[key] += 1
        entry["last_outcome"] = rec.label
        entry["last_reason"] = rec.reason or None
    for entry in hosts.values():
        if entry["state"] != "running" and entry["last_outcome"] in _INFRA_TROUBLE:
            entry["state"] = "unavailable"
    return hosts


# ---- Markdown helpers (shared with search.notes) ---------------------------------------------------


def levels_table(levels: Sequence[LevelResult]) -> list[str]:
    """Per-level bench_serving figures as Markdown table lines (columns present in any level)."""
    columns = [(k, label) for k, label in LevelResult.TABLE if any(k in lv.model_fields_set for lv in levels)]
    if not columns:
        return []
    out = ["| " + " | ".join(label for _, label in columns) + " |", "|" + "---:|" * len(columns)]
    for level in sorted(levels, key=lambda lv: _sort_key(lv.max_concurrency)):
        out.append("| " + " | ".join(_cell(level.figure(k)) for k, _ in columns) + " |")
    return out


def memory_table(memory: dict[str, Any]) -> list[str]:
    """The ``mem.*`` figures as Markdown table lines, in the order a server allocates memory."""
    if not memory:
        return []
    order = list(MEMORY_LABELS)
    keys = sorted(memory, key=lambda k: (order.index(k) if k in order else len(order), k))
    out = ["| figure | value |", "|---|---:|"]
    out += [f"| {MEMORY_LABELS.get(k, k)} | {_cell(memory[k])} |" for k in keys]
    return out


def format_duration(seconds: float) -> str:
    """``3725`` -> ``'1h 02m 05s'``; ``42.5`` -> ``'42.5s'``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def _is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return f"{value:.1f}"
        return f"{value:.4g}" if abs(value) < 1 else f"{value:,.2f}".replace(",", "")
    return str(value)


def _cell(value: Any) -> str:
    return _escape(_fmt(value))


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _short(text: str, limit: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _sort_key(value: Any) -> tuple[int, float, str]:
    if value is None:
        return (2, 0.0, "")
    if _is_number(value):
        return (0, float(value), "")
    return (1, 0.0, str(value))
