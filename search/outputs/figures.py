"""Figures that show where configurations die and why (plotly), for optuna-dashboard, MLflow and the report.

Every figure is built from the trial records of :mod:`search.trial.records` only:

* :func:`oom_map`: two knobs (``mem_fraction_static`` x ``cuda_graph_max_bs`` by default, any pair a user
  picks), one mark per trial coloured by outcome and phase (ok, OOM in graph capture, KV pool, prefill,
  decode, predicted OOM, other failures); the objective sets the size of the live trials' marks; the memory
  model's predicted boundary is drawn when a :class:`Boundary` is given;
* :func:`memory_ladder`: a trial's memory, GiB per GPU, in the order a server allocates it (weights, KV pool,
  graph pool, other, free after capture) against the GPU's total, with the peak under load;
* :func:`concurrency_curves`: output throughput and p99 TPOT against concurrency for the top configurations;
* :func:`progress_figure`: best-so-far against server launches and against GPU-minutes, deaths marked;
* :func:`pareto_front` (``pareto`` studies only): every configuration on the study's first two metrics, the
  front highlighted and its knee marked.

:func:`study_figures` makes them all (keyed by a stable id); :func:`save_to_dashboard` stores them in the
study for optuna-dashboard, and :class:`FiguresCallback` refreshes them as trials finish. Figures of a study
run on the simulated host say "simulated" in their titles.
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from runners.engines import engine_for
from runners.telemetry import allocation_text
from search.outputs.dashboard import save_plotly_graph_object
from search.outputs.sink import Publication, SinkContext
from search.strategy.confirm import is_launch, origin
from search.strategy.front import Goal, configurations, non_dominated
from search.strategy.memory import SKIP_Z
from search.strategy.view import StudyView
from search.trial.records import LevelResult, TrialFacts

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = [
    "FIGURE_IDS",
    "OUTCOME_CLASSES",
    "PARETO_FIGURE_ID",
    "SLO_RATE_FIGURE_ID",
    "Boundary",
    "FiguresCallback",
    "FiguresSink",
    "concurrency_curves",
    "memory_ladder",
    "oom_map",
    "outcome_class",
    "pareto_front",
    "progress_figure",
    "save_to_dashboard",
    "slo_rate_search",
    "slo_ratio",
    "study_figures",
]

logger = logging.getLogger(__name__)

#: The outcome classes of the OOM map, in legend order: (label, colour, marker symbol).
OUTCOME_CLASSES: dict[str, tuple[str, str, str]] = {
    "ok": ("ok (survived the benchmark)", "#2ca02c", "circle"),
    "oom:kv_pool": ("OOM: KV pool", "#9467bd", "x"),
    "oom:cuda_graph": ("OOM: graph capture", "#d62728", "x"),
    "oom:prefill": ("OOM: prefill", "#ff7f0e", "x"),
    "oom:decode": ("OOM: decode (eager fallback)", "#8c564b", "x"),
    "oom:other": ("OOM: other phase", "#e377c2", "x"),
    "predicted_oom": ("predicted OOM (not launched)", "#7f7f7f", "x-open"),
    "failed": ("other failure (NCCL, flag, crash)", "#bcbd22", "diamond"),
    "infra": ("infrastructure trouble (FAIL)", "#17becf", "square-open"),
    "running": ("running / waiting", "#c7c7c7", "circle-open"),
}

#: Stable ids of :func:`study_figures` (also the dashboard's graph-object ids and MLflow's file names).
FIGURE_IDS = ("servetune-oom-map", "servetune-memory-ladder", "servetune-concurrency", "servetune-progress")
#: The figure a ``pareto`` study has besides :data:`FIGURE_IDS`.
PARETO_FIGURE_ID = "servetune-pareto-front"
#: The figure a ``max_rate_under_slo`` study has besides :data:`FIGURE_IDS`.
SLO_RATE_FIGURE_ID = "servetune-slo-rate-search"
#: The rate searches the figure draws at most (the highest rates found first).
_SLO_TRIALS_SHOWN = 8
#: Where the figure clips a step's worst limit ratio (a step where nothing completed is infinitely over).
_SLO_RATIO_CLIP = 3.0

FRACTION_KNOBS = ("mem_fraction_static", "gpu_memory_utilization")
GRAPH_KNOBS = ("cuda_graph_max_bs", "cuda_graph_sizes", "max_num_seqs")

_OOM_PHASES = {"kv_pool", "cuda_graph", "prefill", "decode"}

#: Every figure's legend: below everything, anchored to the figure's own bottom edge (``yref="container"``),
#: so the plot area and its axis titles make room for it at any width instead of a fixed offset under the
#: plot that a wrapped legend or a two-line tick label runs into.
BELOW: dict[str, Any] = {"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom",
                         "xref": "container", "x": 0, "xanchor": "left"}


@dataclass(frozen=True)
class Boundary:
    """A memory model's prediction over the OOM map's two knobs, drawn as the line where it changes sign.

    ``margin(x, y)`` is the headroom (GiB) the model predicts for a configuration with those two knob
    values: negative means predicted to run out of memory. Build one from a callable or, with
    :meth:`from_grid`, from values the model computed already.
    """

    margin: Callable[[float, float], float]
    label: str = "memory model: predicted OOM boundary"

    @classmethod
    def from_grid(cls, xs: Sequence[float], ys: Sequence[float], margins: Sequence[Sequence[float]],
                  label: str = "memory model: predicted OOM boundary") -> Boundary:
        """``margins[j][i]`` is the margin at ``(xs[i], ys[j])``; other points take the nearest one."""
        grid = {(float(x), float(y)): float(margins[j][i]) for j, y in enumerate(ys) for i, x in enumerate(xs)}

        def nearest(x: float, y: float) -> float:
            key = min(grid, key=lambda k: (abs(k[1] - y), abs(k[0] - x)))
            return grid[key]

        return cls(margin=nearest, label=label)


def outcome_class(rec: TrialFacts) -> str:
    """The OOM map's class of a trial (a key of :data:`OUTCOME_CLASSES`)."""
    if rec.state in (TrialState.RUNNING, TrialState.WAITING):
        return "running"
    if rec.label == "ok" and rec.state == TrialState.COMPLETE:
        return "ok"
    if rec.label == "predicted_oom":  # compared by label: a FailureKind value once the memory model lands
        return "predicted_oom"
    if rec.label == "oom":
        phase = rec.oom_phase or ""
        return f"oom:{phase}" if phase in _OOM_PHASES else "oom:other"
    if rec.state == TrialState.FAIL:
        return "infra"
    return "failed"


