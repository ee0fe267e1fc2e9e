"""How servetune's choice is shown and explained: the configurations it screened, each trial's role, why the
trial Optuna calls best is not the choice, the figure of the screened launches and the dashboard's study note.

It explains :attr:`search.strategy.view.StudyView.choice` (computed once by
:func:`search.strategy.choice.choose`); nothing here picks a configuration. What it builds:

* :func:`screened`: the configurations the choice was made among (each repeated by the screening, the chosen
  one, and the one Optuna calls best), each with its launches, median and spread;
* :func:`optuna_best` and :func:`why_not`: the trial optuna-dashboard's *Best Trial* card names (the highest
  single value) and, when it is not the choice, why not (one launch, repeated lower, within noise...);
* :func:`trial_rows`: ``servetune trials --json``'s rows, with each trial's role and which one is chosen;
* :func:`screened_table` (Markdown: the report's "How the winner was chosen" and the study note),
  :func:`choice_figure` (plotly: each launch a point, the median, the spread, the chosen one marked) and
  :func:`study_note_markdown` (optuna-dashboard's study note: the choice and why, first).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from optuna.trial import TrialState

from search.outputs.text import escape, fmt, unit
from search.strategy.choice import SCREENING_RULE, Candidate, Choice, TieBreak, Verdict
from search.strategy.confirm import origin
from search.strategy.view import StudyView
from search.trial.records import ROLES, TrialFacts

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["CHOICE_FIGURE_ID", "Screened", "choice_figure", "optuna_best", "screened", "screened_table",
           "study_note_markdown", "trial_rows", "verdict_text", "why_not"]

#: The dashboard graph object's id (also the MLflow figure's and the report's).
CHOICE_FIGURE_ID = "servetune-choice"

#: Launch marks of :func:`choice_figure` by role: (legend label, colour, symbol).
_LAUNCH_MARKS: dict[str, tuple[str, str, str]] = {
    "search": ("search launch", "#7f7f7f", "circle"),
    "screening": ("screening repeat", "#1f77b4", "diamond"),
    "final": ("launched after the choice (reported)", "#2ca02c", "square"),
}


Screened = Candidate
"""One configuration the choice was made among (:class:`search.strategy.choice.Candidate`)."""


def _launch_role(t: TrialFacts) -> str:
    return t.role if t.role in ("screening", "final") else "search"


def optuna_best(view: StudyView) -> TrialFacts | None:
    """The trial optuna-dashboard calls best (``study.best_trial``: the best single value); None for a
    ``pareto`` study (Optuna names a front there) or when none finished."""
    if view.goal.pareto:
        return None
    try:
        number = view.study.best_trial.number
    except ValueError:
        return None
    return view.record(number)


def screened(view: StudyView) -> list[Candidate]:
    """The configurations the choice was made among, best median first: every configuration the screening
    repeated, the chosen one and the one Optuna calls best (with no screening, just those two); each the
    choice's own :class:`~search.strategy.choice.Candidate`, with its verdict."""
    choice = view.choice
    if choice is None:
        return []
    best = optuna_best(view)
    extra = origin(best) if best is not None else None
    out = [c for c in choice.candidates if c.chosen or c.screened or c.number == extra]
    sign = -1.0 if view.goal.senses[0] == "maximize" else 1.0
    return sorted(out, key=lambda s: (not s.chosen, sign * (s.median if s.median is not None else -sign * 1e300)))


def why_not(view: StudyView, rec: TrialFacts) -> str | None:
    """Why trial ``rec`` (in practice :func:`optuna_best`) is not servetune's choice, in a sentence; None when
    it is the choice (or there is none). It renders the verdict :func:`~search.strategy.choice.choose` gave."""
    choice = view.choice
    if choice is None or rec.number == choice.number:
        return None
    cand = choice.candidate(rec)
    return None if cand is None else verdict_text(view, choice, cand, rec)


