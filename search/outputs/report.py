"""The morning summary of a study (``servetune report``) as Markdown: :func:`report_markdown`.

It says what was tried and what was learned: the verdict (servetune's choice and how it was made), counts, the
chosen configuration with its figures per concurrency level, the OOM boundary (which ``mem_fraction_static`` x
``cuda_graph_max_bs`` combinations died, where, with how much headroom, and which survived), failures by cause,
and the time spent. It reads one :class:`~search.strategy.view.StudyView`; the HTML page
(:mod:`search.outputs.html`) is the same report with the figures after the verdict.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from optuna.trial import TrialState

from search.outputs.explain import screened_table
from search.outputs.status import durations, seconds
from search.outputs.text import (
    THIN_HEADROOM_GIB,
    cell,
    escape,
    fmt,
    format_duration,
    is_number,
    levels_table,
    short,
    sort_key,
    terminal_safe,
    unit,
)
from search.strategy.confirm import origin
from search.strategy.front import Goal
from search.strategy.view import StudyView
from search.strategy.warm import WARM_USED_ATTR
from search.trial.records import SIM_CALIBRATION_ATTR, TrialFacts, value_text

__all__ = ["LIMIT_WORDS", "report_markdown", "report_parts"]

FRACTION_KNOBS = ("mem_fraction_static", "gpu_memory_utilization")
GRAPH_KNOBS = ("cuda_graph_max_bs", "cuda_graph_sizes", "max_num_seqs")


def report_markdown(view: StudyView) -> str:
    """The study's summary as Markdown (see the module docstring for what it holds)."""
    head, body = report_parts(view)
    return "\n".join([*head, *body]).rstrip() + "\n"


def report_parts(view: StudyView) -> tuple[list[str], list[str]]:
    """(title, objective and verdict; the rest): the HTML report puts the figures between the two."""
    recs = view.records
    head: list[str] = [f"# servetune report: {view.name}", ""]
    target = _objective_text(view)
    if target:
        head += [target, ""]
    if any(r.simulated for r in recs):
        head += ["> Figures marked simulated come from the simulated GPU host, not from real hardware.", ""]
        calibration = view.study.user_attrs.get(SIM_CALIBRATION_ATTR)
        if isinstance(calibration, str) and calibration:
            head += [f"> The simulated host is calibrated to {calibration}.", ""]
    head += _verdict_section(view)
    head += ["## How the winner was chosen", "", *screened_table(view), ""]
    body = _warm_section(view)
    body += _counts_section(recs)
    body += _front_section(view)
    body += _best_section(view)
    body += _correctness_section(view)
    body += _rate_search_section(recs)
    body += _boundary_section(recs)
    body += _failures_section(recs)
    body += _skipped_section(recs)
    body += _trials_section(recs)
    body += _time_section(recs)
    # The output boundary: reasons, GPU names and hosts come from hosts; nothing in them acts on a terminal.
    return [terminal_safe(line) for line in head], [terminal_safe(line) for line in body]


def _warm_section(view: StudyView) -> list[str]:
    """Which earlier studies the run started from (``servetune run --warm-start``), and which it did not use."""
    lines = view.study.user_attrs.get(WARM_USED_ATTR)
    stopped = [r for r in view.records if r.stopped_early]
    out: list[str] = []
    if isinstance(lines, list) and lines:
        out += ["## Warm start", "", *[f"- {line}" for line in lines], ""]
    if stopped:
        out += ["## Stopped early", "",
                f"{len(stopped)} launch(es) stopped their benchmark after the target level's first requests: they "
                "could not beat the best (the bound is the run-to-run noise).",
                *[f"- trial {r.number}: {r.stopped_early}" for r in stopped], ""]
    return out


#: What bound a configuration, by the phase its neighbours died in.
LIMIT_WORDS = {
    "kv_pool": "the KV pool (too little memory left for the KV cache)",
    "cuda_graph": "the CUDA graph pool (graph capture ran out of memory)",
    "prefill": "prefill activations (a prefill batch ran out of memory)",
    "decode": "the eager fallback (a decode batch above the graph batch size ran without graphs and out of "
              "memory)",
}