def _first_knob(recs: Sequence[TrialFacts], names: Sequence[str]) -> str | None:
    for name in names:
        if any(_is_number(r.knob_value(name)) for r in recs):
            return name
    return None


def _simulated(recs: Sequence[TrialFacts]) -> str:
    return " (simulated)" if any(r.simulated for r in recs) else ""


def _unit(metric: str) -> str:
    if metric.endswith("_ms"):
        return "ms"
    if "throughput" in metric:
        return "tok/s" if "token" in metric or metric.startswith(("output", "input", "total")) else "req/s"
    return {"energy_per_token_j": "J/token", "cost_per_mtok": "per 1M tokens"}.get(metric, "")


def _objective(recs: Sequence[TrialFacts]) -> tuple[str, Any]:
    metric = next((r.objective_metric for r in recs if r.objective_metric), "objective")
    level = next((r.objective_level for r in recs if r.objective_level), None)
    return str(metric), level


# ---- the OOM map -----------------------------------------------------------------------------------


def oom_map(recs: Sequence[TrialFacts], *, x: str | None = None, y: str | None = None,
            boundary: Boundary | None = None) -> go.Figure:
    """Every trial with both knobs as one mark at (``x``, ``y``), coloured by :func:`outcome_class`.

    ``x`` defaults to the memory fraction knob, ``y`` to the graph batch-size knob. Each mark's
    ``customdata`` is its trial number. A COMPLETE trial's mark grows with its objective value.
    """
    import plotly.graph_objects as go

    x = x or _first_knob(recs, FRACTION_KNOBS) or "mem_fraction_static"
    y = y or _first_knob(recs, GRAPH_KNOBS) or "cuda_graph_max_bs"
    metric, level = _objective(recs)
    placed = [r for r in recs if r.knob_value(x) is not None and r.knob_value(y) is not None]
    values = [r.value for r in placed if r.value is not None and math.isfinite(r.value)]
    low, high = (min(values), max(values)) if values else (0.0, 0.0)
    fig = go.Figure()
    for key, (label, colour, symbol) in OUTCOME_CLASSES.items():
        group = [r for r in placed if outcome_class(r) == key]
        if not group:
            continue
        sizes = [_size(r.value, low, high) for r in group]
        fig.add_trace(go.Scatter(
            x=[r.knob_value(x) for r in group], y=[r.knob_value(y) for r in group],
            mode="markers", name=f"{label} ({len(group)})",
            marker={"color": colour, "symbol": symbol, "size": sizes, "line": {"width": 1.5, "color": colour}},
            customdata=[r.number for r in group],
            text=[_hover(r, metric) for r in group],
            hovertemplate="%{text}<extra></extra>",
            meta={"servetune_outcome": key},
        ))
    if boundary is not None and placed:
        _add_boundary(fig, placed, x, y, boundary)
    at = f" at C={level}" if level is not None else ""
    # No fixed height: optuna-dashboard draws a figure in a 450 px box, the report gives it more.
    fig.update_layout(
        title=f"Where configurations die{_simulated(recs)}<br>"
              f"<sup>one mark per trial; a surviving mark's size = {metric}{at}</sup>",
        xaxis_title=x, yaxis_title=y, margin={"t": 70, "r": 20},
        legend=BELOW,
    )
    for axis, knob in (("xaxis", x), ("yaxis", y)):  # a size knob of a few levels ticks at the levels tried
        levels = sorted({int(v) for r in placed if isinstance(v := r.knob_value(knob), int)
                         and not isinstance(v, bool)})
        if 1 < len(levels) <= 12:
            fig.update_layout({axis: {"tickvals": levels, "ticktext": [str(v) for v in levels]}})
    return _styled(fig)


def _size(value: float | None, low: float, high: float) -> float:
    if value is None or not math.isfinite(value):
        return 11.0
    if high <= low:
        return 16.0
    return 10.0 + 16.0 * (value - low) / (high - low)


def _hover(rec: TrialFacts, metric: str) -> str:
    lines = [f"trial {rec.number}: {rec.state.name} {rec.label}"
             + (f" in {rec.phase.value}" if rec.phase else "")]
    lines += [f"{k} = {v}" for k, v in sorted(rec.params.items())]
    if rec.value is not None:
        lines.append(f"{metric} = {rec.value:.1f} {_unit(metric)}".rstrip())
    if rec.free_after_capture_gib is not None:
        lines.append(f"free after capture = {rec.free_after_capture_gib:.2f} GiB")
    if rec.reason:
        lines.append(_wrap(rec.reason, 90))
    return "<br>".join(lines)