def verdict_text(view: StudyView, choice: Choice, cand: Candidate, rec: TrialFacts | None = None) -> str | None:
    """The sentence for ``cand``'s verdict (None for the chosen one), ``rec`` the launch asked about."""
    rec = rec or cand.first
    metric = rec.objective_metric or "objective"
    u = f" {unit(metric)}" if unit(metric) else ""
    figure = f"{fmt(rec.value)}{u}" if rec.value is not None else "no figure"
    chosen_on = f"the choice's median over the launches it was chosen on is {fmt(choice.chosen_on)}{u}"
    match cand.verdict:
        case Verdict.CHOSEN:
            return None
        case Verdict.LAUNCH_OF_CHOICE:
            return (f"it is one launch ({figure}) of the chosen configuration (trial {choice.number}); the "
                    f"choice's figure, {fmt(choice.value)}{u}, is {choice.why()}, not its best single launch.")
        case Verdict.INFEASIBLE:
            broke = "; ".join(f"trial {t.number}: {t.reason or 'infeasible (no reason recorded)'}"
                              for t in cand.infeasible)
            return f"infeasible: it broke a limit ({broke}); an infeasible configuration is never recommended."
        case Verdict.DIED:
            dead = ", ".join(f"trial {t.number} ({t.label})" for t in cand.died)
            return f"died on a launch: {dead}; a configuration that died on any launch is out."
        case Verdict.BELOW_HEADROOM:
            free = cand.first.free_after_capture_gib
            return (f"below the headroom bar: {fmt(free) if free is not None else 'no'} GiB free after CUDA graph "
                    f"capture, under --min-free-gib {fmt(choice.min_free_gib)}.")
        case Verdict.ON_FRONT:
            return (f"on the front, not picked: the rule ({choice.rule.describe() if choice.rule else 'knee'}) "
                    f"picked trial {choice.number}.")
        case Verdict.OFF_FRONT:
            return "off the front: another configuration is at least as good on every metric."
        case Verdict.ONE_LAUNCH:
            noise = choice.spread
            noise_text = f" (the chosen configuration's own launches spread over {noise:.0%})" if noise else ""
            ranked = (" The screening repeated the configurations ranked best once what the other launches say "
                      "about their knobs was counted (the pooled estimate); this one ranked below them."
                      if any(t.role == "screening" for t in view.records) else "")
            return (f"one launch, never repeated: {figure} is a single draw of a noisy measurement{noise_text}, "
                    f"and servetune chooses on repeated launches.{ranked}")
    values = cand.values
    own = f"its {len(values)} launches gave {', '.join(fmt(v) for v in values)} (median {fmt(cand.median)}{u})"
    if cand.verdict == Verdict.REPEATED_LOWER:
        return f"repeated lower: {own}; {chosen_on}."
    if cand.tie_break == TieBreak.PLAINER and cand.forced is not None:
        mine, theirs = cand.forced
        return (f"within noise: {own}, {chosen_on}; the measurements cannot tell them apart, and the choice forces "
                f"fewer settings ({theirs} environment override(s) against {mine}).")
    return (f"within noise: {own}, {chosen_on}; ranked with what the other launches say about its knobs (the "
            f"pooled estimate), the choice comes out ahead.")


def trial_rows(view: StudyView) -> list[dict[str, Any]]:
    """``servetune trials --json``: each trial's row (:meth:`TrialFacts.summary`) with its ``role`` after its
    outcome and ``chosen`` (True for the choice's first launch) after that."""
    chosen = view.choice.number if view.choice is not None else None
    rows = []
    for rec in view.records:
        row: dict[str, Any] = {}
        for key, value in rec.summary().items():
            row[key] = value
            if key == "outcome":
                row["role"] = rec.role
                row["chosen"] = rec.number == chosen
        rows.append(row)
    return rows


def _knobs_text(params: dict[str, Any]) -> str:
    return ", ".join(f"`{k}={fmt(v)}`" for k, v in sorted(params.items())) or "no searched knob"