def _figures_text(rec: TrialFacts, goal: Goal, *, units: bool = True) -> str:
    """```metric` = value unit`` for the study's objective(s)."""
    pairs: list[tuple[str, float | None]]
    if goal.pareto and rec.values:
        pairs = list(zip(goal.metrics, rec.values, strict=False))
    else:
        pairs = [(rec.objective_metric or "objective", rec.value)]
    return ", ".join(f"`{m}` = {fmt(v)}" + (f" {unit(m)}" if units and unit(m) else "") for m, v in pairs)


def _verdict_section(view: StudyView) -> list[str]:
    out = ["## Verdict", ""]
    recs, goal, choice = view.records, view.goal, view.choice
    best = choice.record if choice is not None else None
    if best is None:
        return [*out, "No configuration survived yet: there is no verdict.", ""]
    level = best.objective_level
    knobs = ", ".join(f"`{k}={fmt(v)}`" for k, v in sorted(best.params.items()))
    at = f" at concurrency {level}" if level is not None else ""
    sim = " (simulated)" if best.simulated else ""
    if goal.pareto:
        points = view.front
        out.append(f"- **Front:** {len(points)} configuration(s) that no other beats on every metric "
                   f"({goal.describe()}); see *Pareto front* below, and pick one with `servetune export --pick`.")
        out.append(f"- **Knee of the front: trial {best.number}**, {_figures_text(best, goal)}{at}{sim}: "
                   f"{knobs or 'no searched knob'}.")
    else:
        out.append(f"- **Best: trial {best.number}**, {_figures_text(best, goal)}{at}{sim}: "
                   f"{knobs or 'no searched knob'}.")
    same = [r.number for r in recs if r.duplicate_of == best.number]
    confirmed = f"one benchmark sweep on host `{best.host}`" if best.host else "one benchmark sweep"
    assert choice is not None
    runs = choice.launches
    if goal.pareto and len(runs) > 1:
        confirmed = (f"{len(runs)} launches (trials {', '.join(f'#{r.number}' for r in runs)}); the figures are "
                     "their medians")
    elif len(runs) > 1 and (chosen := choice.confirmed) is not None:
        which = (f"the mean of the {chosen.final} launches made after it was chosen" if chosen.final
                 else "the median of its repeats")
        if chosen.interval is not None:
            which += f" (90% interval: ±{chosen.interval:.1%}, from the run-to-run noise the study measured)"
        confirmed = (f"{len(runs)} launches (trials {', '.join(f'#{r.number}' for r in runs)}), spread "
                     f"{chosen.spread:.1%}; the figure is {which}")
    if best.simulated:
        confirmed += "; every launch ran on the simulated GPU host (not real hardware: confirm on a GPU before serving)"
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
    if best.correctness is not None:
        c = best.correctness
        out.append(f"- **Correctness:** passed the gate: agreement {fmt(c.agreement)} with the reference "
                   f"({c.reference})" + (f", logprob gap {fmt(c.logprob_gap)} nats" if c.logprob_gap is not None
                                          else "") + ".")
    energy = [f"{fmt(best.energy_per_token_j)} J/output token ({fmt(best.power_w)} W{sim})"
              if best.energy_per_token_j is not None else "",
              f"{fmt(best.cost_per_mtok)} per 1M output tokens at {fmt(best.price_per_gpu_hour)} per GPU-hour"
              if best.cost_per_mtok is not None else ""]
    if any(energy):
        out.append(f"- **Cost and energy{at}:** {'; '.join(e for e in energy if e)}.")
    return [*out, ""]


def _correctness_section(view: StudyView) -> list[str]:
    """What the correctness gate found: each configuration it rejected, with the prompts it got wrong, and what
    the gate cost."""
    checked = [r for r in view.records if r.correctness is not None and r.correctness.from_trial is None
               and r.duplicate_of is None]
    if not checked:
        return []
    verdicts = [(r, r.correctness) for r in checked if r.correctness is not None]
    rejected = [r for r, c in verdicts if not c.passed]
    seconds = sum(c.seconds or 0.0 for _, c in verdicts)
    reference = view.reference_seconds
    out = ["## Correctness gate", "",
           f"{len(checked)} configuration(s) asked the gate's prompts greedily and compared with the reference "
           f"({verdicts[0][1].reference}); {len(rejected)} rejected: infeasible, never "
           f"recommended. Cost: {seconds:.1f} s of asking" + (f", plus {reference:.1f} s for the reference "
                                                             "configuration" if reference else "") + ".", ""]
    if rejected:
        out += ["| trial | agreement | logprob gap (nats) | accuracy | why | prompts it got wrong |",
                "|---:|---:|---:|---:|---|---|"]
        for r in rejected:
            c = r.correctness
            assert c is not None
            wrong = "; ".join(f"#{w.index} {w.prompt[:40]!r} diverged at token {w.diverged_at}"
                              if w.diverged_at is not None else f"#{w.index} {w.prompt[:40]!r} missed "
                              f"{w.expected!r}" for w in c.wrong[:4])
            more = f" (+{len(c.wrong) - 4} more)" if len(c.wrong) > 4 else ""
            cells = [f"#{r.number}", fmt(c.agreement), fmt(c.logprob_gap), fmt(c.accuracy), c.reason,
                     wrong + more]
            out.append("| " + " | ".join(escape(str(x)) for x in cells) + " |")
        out.append("")
    return out