def _wrap(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _add_boundary(fig: go.Figure, placed: Sequence[TrialFacts], x: str, y: str, boundary: Boundary) -> None:
    import plotly.graph_objects as go

    xs_seen = [float(r.knob_value(x)) for r in placed if _is_number(r.knob_value(x))]
    ys_seen = [float(r.knob_value(y)) for r in placed if _is_number(r.knob_value(y))]
    if not xs_seen or not ys_seen:
        return
    xs = _span(min(xs_seen), max(xs_seen), 60)
    ys = _span(min(ys_seen), max(ys_seen), 40)
    z = [[boundary.margin(xv, yv) for xv in xs] for yv in ys]
    fig.add_trace(go.Contour(
        x=xs, y=ys, z=z, name=boundary.label, showscale=False, showlegend=True, hoverinfo="skip",
        contours={"start": 0.0, "end": 0.0, "size": 1.0, "coloring": "lines"},
        line={"width": 2, "dash": "dash", "color": "#444444"}, colorscale=[[0, "#444444"], [1, "#444444"]],
    ))


def _span(low: float, high: float, n: int) -> list[float]:
    if high <= low:
        pad = abs(low) * 0.05 or 1.0
        low, high = low - pad, high + pad
    return [low + (high - low) * i / (n - 1) for i in range(n)]


# ---- the memory ladder ------------------------------------------------------------------------------

#: (figure, label, colour) of the ladder's segments, in the order a server allocates memory.
LADDER = (
    ("weights_gib", "weights", "#1f77b4"),
    ("kv_gib", "KV pool", "#9467bd"),
    ("graph_gib", "graph pool", "#d62728"),
    ("other_gib", "other (runtime)", "#ff7f0e"),
    ("free_after_capture_gib", "free after capture", "#2ca02c"),
    ("in_use_at_oom_gib", "in use at death", "#ffbb78"),
    ("free_at_oom_gib", "free at death", "#98df8a"),
)


def gpu_total_gib(rec: TrialFacts, recs: Sequence[TrialFacts] = ()) -> float | None:
    """The GPU's total memory (GiB) for a trial: its own figure, else one another trial of the study saw
    (an OOM message states it; a trial that lived may not), else what was available before the weights."""
    for source in (rec, *recs):
        if _is_number(source.memory.gpu_total_gib):
            return float(source.memory.gpu_total_gib)
    before = rec.memory.avail_before_weights_gib
    return float(before) if _is_number(before) else None


def ladder_segments(rec: TrialFacts, total: float | None = None) -> dict[str, float]:
    """The ladder of one trial, GiB per GPU: the figures it has, and ``other_gib`` = what the GPU's
    ``total`` (default: :func:`gpu_total_gib`) leaves after them (activations, the runtime's own), when
    every figure is known.

    A trial that died of OOM with the free memory at its death known is drawn as it stood then: what was
    free after capture splits into ``in_use_at_oom_gib`` (the working set allocated before the failing
    allocation) and ``free_at_oom_gib``, so the failed allocation is drawn against what was free at the OOM."""
    keys = ("weights_gib", "kv_gib", "graph_gib", "free_after_capture_gib")
    out = {key: value for key in keys if (value := rec.memory.number(key)) is not None}
    total = total if total is not None else gpu_total_gib(rec)
    free_at_oom = rec.memory.number("free_at_oom_gib") if rec.label == "oom" else None
    static = ("weights_gib", "kv_gib", "graph_gib")
    if free_at_oom is not None:
        after_capture = out.pop("free_after_capture_gib", None)
        if after_capture is not None and after_capture - free_at_oom > 0.005:
            out["in_use_at_oom_gib"] = after_capture - free_at_oom
        out["free_at_oom_gib"] = free_at_oom
        if _is_number(total) and all(k in out for k in ("weights_gib", "kv_gib")):
            other = float(total) - sum(out.values())
            if other > 0.005:
                out["other_gib"] = other
        return out
    if _is_number(total) and all(k in out for k in (*static, "free_after_capture_gib")):
        other = float(total) - sum(out.values())
        if other > 0.005:
            out["other_gib"] = other
    return out


def in_use_at_oom_gib(rec: TrialFacts, total: float | None) -> float | None:
    """What a trial that died of OOM had in use when it died, per its OOM message (the GPU's total less what
    was free), or None when the message did not say."""
    free = rec.memory.number("free_at_oom_gib") if rec.label == "oom" else None
    return float(total) - free if free is not None and _is_number(total) else None


def memory_ladder(recs: Sequence[TrialFacts], numbers: Sequence[int] | None = None, *,
                  chosen: int | None = None) -> go.Figure:
    """Stacked bars, one per trial (``numbers``; default the ``chosen`` trial, servetune's choice, and the last
    trial that died of OOM), GiB per GPU, with the GPU's total and the peak used under load (nvidia-smi)
    marked."""
    import plotly.graph_objects as go

    shown = _ladder_trials(recs, numbers, chosen)
    labels = [_ladder_label(rec, chosen) for rec in shown]
    fig = go.Figure()
    segments = [ladder_segments(r, gpu_total_gib(r, recs)) for r in shown]
    for key, name, colour in LADDER:
        if not any(key in seg for seg in segments) and key in ("in_use_at_oom_gib", "free_at_oom_gib"):
            continue  # no trial shown died with its free memory known: no empty legend entries
        fig.add_trace(go.Bar(
            y=labels, x=[seg.get(key, 0.0) for seg in segments], name=name,
            orientation="h",
            marker_color=colour, hovertemplate=f"{name}: %{{x:.2f}} GiB<extra></extra>",
        ))
    # The allocation that failed starts where the free memory at the OOM began (the GPU's total less what
    # was free): drawn past the total by as much as it did not fit. A bar with a base is not stacked.
    tried = [(label, float(r.memory.tried_to_allocate_gib), total - float(r.memory.free_at_oom_gib))
             for label, r in zip(labels, shown, strict=True)
             if r.label == "oom" and _is_number(r.memory.tried_to_allocate_gib)
             and _is_number(r.memory.free_at_oom_gib) and (total := gpu_total_gib(r, recs)) is not None]
    if tried:
        fig.add_trace(go.Bar(
            y=[t[0] for t in tried], x=[t[1] for t in tried], base=[t[2] for t in tried],
            name="failed allocation",
            orientation="h", marker={"color": "rgba(0,0,0,0)", "line": {"color": "#d62728", "width": 2},
                                     "pattern": {"shape": "x", "fgcolor": "#d62728"}},
            hovertemplate="tried to allocate %{x:.2f} GiB<extra></extra>",
        ))
    totals = [(label, total) for label, r in zip(labels, shown, strict=True)
              if (total := gpu_total_gib(r, recs)) is not None]
    if totals:
        fig.add_trace(go.Scatter(
            y=[t[0] for t in totals], x=[t[1] for t in totals], mode="markers", name="GPU total",
            marker={"symbol": "line-ns-open", "size": 30, "color": "black", "line": {"width": 3}},
            hovertemplate="GPU total: %{x:.2f} GiB<extra></extra>",
        ))
    peaks, deaths, missed = _peaks(recs, shown, labels)
    if peaks:
        fig.add_trace(go.Scatter(
            y=[p[0] for p in peaks], x=[p[1] for p in peaks], mode="markers",
            name="peak under load (smi)",
            marker={"symbol": "diamond", "size": 12, "color": "black"},
            hovertemplate="peak used under load (nvidia-smi): %{x:.2f} GiB<extra></extra>",
        ))
    if deaths:
        fig.add_trace(go.Scatter(
            y=[d[0] for d in deaths], x=[d[1] for d in deaths], mode="markers",
            name="in use (OOM message)",
            marker={"symbol": "diamond-open", "size": 12, "color": "#d62728", "line": {"width": 2}},
            hovertemplate="in use when it died (OOM message): %{x:.2f} GiB<extra></extra>",
        ))
    # How each shown trial died, as subtitle lines (an annotation inside the plot is clipped at a card's width).
    notes: list[str] = []
    for label, rec in zip(labels, shown, strict=True):
        asked, free = rec.memory.tried_to_allocate_gib, rec.memory.free_at_oom_gib
        if rec.label != "oom" or not _is_number(asked):
            continue
        what = allocation_text(float(asked), float(free)) if _is_number(free) else \
            f"tried to allocate {float(asked):.2f} GiB"
        notes.append(f"trial {rec.number} died in {rec.oom_phase or 'an unknown phase'}: {what}")
        if label in missed:
            notes.append(f"trial {rec.number}: {missed[label]}")
    subtitle = "<br><sup>" + "<br>".join(notes) + "</sup>" if notes else ""
    fig.update_layout(
        barmode="stack", title=f"Memory ladder, GiB per GPU{_simulated(recs)}{subtitle}",
        xaxis_title="GiB per GPU", legend={**BELOW, "traceorder": "normal"},
        margin={"t": 70 + 14 * len(notes)},
    )
    fig.update_yaxes(autorange="reversed", type="category")
    return _styled(fig)


def _peaks(recs: Sequence[TrialFacts], shown: Sequence[TrialFacts], labels: Sequence[str],
           ) -> tuple[list[tuple[str, float]], list[tuple[str, float]], dict[str, str]]:
    """(peak under load per bar, in use at the death per bar, why a bar has no peak).

    The peak under load is nvidia-smi's over the load window. For a trial that died of OOM the OOM message
    says what was in use at the death; a sampled peak below it is a sample from before (sampling missed the
    death) and is not drawn as the peak."""
    peaks: list[tuple[str, float]] = []
    deaths: list[tuple[str, float]] = []
    missed: dict[str, str] = {}
    for label, r in zip(labels, shown, strict=True):
        smi = float(r.memory.smi_peak_used_mib) / 1024 if _is_number(r.memory.smi_peak_used_mib) else None
        at_death = in_use_at_oom_gib(r, gpu_total_gib(r, recs))
        if at_death is not None:
            deaths.append((label, at_death))
            if smi is None or smi < at_death - 0.01:
                missed[label] = ("no nvidia-smi sample under load" if smi is None else
                                 f"nvidia-smi's last sample under load, {smi:.2f} GiB, missed the death")
                continue
        if smi is not None:
            peaks.append((label, smi))
    return peaks, deaths, missed


def _ladder_trials(recs: Sequence[TrialFacts], numbers: Sequence[int] | None,
                   chosen: int | None) -> list[TrialFacts]:
    by_number = {r.number: r for r in recs}
    if numbers is None:
        died = [r.number for r in recs if r.label == "oom" and r.memory]
        numbers = ([chosen] if chosen is not None else []) + ([max(died)] if died else [])
    return [by_number[n] for n in numbers if n in by_number]


def _ladder_label(rec: TrialFacts, chosen: int | None) -> str:
    """Two short lines: a one-line label as wide as ``trial 12 (OOM in cuda_graph)`` narrows the plot, and
    plotly lays a horizontal legend out in columns no wider than the plot (so one entry per row that then
    scrolls in a dashboard card)."""
    tag = "best" if rec.number == chosen else rec.label
    if rec.label == "oom" and rec.oom_phase:
        tag = f"OOM in {rec.oom_phase}"
    return f"trial {rec.number}<br>({tag})"


# ---- throughput and TPOT against concurrency --------------------------------------------------------


def top_records(recs: Sequence[TrialFacts], direction: StudyDirection, k: int) -> list[TrialFacts]:
    """The first launches of the ``k`` best configurations (COMPLETE, feasible, measured, never died), ranked
    by the median of their launches' values: each configuration once, never a single lucky launch."""
    groups = _configuration_launches(recs)
    ranked = sorted(groups, key=lambda n: statistics.median(r.value or 0.0 for r in groups[n]),
                    reverse=direction == StudyDirection.MAXIMIZE)
    by_number = {r.number: r for r in recs}
    return [by_number[n] for n in ranked[:k] if n in by_number]


def _configuration_launches(recs: Sequence[TrialFacts]) -> dict[int, list[TrialFacts]]:
    """The launches of every configuration that never died, keyed by its first launch's number."""
    groups: dict[int, list[TrialFacts]] = {}
    died: set[int] = set()
    for r in recs:
        if not is_launch(r) or r.state not in (TrialState.COMPLETE, TrialState.PRUNED):
            continue
        if r.state != TrialState.COMPLETE or r.value is None or not r.feasible:
            died.add(origin(r))
            continue
        groups.setdefault(origin(r), []).append(r)
    return {n: launches for n, launches in groups.items() if n not in died}


def _median_levels(launches: Sequence[TrialFacts], metric: str) -> list[tuple[int, float]]:
    """(concurrency, the median of ``metric`` over the launches that measured it), by concurrency."""
    per_level: dict[int, list[float]] = {}
    for r in launches:
        for lv in r.levels:
            value = lv.figure(metric)
            if _is_number(value):
                per_level.setdefault(lv.max_concurrency, []).append(float(value))
    return [(c, statistics.median(vs)) for c, vs in sorted(per_level.items())]


def concurrency_curves(recs: Sequence[TrialFacts], *, k: int = 5,
                       direction: StudyDirection = StudyDirection.MAXIMIZE,
                       chosen: Sequence[TrialFacts] | None = None) -> go.Figure:
    """Output throughput (tok/s) and p99 TPOT (ms) against concurrency, one line per top configuration (or
    per ``chosen`` trial: a pareto study's front), each point the median over the configuration's launches;
    the concurrency axis ticks at the measured levels only."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("output throughput (tok/s)", "p99 TPOT (ms)"),
                        horizontal_spacing=0.16)
    palette = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
    shown = list(chosen)[:k] if chosen is not None else top_records(recs, direction, k)
    groups = _configuration_launches(recs)
    measured: set[int] = set()
    # A legend entry names the knobs that tell the lines apart (all of them for one line), so it fits a
    # dashboard card.
    varying = sorted({p for r in shown for p in r.params if len({_fmt(s.params.get(p)) for s in shown}) > 1}) \
        if len(shown) > 1 else sorted({p for r in shown for p in r.params})
    for i, rec in enumerate(shown):
        launches = groups.get(origin(rec)) or [rec]
        runs = f" (median of {len(launches)})" if len(launches) > 1 else " (1 launch)"
        name = (f"trial {origin(rec)}{runs}: "
                + ", ".join(f"{_short(p)}={_fmt(rec.params.get(p))}" for p in varying))
        colour = palette[i % len(palette)]
        for col, metric in ((1, "output_throughput"), (2, "p99_tpot_ms")):
            pts = _median_levels(launches, metric)
            measured.update(c for c, _ in pts)
            fig.add_trace(go.Scatter(
                x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", name=name,
                legendgroup=str(origin(rec)), showlegend=col == 1, line={"color": colour},
                hovertemplate=f"trial {origin(rec)}, C=%{{x}}: %{{y:.1f}} {_unit(metric)}<extra></extra>",
            ), row=1, col=col)
    ticks = sorted(measured)
    fig.update_xaxes(title_text="concurrency", type="log", tickvals=ticks,
                     ticktext=[str(c) for c in ticks], minor={"showgrid": False, "ticks": ""})
    fig.update_yaxes(title_text="tok/s", row=1, col=1)
    fig.update_yaxes(title_text="ms", row=1, col=2)
    fig.update_layout(title=f"Top configurations against concurrency{_simulated(recs)}<br>"
                            "<sup>concurrency: requests in flight; each point the median of a configuration's "
                            "launches</sup>", margin={"t": 80},
                      legend=BELOW)
    return _styled(fig)


# ---- progress -----------------------------------------------------------------------------------------


def progress_points(recs: Sequence[TrialFacts], direction: StudyDirection) -> list[dict[str, Any]]:
    """One point per server launch (finished trials that ran, by number): its launch count, the GPU-minutes
    spent so far, the best value so far, and whether it died."""
    maximize = direction == StudyDirection.MAXIMIZE
    best: float | None = None
    gpu_minutes = 0.0
    out: list[dict[str, Any]] = []
    launched = [r for r in sorted(recs, key=lambda r: r.number)
                if r.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL) and r.launched
                and r.label != "predicted_oom"]
    for n, rec in enumerate(launched, start=1):
        gpu_minutes += trial_seconds(rec) * gpus_used(rec) / 60
        if rec.value is not None and rec.feasible and rec.state == TrialState.COMPLETE and (
                best is None or (rec.value > best if maximize else rec.value < best)):
            best = rec.value
        out.append({"launch": n, "gpu_minutes": gpu_minutes, "best": best, "number": rec.number,
                    "died": rec.state != TrialState.COMPLETE, "outcome": outcome_class(rec)})
    return out


def trial_seconds(rec: TrialFacts) -> float:
    """How long a trial held its GPUs: its wall time on a real host; on a simulated host the simulated time
    (start-up at the host's speed plus the benchmark levels' durations, which the load generator times on
    the host's own clock), never the wall time the simulator took."""
    wall = rec.duration_s or 0.0
    speed = rec.memory.number("sim_speed") if rec.simulated else None
    if speed is None or speed <= 0:
        return wall
    bench = sum(lv.duration or 0.0 for lv in rec.levels)
    if rec.startup_s is None and not bench:
        return wall * speed
    return (rec.startup_s or 0.0) * speed + bench


def gpus_used(rec: TrialFacts) -> int:
    """GPUs a trial's server held: its tensor-parallel size when the launch names one, else the host's GPU
    count, else 1."""
    launch = rec.launch_config
    tp = engine_for(launch).tp_flag(launch.fixed_args) if launch is not None else None
    if tp is not None:
        return tp
    for name in ("tp", "tp_size", "tensor_parallel_size"):
        knob = rec.knob_value(name)
        if isinstance(knob, int) and knob > 0:
            return knob
    return rec.gpu_count if rec.gpu_count is not None and rec.gpu_count > 0 else 1


def progress_figure(recs: Sequence[TrialFacts], *,
                    direction: StudyDirection = StudyDirection.MAXIMIZE) -> go.Figure:
    """Best-so-far against launches and against GPU-minutes; each launch that died is an x on the line."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    metric, level = _objective(recs)
    points = progress_points(recs, direction)
    simulated = any(r.simulated for r in recs)
    minutes = "simulated GPU-minutes" if simulated else "GPU-minutes"
    fig = make_subplots(rows=1, cols=2, subplot_titles=("by server launches", f"by {minutes}"),
                        horizontal_spacing=0.16)
    for col, key in ((1, "launch"), (2, "gpu_minutes")):
        fig.add_trace(go.Scatter(
            x=[p[key] for p in points], y=[p["best"] for p in points], mode="lines+markers",
            line={"shape": "hv", "color": "#1f77b4"}, name="best so far", showlegend=col == 1,
            customdata=[p["number"] for p in points],
            hovertemplate="trial %{customdata}: best %{y:.1f}<extra></extra>",
        ), row=1, col=col)
        dead = [p for p in points if p["died"]]
        fig.add_trace(go.Scatter(
            x=[p[key] for p in dead], y=[p["best"] if p["best"] is not None else 0.0 for p in dead],
            mode="markers", marker={"symbol": "x", "size": 11, "color": "#d62728"}, name="launch that died",
            showlegend=col == 1, customdata=[[p["number"], OUTCOME_CLASSES[p["outcome"]][0]] for p in dead],
            hovertemplate="trial %{customdata[0]} died: %{customdata[1]}<extra></extra>",
        ), row=1, col=col)
    unit = _unit(metric)
    at = f" at C={level}" if level is not None else ""
    fig.update_xaxes(title_text="launches", row=1, col=1)
    fig.update_xaxes(title_text=minutes, row=1, col=2)
    fig.update_yaxes(title_text=f"best {metric}{at}" + (f" ({unit})" if unit else ""), row=1, col=1)
    held = "simulated time x GPUs held" if simulated else "trial wall time x GPUs held"
    fig.update_layout(title=f"Search progress{_simulated(recs)}<br><sup>{minutes}: {held}</sup>", margin={"t": 80},
                      legend=BELOW)
    return _styled(fig)


# ---- all of them, and where they go -----------------------------------------------------------------


def model_boundary(view: StudyView) -> Boundary | None:
    """The OOM map's predicted boundary from the study's memory model (:attr:`StudyView.memory_model`), over
    the map's two knobs, the other knobs as servetune's choice (else the first launch) has them: where the
    model's verdict changes, a margin of ``margin + SKIP_Z x sd`` (the search skips below zero). None while the
    model has no figures, or without a space to fit it."""
    model = view.memory_model
    recs = view.records
    x, y = _first_knob(recs, FRACTION_KNOBS), _first_knob(recs, GRAPH_KNOBS)
    if model is None or x is None or y is None:
        return None
    base = view.choice.record if view.choice is not None else next((r for r in recs if r.launched), None)
    if base is None:
        return None
    xs_seen = sorted({float(v) for r in recs if _is_number(v := r.knob_value(x))})
    ys = sorted({float(v) for r in recs if _is_number(v := r.knob_value(y))})
    if not xs_seen or not ys:
        return None
    xs = _span(xs_seen[0], xs_seen[-1], 34)
    margins: list[list[float]] = []
    for yv in ys:
        row = []
        for xv in xs:
            params = {**base.params, x: round(xv, 4), y: int(yv) if float(yv).is_integer() else yv}
            p = model.predict_params(params)
            if p is None:
                return None
            verdict = p.margin_gib + SKIP_Z * p.sd_gib
            row.append(min(verdict, -1e-3) if p.certain_death else verdict)
        margins.append(row)
    return Boundary.from_grid(xs, ys, margins, label="memory model: predicted OOM boundary")


def study_figures(view: StudyView, *, boundary: Boundary | None = None) -> dict[str, go.Figure]:
    """The study's figures keyed by :data:`FIGURE_IDS`, and for a ``pareto`` study :data:`PARETO_FIGURE_ID`
    first. The memory ladder shows servetune's choice (a pareto study: the knee of the front); in a pareto study
    the concurrency curves show the front's configurations, and the progress the best first metric so far. The
    OOM map draws ``boundary``, else the study's memory model's (:func:`model_boundary`)."""
    recs = view.records
    if boundary is None:
        boundary = model_boundary(view)
    goal = view.goal
    direction = view.direction
    chosen = view.choice.number if view.choice is not None else None
    if not goal.pareto:
        rate_search = {SLO_RATE_FIGURE_ID: slo_rate_search(recs)} if any(r.slo_rate_search for r in recs) else {}
        return {
            **rate_search,
            "servetune-oom-map": oom_map(recs, boundary=boundary),
            "servetune-memory-ladder": memory_ladder(recs, chosen=chosen),
            "servetune-concurrency": concurrency_curves(recs, direction=direction),
            "servetune-progress": progress_figure(recs, direction=direction),
        }
    by_number = {r.number: r for r in recs}
    front_recs = [by_number[p.number] for p in view.front]
    return {
        PARETO_FIGURE_ID: pareto_front(recs, goal, view.choice.record if view.choice is not None else None),
        "servetune-oom-map": oom_map(recs, boundary=boundary),
        "servetune-memory-ladder": memory_ladder(recs, chosen=chosen),
        "servetune-concurrency": concurrency_curves(recs, chosen=front_recs),
        "servetune-progress": progress_figure(recs, direction=direction),
    }


# ---- the SLO rate search ---------------------------------------------------------------------------------


def slo_ratio(rec: TrialFacts, level: LevelResult | None) -> float:
    """How far a rate-search step's measurement is from the SLO: its figure over its limit, for the limit it
    comes closest to breaking (at most 1: every limit held). ``inf`` when no request completed there."""
    if level is None or not level.completed:
        return math.inf
    worst = 0.0
    for name, limit in (rec.slo_limits or {}).items():
        if name == "error_rate":
            total = (level.completed or 0) + (level.failed or 0)
            value = (level.failed or 0) / total if total else 1.0
        else:
            raw = getattr(level, name, None)
            value = float(raw) if raw is not None else math.inf
        worst = max(worst, value / limit if limit > 0 else (math.inf if value > 0 else 0.0))
    return worst


def slo_rate_search(recs: Sequence[TrialFacts]) -> go.Figure:
    """``max_rate_under_slo``: each trial's rate search, the request rate of every step against how close it
    came to the SLO (its figure over its limit, for the limit nearest to breaking; 1 is the limit). A filled
    mark held, an open one broke; the star is the rate the trial found. The searches that found the highest
    rates are drawn (at most :data:`_SLO_TRIALS_SHOWN`)."""
    import plotly.graph_objects as go

    searched = [r for r in recs if r.slo_rate_search]
    searched.sort(key=lambda r: (r.slo_rate is None, -(r.slo_rate or 0.0), r.number))
    fig = go.Figure()
    top = 1.2  # the y axis reaches past the limit line, up to the highest ratio drawn
    palette = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
    for i, rec in enumerate(searched[:_SLO_TRIALS_SHOWN]):
        steps = sorted(rec.rate_step_levels(), key=lambda sl: sl[0].rate)
        ratios = [min(slo_ratio(rec, level), _SLO_RATIO_CLIP) for _, level in steps]
        top = max([top, *ratios])
        colour = palette[i % len(palette)]
        found = f"{rec.slo_rate:g} req/s" if rec.slo_rate is not None else "no rate held"
        fig.add_trace(go.Scatter(
            x=[step.rate for step, _ in steps], y=ratios, mode="lines+markers",
            name=f"trial {rec.number}: {found}", line={"color": colour, "width": 1.5},
            marker={"color": colour, "size": 10,
                    "symbol": ["circle" if step.holds else "x-open" for step, _ in steps]},
            customdata=[[rec.number, "held" if step.holds else "; ".join(step.violations)] for step, _ in steps],
            hovertemplate="trial %{customdata[0]} at %{x:g} req/s: %{customdata[1]}<extra></extra>",
        ))
        if rec.slo_rate is not None:
            at = next((r for (step, _), r in zip(steps, ratios, strict=True) if step.rate == rec.slo_rate), 1.0)
            fig.add_trace(go.Scatter(
                x=[rec.slo_rate], y=[at], mode="markers", showlegend=False,
                marker={"symbol": "star", "size": 16, "color": colour, "line": {"width": 1, "color": "black"}},
                hovertemplate=f"trial {rec.number}: found {rec.slo_rate:g} req/s<extra></extra>",
            ))
    fig.add_hline(y=1.0, line={"dash": "dash", "color": "#d62728"}, annotation_text="SLO limit",
                  annotation_position="top left")
    limits = next((r.slo_limits for r in searched if r.slo_limits), None) or {}
    held = ", ".join(f"{k} <= {v:g}" for k, v in limits.items())
    fig.update_xaxes(title_text="request rate (req/s, Poisson arrivals)")
    fig.update_yaxes(title_text="figure / limit, for the limit nearest to breaking",
                     range=[0, top * 1.08])
    fig.update_layout(title=f"SLO rate search per trial ({held}){_simulated(recs)}",
                      legend=BELOW)
    return _styled(fig)


# ---- the pareto front -----------------------------------------------------------------------------------


def pareto_front(recs: Sequence[TrialFacts], goal: Goal, knee: TrialFacts | None = None) -> go.Figure:
    """A ``pareto`` study's configurations on its first two metrics (each the median over the
    configuration's launches), the front highlighted (joined in order of the first metric) and its knee
    marked (``knee``: the choice, its values the medians over its launches). Each mark's ``customdata`` is the
    trial number of the configuration's first launch."""
    import plotly.graph_objects as go

    points = configurations(recs)
    on_front = non_dominated(points, goal.senses)
    front_numbers = {p.number for p in on_front}
    x_name, y_name = goal.metrics[0], goal.metrics[1]

    def hover(number: int, values: Sequence[float]) -> str:
        return f"trial {number}<br>" + "<br>".join(
            f"{m} = {v:.2f} {_unit(m)}".rstrip() for m, v in zip(goal.metrics, values, strict=True))

    fig = go.Figure()
    rest = [p for p in points if p.number not in front_numbers]
    line = sorted(on_front, key=lambda p: p.values[0])
    for name, group, style in (
            (f"other configurations ({len(rest)})", rest, {"mode": "markers", "marker": {"color": "#9aa5b1",
                                                                                        "size": 9}}),
            (f"front ({len(line)})", line, {"mode": "lines+markers", "line": {"color": "#2ca02c"},
                                            "marker": {"color": "#2ca02c", "size": 12}})):
        fig.add_trace(go.Scatter(
            x=[p.values[0] for p in group], y=[p.values[1] for p in group], name=name,
            customdata=[p.number for p in group], text=[hover(p.number, p.values) for p in group],
            hovertemplate="%{text}<extra></extra>", **style,
        ))
    if knee is not None and knee.values:
        fig.add_trace(go.Scatter(
            x=[knee.values[0]], y=[knee.values[1]], mode="markers", name=f"knee (trial {knee.number})",
            marker={"symbol": "star", "size": 20, "color": "#d62728"}, customdata=[knee.number],
            text=[hover(knee.number, knee.values)], hovertemplate="%{text}<extra></extra>",
        ))
    level = next((r.objective_level for r in recs if r.objective_level), None)
    at = f" at C={level}" if level is not None else ""
    more = f"; also traded off: {', '.join(goal.metrics[2:])}" if len(goal.metrics) > 2 else ""
    fig.update_layout(
        title=f"Pareto front{_simulated(recs)}<br><sup>{goal.describe()}{at}; one mark per configuration "
              f"(median of its launches){more}</sup>",
        xaxis_title=f"{x_name} ({_unit(x_name)})" if _unit(x_name) else x_name,
        yaxis_title=f"{y_name} ({_unit(y_name)})" if _unit(y_name) else y_name,
        margin={"t": 70, "r": 20}, legend=BELOW,
    )
    return _styled(fig)


def save_to_dashboard(study: optuna.Study, figures: dict[str, go.Figure]) -> None:
    """Store (replace) the figures in the study for optuna-dashboard, one graph object per id."""
    for graph_id, figure in figures.items():
        save_plotly_graph_object(study, figure, graph_object_id=graph_id)


class FiguresCallback:
    """Optuna study callback that refreshes the dashboard figures after each finished trial.

    Never raises: a figure is a convenience, the study goes on without it (one warning, then debug lines).
    ``boundary`` is passed on to :func:`oom_map`. ``background=True`` draws on a worker thread, off the
    trials' critical path (drawing and storing four figures takes a few tenths of a second); trials that
    finish while it draws are coalesced into one redraw of the latest state. :meth:`close` waits for the
    last redraw and stops the worker.
    """

    def __init__(self, boundary: Boundary | None = None, *, background: bool = False) -> None:
        self.boundary = boundary
        self.failures = 0
        self.drawn = 0
        self._lock = threading.Lock()
        self._pending: tuple[StudyView, int] | None = None
        self._closed = False
        self._wake = threading.Event()
        self._worker: threading.Thread | None = None
        if background:
            self._worker = threading.Thread(target=self._run, name="servetune-figures", daemon=True)
            self._worker.start()

    def __call__(self, view: StudyView, trial: FrozenTrial) -> None:
        if self._worker is None:
            self._draw(view, trial.number)
            return
        with self._lock:
            self._pending = (view, trial.number)
        self._wake.set()

    def close(self) -> None:
        """Draw what is pending, then stop the worker (no-op without one)."""
        if self._worker is None:
            return
        with self._lock:
            self._closed = True
        self._wake.set()
        self._worker.join()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                item, self._pending = self._pending, None
                closed = self._closed
            if item is not None:
                self._draw(*item)
            if closed:
                return

    def _draw(self, view: StudyView, number: int) -> None:
        try:
            save_to_dashboard(view.study, study_figures(view, boundary=self.boundary))
            self.drawn += 1
        except Exception as exc:  # a figure is a convenience: the study goes on without it
            self.failures += 1
            log = logger.warning if self.failures == 1 else logger.debug
            log("dashboard figures after trial %d not saved: %s", number, exc)


# ---- small helpers --------------------------------------------------------------------------------------


def _styled(fig: go.Figure) -> go.Figure:
    """plotly_white's look, spelled out: a named template is copied into every figure's JSON (7 kB of its
    10 kB), and optuna-dashboard stores a figure in the study in 2 kB pieces, one write each."""
    grid = {"gridcolor": "#ebf0f8", "zerolinecolor": "#ebf0f8", "linecolor": "#ebf0f8", "showgrid": True,
            "automargin": True}
    fig.update_layout(template="none", plot_bgcolor="white", paper_bgcolor="white",
                      font={"color": "#2a3f5f"}, hoverlabel={"align": "left"})
    fig.update_xaxes(**grid)
    fig.update_yaxes(**grid)
    return fig


def _is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _short(name: str) -> str:
    return {"mem_fraction_static": "mem", "cuda_graph_max_bs": "graph bs",
            "num_continuous_decode_steps": "decode steps"}.get(name, name.removeprefix("nccl."))


class FiguresSink:
    """The dashboard figures as a run's output (:mod:`search.outputs.sink`): redrawn after each finished trial
    on a worker thread (:class:`FiguresCallback`); closing waits for the last redraw, so the report's own
    figures are stored after it."""

    name = "figures"

    def __init__(self) -> None:
        self.callback = FiguresCallback(background=True)

    @classmethod
    def open(cls, context: SinkContext) -> FiguresSink:
        return cls()

    def on_trial(self, view: StudyView, trial: FrozenTrial) -> None:
        self.callback(view, trial)

    def close(self) -> None:
        self.callback.close()

    def publish(self, view: StudyView, publication: Publication) -> None:
        pass