def screened_table(view: StudyView) -> list[str]:
    """Markdown: how the winner was chosen, a table of :func:`screened` (each configuration's launches with
    their roles, median, spread, verdict) and the roles' legend; a line when nothing was screened."""
    choice = view.choice
    if choice is None:
        return ["No configuration finished its benchmark yet: nothing was chosen."]
    rows = screened(view)
    metric = choice.record.objective_metric or "objective"
    u = unit(metric)
    head = f"median ({u})" if u else "median"
    out = [f"servetune chose **trial {choice.number}**: {choice.why()}.", "",
           f"| configuration | launches: trial `{metric}` (role) | {head} | spread | knobs | verdict |",
           "|---|---|---:|---:|---|---|"]
    best = optuna_best(view)
    for s in rows:
        launches = "; ".join(
            f"#{t.number} {fmt(t.value) if t.state == TrialState.COMPLETE else t.label} ({t.role})"
            for t in s.launches)
        if s.chosen:
            verdict = f"**chosen**: {fmt(choice.value)}" + (f" {u}" if u else "") + " reported"
        else:
            reason = verdict_text(view, choice, s)
            verdict = "not chosen" + (f": {reason.split(':', 1)[0]}" if reason else "")
        spread = f"{s.spread:.1%}" if s.spread is not None else "-"
        cells = [f"#{s.number}" + (" (chosen)" if s.chosen else ""), launches, fmt(s.median), spread,
                 _knobs_text(s.first.params), verdict]
        out.append("| " + " | ".join(escape(c) for c in cells) + " |")
    out.append("")
    if best is not None and best.number != choice.number:
        reason = why_not(view, best)
        out += [f"Optuna's best trial (optuna-dashboard's *Best Trial* card) is **trial {best.number}** "
                f"({fmt(best.value)}{' ' + u if u else ''}), not the choice: {reason}", ""]
    if any(s.screened for s in rows):
        out += [f"Why these were screened: {SCREENING_RULE}", ""]
    roles = sorted({t.role for s in rows for t in s.launches})
    out.append("Roles: " + "; ".join(f"*{r}*: {ROLES[r]}" for r in roles) + ".")
    return out


def study_note_markdown(view: StudyView) -> str:
    """optuna-dashboard's study note: servetune's choice and why first, then how it was chosen."""
    choice = view.choice
    sim = any(r.simulated for r in view.records)
    out = [f"# servetune's choice for {view.name}", ""]
    if sim:
        out += ["> Simulated GPU host: every figure here is simulated, not measured on real hardware.", ""]
    if choice is None:
        return "\n".join([*out, "No configuration finished its benchmark yet: nothing was chosen.", ""])
    rec = choice.record
    metric = rec.objective_metric or "objective"
    u = f" {unit(metric)}" if unit(metric) else ""
    at = f" at concurrency {rec.objective_level}" if rec.objective_level is not None else ""
    if view.goal.pareto and rec.values:
        figures = ", ".join(f"`{m}` {fmt(v)}" for m, v in zip(view.goal.metrics, rec.values, strict=False))
    else:
        figures = f"`{metric}` **{fmt(choice.value)}{u}**"
    out += [f"## Trial {choice.number}: {figures}{at}", "", f"Why: {choice.why()}.", "",
            "| knob | value |", "|---|---|", *(f"| `{k}` | {escape(fmt(v))} |" for k, v in sorted(rec.params.items())),
            ""]
    free = rec.free_after_capture_gib
    if free is not None:
        out += [f"Free GPU memory after CUDA graph capture: {free:.2f} GiB per GPU.", ""]
    out += [f"Serve it: `servetune export --study {view.name}` writes its launch script.", "",
            "## How the winner was chosen", "", *screened_table(view), "",
            "The figure *servetune's choice* on this study's page shows each launch of these configurations.", ""]
    return "\n".join(out).rstrip() + "\n"