def _bound_text(best: TrialFacts, recs: Sequence[TrialFacts]) -> str:
    """What limits the chosen configuration itself: the nearest configuration that pressed harder on memory
    (at least its ``mem_fraction_static`` and graph batch size, more of one) and died or was skipped as a
    predicted OOM; else that its limit was not reached, naming where the study's deaths were."""
    mine_f, mine_g = best.knob(FRACTION_KNOBS), best.knob(GRAPH_KNOBS)
    knobs = ", ".join(f"`{name}={fmt(value)}`" for name, value in (k for k in (mine_f, mine_g) if k))
    dead = [r for r in recs if r.oom or r.predicted_oom]
    harder = [r for r in dead if _presses_harder(r, mine_f, mine_g)]
    free = best.free_after_capture_gib
    room = f" with {free:.2f} GiB free after CUDA graph capture" if free is not None else ""
    if harder:
        nearest = min(harder, key=lambda r: _distance(best, r, recs))
        phase = nearest.oom_phase or nearest.predicted_phase or (nearest.phase.value if nearest.phase else "")
        limit = LIMIT_WORDS.get(phase, f"an OOM in {phase or 'an unknown phase'}")
        how = "was predicted to die" if nearest.predicted_oom else "died"
        theirs = ", ".join(f"`{m[0]}={fmt(nearest.knob_value(m[0]))}`" for m in (mine_f, mine_g) if m is not None)
        return (f"{limit}: at {knobs or 'its settings'} it survived{room}; pressing harder on memory, trial "
                f"{nearest.number} ({theirs}) {how} there.")
    parts = []
    for what, group in (("died of OOM", [r for r in dead if r.oom]),
                        ("skipped as a predicted OOM", [r for r in dead if r.predicted_oom])):
        if group:
            phases = Counter((r.oom_phase or r.predicted_phase or "unknown") for r in group)
            parts.append(f"{len(group)} configuration(s) {what} "
                         f"({', '.join(f'{p} x{n}' for p, n in phases.most_common())})")
    tail = (f" Elsewhere {' and '.join(parts)}, at settings it does not share (a lower graph batch size or a "
            f"different memory fraction), so they do not bound it." if dead else
            " No trial ran out of memory.")
    return (f"no memory limit was reached: at {knobs or 'its settings'} it survived{room}, and no configuration "
            f"pressing harder on memory than it (as much of each memory knob, more of one) died.{tail}")


def _presses_harder(rec: TrialFacts, fraction: tuple[str, Any] | None, graph: tuple[str, Any] | None) -> bool:
    """``rec`` holds at least the chosen ``fraction`` and ``graph`` values, and more of one of them."""
    more = False
    for mine in (fraction, graph):
        if mine is None:
            continue
        theirs = rec.knob_value(mine[0])
        if not (is_number(theirs) and is_number(mine[1])):
            return False
        if float(theirs) < float(mine[1]):
            return False
        more = more or float(theirs) > float(mine[1])
    return more


def _distance(a: TrialFacts, b: TrialFacts, recs: Sequence[TrialFacts]) -> float:
    """Distance of two trials over their numeric knobs, each scaled to the range the study tried."""
    total = 0.0
    for name in sorted(set(a.params) | set(b.params)):
        va, vb = a.params.get(name), b.params.get(name)
        if is_number(va) and is_number(vb):
            seen = [float(r.params[name]) for r in recs if is_number(r.params.get(name))]
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
        out.append(f"| #{rec.number} | {found} | {escape(steps)} |")
    return [*out, ""]