def choice_figure(view: StudyView) -> go.Figure:
    """The screened configurations (:func:`screened`), one row each: every launch a point (by role), the
    median a bar, the spread a line from the lowest launch to the highest; the chosen row marked with a star at
    its reported figure. The title names the choice."""
    import plotly.graph_objects as go

    fig = go.Figure()
    choice = view.choice
    rows = list(reversed(screened(view)))  # plotly draws the first category at the bottom
    sim = " (simulated)" if any(r.simulated for r in view.records) else ""
    metric = choice.record.objective_metric if choice is not None else None
    metric = metric or "objective"
    u = unit(metric)
    if choice is None or not rows:
        fig.update_layout(title={"text": f"servetune's choice: none yet{sim}"})
        return _style(fig)
    labels = {s.number: _row_label(s) for s in rows}
    seen_roles: set[str] = set()
    for role, (name, colour, symbol) in _LAUNCH_MARKS.items():
        xs, ys, text = [], [], []
        for s in rows:
            for t in s.launches:
                if _launch_role(t) == role and t.state == TrialState.COMPLETE and t.value is not None:
                    xs.append(float(t.value))
                    ys.append(labels[s.number])
                    text.append(f"trial {t.number} ({t.role}): {fmt(t.value)} {u}")
        if xs:
            seen_roles.add(role)
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name=name, text=text, hoverinfo="text",
                                     marker={"color": colour, "symbol": symbol, "size": 10, "opacity": 0.85,
                                             "line": {"width": 1, "color": "white"}}))
    for s in rows:
        values = s.values
        if len(values) > 1:
            fig.add_trace(go.Scatter(x=[min(values), max(values)], y=[labels[s.number]] * 2, mode="lines",
                                     line={"color": "#9aa5b1", "width": 2}, hoverinfo="skip", showlegend=False))
    medians = [s for s in rows if len(s.values) > 1]
    fig.add_trace(go.Scatter(
        x=[s.median for s in medians], y=[labels[s.number] for s in medians], mode="markers", name="median",
        marker={"symbol": "line-ns", "size": 22, "line": {"width": 3, "color": "#2a3f5f"}},
        text=[f"trial {s.number}: median {fmt(s.median)} {u} over {len(s.values)} launch(es)" for s in medians],
        hoverinfo="text"))
    chosen = next(s for s in rows if s.chosen)
    fig.add_trace(go.Scatter(
        x=[choice.value], y=[labels[chosen.number]], mode="markers", name="servetune's choice (reported)",
        marker={"symbol": "star", "size": 18, "color": "#d62728", "line": {"width": 1, "color": "#7f0000"}},
        text=[f"chosen: trial {choice.number}, {fmt(choice.value)} {u}: {choice.why()}"], hoverinfo="text"))
    sub = _wrap(choice.why(), 70) + f"<br>each launch's {metric}" + (f" ({u})" if u else "") \
        + " in the configurations screened"
    title = f"servetune's choice: trial {choice.number}, {fmt(choice.value)} {u}{sim}<br><sup>{sub}</sup>"
    top = 64 + 17 * (sub.count("<br>") + 1)
    fig.update_layout(
        title={"text": title, "x": 0.01, "xanchor": "left"},
        yaxis={"type": "category", "categoryorder": "array", "categoryarray": [labels[s.number] for s in rows]},
        legend={"orientation": "h", "yanchor": "top", "y": -0.12, "x": 0},
        margin={"t": top, "l": 10, "r": 20, "b": 10}, height=max(360, top + 150 + 56 * len(rows)),
    )
    return _style(fig)


def _row_label(s: Screened) -> str:
    knobs = [f"{_short(k)}={fmt(v)}" for k, v in sorted(s.first.params.items(), key=lambda kv: _order(kv[0]))
             if v not in (None, "unset")]
    lines = [" ".join(knobs[i:i + 2]) for i in range(0, len(knobs), 2)] or [""]
    lines[0] = f"{'★ ' if s.chosen else ''}#{s.number} {lines[0]}".strip()
    return "<br>".join(lines)


def _order(name: str) -> tuple[int, str]:
    return (0 if name == "mem_fraction_static" else 1 if name == "cuda_graph_max_bs" else 2, name)


def _short(name: str) -> str:
    return {"mem_fraction_static": "mem", "cuda_graph_max_bs": "bs"}.get(name, name.removeprefix("nccl.NCCL_")
                                                                      .removeprefix("nccl."))


def _wrap(text: str, width: int) -> str:
    words, lines, line = text.split(), [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return "<br>".join([*lines, line])


def _style(fig: go.Figure) -> go.Figure:
    grid = {"gridcolor": "#ebf0f8", "zerolinecolor": "#ebf0f8", "linecolor": "#ebf0f8", "showgrid": True,
            "automargin": True}
    fig.update_layout(template="none", plot_bgcolor="white", paper_bgcolor="white", font={"color": "#2a3f5f"},
                      hoverlabel={"align": "left"})
    fig.update_xaxes(**grid)
    fig.update_yaxes(**grid)
    return fig