def _skipped_section(recs: Sequence[TrialFacts]) -> list[str]:
    out = ["## Skipped and why", ""]
    rows: list[str] = []
    for rec in sorted(recs, key=lambda r: r.number):
        why = ""
        if rec.duplicate_of is not None:
            why = f"same configuration as trial {rec.duplicate_of}: its result was reused, nothing ran"
        elif rec.label == "predicted_oom":
            why = "the memory model predicted an OOM: not launched" + (f" ({short(rec.reason, 100)})"
                                                                       if rec.reason else "")
        elif rec.state == TrialState.FAIL:
            why = (f"infrastructure trouble ({rec.label}): not counted, the sampler learns nothing from it"
                   + (f"; {short(rec.reason, 100)}" if rec.reason else ""))
        elif rec.state == TrialState.WAITING:
            why = "queued, not run yet"
        elif rec.state == TrialState.RUNNING:
            why = "still running when the report was made"
        if why:
            rows.append(f"| #{rec.number} | {rec.state.name} | {escape(why)} |")
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
                 *(fmt(rec.params.get(k)) for k in knobs), fmt(rec.free_after_capture_gib),
                 short(rec.reason, 100) or "-"]
        out.append("| " + " | ".join(escape(c) for c in cells) + " |")
    return [*out, ""]


def _value_cell(rec: TrialFacts) -> str:
    """A trial's value, or a pareto trial's values (`` / ``-joined)."""
    return value_text(rec, "{:.2f}") if rec.values is not None else fmt(rec.value)


def _objective_text(view: StudyView) -> str:
    recs = view.records
    metric = next((r.objective_metric for r in recs if r.objective_metric), None)
    level = next((r.objective_level for r in recs if r.objective_level), None)
    if metric is None:
        return ""
    at = f" at concurrency {level}" if level is not None else ""
    goal = view.goal
    if goal.pareto:
        return f"Objective: the pareto front of {goal.describe()}{at}."
    return f"Objective: {view.direction.name.lower()} `{metric}`{at}."


def _counts_section(recs: Sequence[TrialFacts]) -> list[str]:
    counts = Counter(r.state.name for r in recs)
    out = ["## Trials", "", "| complete | pruned | failed | running | waiting | total |",
           "|---:|---:|---:|---:|---:|---:|",
           f"| {counts['COMPLETE']} | {counts['PRUNED']} | {counts['FAIL']} | {counts['RUNNING']} | "
           f"{counts['WAITING']} | {len(recs)} |", ""]
    duplicates = sum(1 for r in recs if not r.launched)
    if duplicates:
        out += [f"{duplicates} trial(s) repeated a measured configuration and reused its result.", ""]
    return out


def _front_section(view: StudyView) -> list[str]:
    """A ``pareto`` study's front as a table (nothing for one objective)."""
    recs, goal = view.records, view.goal
    if not goal.pareto:
        return []
    out = ["## Pareto front", ""]
    points = view.front
    if not points:
        return [*out, "No COMPLETE feasible configuration yet: no front.", ""]
    knee = view.choice.record if view.choice is not None else None
    by_number = {r.number: r for r in recs}
    knobs = sorted({k for p in points for k in by_number[p.number].params})
    out += [f"{goal.describe()}; each configuration's figures are the medians over its launches (its repeats "
            "included). Pick one with `servetune export --pick knee` (the default) or conditions such as "
            f"`--pick \"{goal.metrics[-1]}<=X\"` (then the best `{goal.metrics[0]}`).", "",
            "| trial | " + " | ".join(f"`{m}`" for m in goal.metrics) + " | launches | "
            + " | ".join(f"`{k}`" for k in knobs) + " |",
            "|---:|" + "---:|" * (len(goal.metrics) + 1) + "---:|" * len(knobs)]
    launches = Counter(origin(r) for r in recs if r.state == TrialState.COMPLETE and r.launched)
    for p in sorted(points, key=lambda p: p.values[0]):
        rec = by_number[p.number]
        tag = " (knee)" if knee is not None and knee.number == p.number else ""
        cells = [f"#{p.number}{tag}", *(fmt(v) for v in p.values), str(launches.get(p.number, 1)),
                 *(fmt(rec.params.get(k)) for k in knobs)]
        out.append("| " + " | ".join(escape(c) for c in cells) + " |")
    return [*out, ""]


def _best_section(view: StudyView) -> list[str]:
    goal = view.goal
    best = view.choice.record if view.choice is not None else None
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
        out += [f"| `{k}` | {cell(v)} |" for k, v in sorted(best.params.items())]
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
    measured = [r for r in recs if r.state in (TrialState.COMPLETE, TrialState.PRUNED) and r.launched]
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
    keys = sorted(groups, key=lambda k: (sort_key(k[0]), sort_key(k[1])))
    fractions = sorted({k[0] for k in keys}, key=sort_key)
    graphs = sorted({k[1] for k in keys}, key=sort_key)
    if len(fractions) > 1 and len(graphs) > 1 and len(fractions) * len(graphs) <= 400:
        out += [f"`{fname}` down, `{gname}` across: ok = survived the benchmark, OOM = died (phase).", ""]
        out.append(f"| {fname} \\ {gname} | " + " | ".join(cell(g) for g in graphs) + " |")
        out.append("|---:|" + "---|" * len(graphs))
        for fraction in fractions:
            cells = [_verdict(groups.get((fraction, g), [])) for g in graphs]
            out.append(f"| {cell(fraction)} | " + " | ".join(cells) + " |")
        out.append("")
    out += [f"| {fname} | {gname} | outcome | phase | free after capture (GiB) | tried to allocate (GiB) "
            "| free at OOM (GiB) | trials |", "|---:|---:|---|---|---:|---:|---:|---|"]
    for key in keys:
        by_outcome: dict[tuple[str, str], list[TrialFacts]] = defaultdict(list)
        for rec in groups[key]:
            by_outcome[(rec.label, rec.phase.value if rec.phase else "")].append(rec)
        for (outcome, phase), group in sorted(by_outcome.items(), key=lambda kv: (kv[0][0] != "oom", kv[0])):
            out.append(
                f"| {cell(key[0])} | {cell(key[1])} | {'OOM' if outcome == 'oom' else outcome} | "
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
    values = sorted(value for r in group if (value := r.memory.number(figure)) is not None)
    if not values:
        return "-"
    if values[0] == values[-1]:
        return f"{values[0]:.2f}"
    return f"{values[0]:.2f}-{values[-1]:.2f}"


def _failures_section(recs: Sequence[TrialFacts]) -> list[str]:
    out = ["## Failures by cause", ""]
    failed = [r for r in recs if r.state in (TrialState.PRUNED, TrialState.FAIL) and r.launched]
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
            reason = short(rec.reason, 120)
            if reason and reason not in seen and len(examples) < 2:
                seen.add(reason)
                examples.append(f"#{rec.number}: {reason}")
        example_text = escape("; ".join(examples) or "-")
        out.append(f"| {cause} | {states} | {len(group)} | {phase_text} | {example_text} |")
    out.append("")
    infra = sum(1 for r in failed if r.state == TrialState.FAIL)
    if infra:
        out += [f"{infra} FAIL trial(s) were infrastructure trouble: the sampler learns nothing from them.",
                ""]
    return out


def _time_section(recs: Sequence[TrialFacts]) -> list[str]:
    spent = durations(recs)
    starts = [seconds(r.datetime_start) for r in recs if r.datetime_start]
    ends = [seconds(r.datetime_complete) for r in recs if r.datetime_complete]
    out = ["## Time spent", ""]
    if not spent:
        return [*out, "No trial has finished yet.", ""]
    total = sum(spent)
    out.append(f"- trials ran for {format_duration(total)} in all, {format_duration(total / len(spent))} "
               f"per trial on average ({len(spent)} measured)")
    by_outcome: dict[str, float] = defaultdict(float)
    for rec in recs:
        if rec.duration_s is not None and rec.launched:
            by_outcome[rec.label] += rec.duration_s
    out.append("- by outcome: " + ", ".join(
        f"{k} {format_duration(v)}" for k, v in sorted(by_outcome.items(), key=lambda kv: -kv[1])))
    if starts and ends:
        out.append(f"- wall clock: {min(starts).isoformat(sep=' ')} to {max(ends).isoformat(sep=' ')} "
                   f"({format_duration((max(ends) - min(starts)).total_seconds())})")
    out.append("")
    return out
