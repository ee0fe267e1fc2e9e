"""The live view of ``servetune run``: trial n of N, each running trial's host and phase, best so far,
OOMs so far; and the summary table at the end."""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from optuna.trial import FrozenTrial, TrialState
from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from runners.events import LevelDone, PhaseReached
from search.cli.safe import safe_write
from search.outputs.status import StudyStatus
from search.outputs.text import figure_text, format_duration
from search.strategy.choice import Choice
from search.strategy.confirm import skip_summary
from search.strategy.view import Counts, StudyView
from search.trial.objective import Benchmarking, HostChosen, TrialEvent
from search.trial.records import TrialFacts, value_text
from spaces.schema import OBJECTIVE_UNITS

if TYPE_CHECKING:
    from search.api import RunPlan
    from search.cli.describe import DryRun
    from search.driver.run import RunSummary
    from spaces.schema import Space

_PHASE_WORDS = {
    "starting": "starting",
    "load_weights": "loading weights",
    "kv_pool": "allocating KV cache",
    "cuda_graph": "capturing graphs",
    "warmup": "warming up",
    "ready": "ready",
    "benchmarking": "benchmarking",
    "prefill": "serving (prefill)",
    "decode": "serving (decode)",
}


class Progress:
    """Receives trial events from the objective and trial results from a study callback."""

    def __init__(self, console: Console, *, n_trials: int | None, metric: str, live: bool = True,
                 simulated: bool = False) -> None:
        self.console = console
        self.n_trials = n_trials
        self.done = 0
        self.metric = metric
        self.live_enabled = live and console.is_terminal
        self.running: dict[int, dict[str, Any]] = {}
        self.best: tuple[float, int] | None = None
        self.front: int | None = None
        """A ``pareto`` study's front size so far (None for one objective)."""
        self.ooms = 0
        self.failed = 0
        self.counts: Counts | None = None
        """The study's trials counted apart (search, confirmations, skips), after the first finished trial."""
        self.level: int | None = None
        self.simulated = simulated
        self._lock = threading.Lock()
        self._live: Live | None = None
        self._logs: LibraryLogs | None = None
        self._started = time.monotonic()

    # -- hooks ---------------------------------------------------------------------------------

    def hook(self, number: int, event: TrialEvent) -> None:
        with self._lock:
            row = self.running.setdefault(number, {"host": "", "phase": "waiting for a host"})
            match event:
                case HostChosen(host=host):
                    row["host"] = host
                    row["phase"] = "preflight"
                case PhaseReached(phase=phase):
                    row["phase"] = _PHASE_WORDS.get(phase.value, phase.value)
                case Benchmarking():
                    row["phase"] = _PHASE_WORDS["benchmarking"]
                case LevelDone(record=level):
                    sim = " (simulated)" if level.get("simulated") else ""
                    row["phase"] = (f"benchmarked C={level.get('max_concurrency')}: "
                                    f"{level.get('output_throughput', 0):.1f} tok/s{sim}")
        if not self.live_enabled and isinstance(event, HostChosen):
            self.console.print(f"trial {number}: on {event.host}")
        self._refresh()

    def callback(self, view: StudyView, trial: FrozenTrial) -> None:
        rec = TrialFacts.from_trial(trial)
        with self._lock:
            self.running.pop(trial.number, None)
            self.done += 1
            self.simulated = self.simulated or rec.simulated
            if rec.oom:
                self.ooms += 1
            if rec.state == TrialState.FAIL:
                self.failed += 1
            self.counts = view.counts
            if view.goal.pareto:
                self.front = len(view.front)
            elif view.choice is not None and view.choice.value is not None:
                self.best = (view.choice.value, view.choice.number)
                self.level = view.choice.record.objective_level
        if not self.live_enabled:
            self.console.print(_line(rec, self.metric), markup=False, highlight=False, soft_wrap=True)
        self._refresh()

    # -- rendering -----------------------------------------------------------------------------

    def _render(self) -> Group:
        total = f" of {self.n_trials}" if self.n_trials else ""
        best = (f"{figure_text(self.best[0], self.metric, self.level)} (trial {self.best[1]})" if self.best
                else "-")
        counts = self.counts
        # The search budget counts the search's own trials; confirmations and skips are counted apart.
        search = counts.search_done if counts is not None else self.done
        apart = (f"  confirmations {counts.confirmations}  skipped {counts.skips} (predicted OOM)"
                 if counts is not None and (counts.confirmations or counts.skips) else "")
        head = Text.assemble(
            ("servetune ", "bold"), f"search {search}{total}", apart,
            ("  front " if self.front is not None else "  best "),
            (f"{self.front} configuration(s)" if self.front is not None else best, "green"),
            " (simulated)" if self.simulated and self.best else "",
            "  died of OOM ", (str(self.ooms), "red" if self.ooms else ""),
            f"  failed {self.failed}",
            f"  elapsed {time.monotonic() - self._started:.0f}s",
        )
        table = Table(box=None, padding=(0, 2))
        table.add_column("trial")
        table.add_column("host")
        table.add_column("phase")
        with self._lock:
            rows = sorted(self.running.items())
        for number, row in rows:
            table.add_row(str(number), str(row["host"]), str(row["phase"]))
        return Group(head, table)

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._render())

    def __enter__(self) -> Progress:
        if self.live_enabled:
            self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=True)
            self._live.__enter__()
            self._logs = LibraryLogs(self.console)
            self._logs.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._logs is not None:
            self._logs.__exit__()
            self._logs = None
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None


#: Libraries whose log handlers hold the terminal's stream from before the live display started.
LIBRARY_LOGGERS = ("optuna", "optuna_dashboard", "mlflow", "alembic", "paramiko", "sqlalchemy")


class _ConsoleHandler(logging.Handler):
    """Prints a log record through the live display's console, which puts it above the display."""

    def __init__(self, console: Console) -> None:
        super().__init__(logging.WARNING)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = f"{record.name}: {record.levelname.lower()}: {' '.join(record.getMessage().split())}"
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)
        except Exception:  # a log line must never break the run
            self.handleError(record)


class LibraryLogs:
    """While the live display runs, the loggers of :data:`LIBRARY_LOGGERS` write their warnings through its
    console instead of their own handlers.

    NOTE: rich's Live redirects ``sys.stderr``, but a ``StreamHandler`` made at import time (optuna's,
    mlflow's) keeps the stream it was given then, so its lines would be drawn into the middle of the
    display. Those handlers are set aside until the display ends; below WARNING is dropped meanwhile.
    """

    def __init__(self, console: Console) -> None:
        self.handler = _ConsoleHandler(console)
        self._saved: list[tuple[logging.Logger, list[logging.Handler], bool]] = []

    def __enter__(self) -> LibraryLogs:
        for name in LIBRARY_LOGGERS:
            logger = logging.getLogger(name)
            self._saved.append((logger, list(logger.handlers), logger.propagate))
            logger.handlers = [self.handler]
            logger.propagate = False
        return self

    def __exit__(self, *exc: object) -> None:
        for logger, handlers, propagate in self._saved:
            logger.handlers = handlers
            logger.propagate = propagate
        self._saved = []


def _line(rec: TrialFacts, metric: str) -> str:
    params = ", ".join(f"{_short(k)}={_value(v)}" for k, v in rec.params.items())  # printed without markup
    if rec.state == TrialState.COMPLETE:
        sim = " (simulated)" if rec.simulated else ""
        if rec.values is not None:
            names = rec.objective_metrics or [f"objective{i}" for i in range(len(rec.values))]
            figures = ", ".join(f"{m}={v:.1f}" for m, v in zip(names, rec.values, strict=False))
        else:
            figures = f"{metric}={value_text(rec)}"
        return f"trial {rec.number}: COMPLETE {figures}{sim}  [{params}]"
    where = f" in {rec.phase.value}" if rec.phase else ""
    return f"trial {rec.number}: {rec.state.name} {rec.label}{where}  [{params}]  {rec.reason}"


_SHORT = {"mem_fraction_static": "mem frac", "cuda_graph_max_bs": "graph bs",
          "num_continuous_decode_steps": "decode steps", "max_running_requests": "max running",
          "chunked_prefill_size": "chunked prefill", "gpu_memory_utilization": "gpu mem util",
          "max_num_seqs": "max seqs", "max_num_batched_tokens": "batched tokens", "cuda_graph_sizes": "graph sizes",
          "max_model_len": "model len", "enforce_eager": "eager", "kv_cache_space_gib": "kv GiB"}


def _short(name: str) -> str:
    return _SHORT.get(name, name.removeprefix("nccl."))


def _value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def print_plan(console: Console, plan: RunPlan, *, simulated: bool = False) -> None:
    """What ``servetune run`` prints once its hosts are open: the study, the hosts, storage and budget."""
    sim = " (SIMULATED GPU host: every figure below is simulated)" if simulated else ""
    console.print(f"study [bold]{escape(plan.study)}[/] on {escape(', '.join(plan.hosts))} "
                  f"(storage {escape(plan.storage)}; budget {plan.n_trials or 'unlimited'} trials){sim}",
                  soft_wrap=True)  # one line whatever the width: logs and scripts grep it
    for line in plan.warnings:
        # One plain line on stderr: what the run goes on without (paths and errors may hold "[").
        safe_write(" ".join(line.split()) + "\n", sys.stderr)


def print_dry_run(console: Console, plan: DryRun, *, simulated: bool) -> None:
    """``servetune run --dry-run``: the study, hosts and budget, and the first launches with their commands."""
    budget = f"{plan.n_trials} trials" if plan.n_trials else "no trial limit"
    if plan.timeout:
        budget += f", at most {format_duration(plan.timeout)}"
    sim = " (SIMULATED GPU host: every figure it produces is simulated)" if simulated else ""
    lines = [f"dry run: nothing is launched and nothing is written{sim}",
             f"study {plan.study}; budget {budget}",
             f"hosts: {', '.join(plan.hosts)}"]
    if plan.resumed:
        lines.append(f"the study holds {plan.resumed} trial(s): the run resumes it, and the sampler proposes the "
                     "next configurations from them")
    for label, params, command in plan.launches:
        knobs = ", ".join(f"{k}={_value(v)}" for k, v in params.items())
        lines += [f"{label}: {knobs}", f"  {command}"]
    if plan.launches:
        lines.append("(the memory model may skip a launch it predicts dies; the sampler proposes the rest"
                     + ("; flags as the newest release spells them, the host's version decides)"
                        if plan.version_unknown else ")"))
    if simulated and "local (this machine)" in plan.hosts:
        lines.append("(on this machine the simulated host binds a free loopback port for each launch, not the "
                     "space's port: another run may be serving on it)")
    for line in lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def print_run(console: Console, err_console: Console, summary: RunSummary, space: Space) -> None:
    """What ``servetune run`` prints after a run: the trials, hosts set aside, why it stopped, servetune's
    choice and where the morning summary is."""
    if summary.mlflow_error is not None:
        err_console.print(f"mlflow: {summary.mlflow_error} (back-fill later with `servetune sync-mlflow`)")
    view = summary.view
    recs = view.records
    chosen = view.choice.number if view.choice is not None else None
    console.print(summary_table(recs, " / ".join(space.objective.metric_names), width=min(console.width, 100),
                                chosen=chosen))
    for orphan in summary.orphans_stopped:
        console.print(f"stopped an orphaned server: {orphan}")
    for line in summary.warm_start:
        console.print(line, markup=False, soft_wrap=True)
    for line in summary.hosts_dropped:
        err_console.print(f"host dropped: {line}", markup=False, soft_wrap=True)
    set_aside = [f"{s.host} ({s.state}: {s.last_error})" for s in summary.host_states if s.state.out]
    if set_aside:
        console.print("hosts set aside: " + "; ".join(set_aside))
    console.print(f"ran {summary.ran} trial(s) in this run; stopped by: {summary.stopped_by}")
    console.print(skip_summary(recs), markup=False, soft_wrap=True)
    if view.goal.pareto:
        _print_front(console, view)
    else:
        _print_best(console, view, space)
    if summary.report_path is not None:
        name = view.name
        if summary.report_html_path is not None:
            console.print(f"morning summary: {summary.report_html_path} and {summary.report_path.name} (again "
                          f"any time: servetune report --study {name} --format html)", soft_wrap=True)
        else:
            console.print(f"morning summary: {summary.report_path} (again any time: servetune report --study {name})")


def _print_front(console: Console, view: StudyView) -> None:
    """A pareto study's end: the front's size and its knee (servetune's choice, what ``export`` picks)."""
    goal, points, choice = view.goal, view.front, view.choice
    if choice is None:
        console.print("[yellow]no COMPLETE feasible trial yet: no front[/]")
        return
    knee = choice.record
    figures = ", ".join(f"{m}={v:.1f}" for m, v in zip(goal.metrics, knee.values or [], strict=False))
    params = ", ".join(f"{k}={v}" for k, v in knee.params.items())
    sim = " (simulated)" if knee.simulated else ""
    console.print(f"[green]front[/]: {len(points)} configuration(s) ({goal.describe()}): trials "
                  f"{', '.join(str(p.number) for p in points)}", soft_wrap=True)
    console.print(f"[green]knee[/]: trial {knee.number}, {figures}{sim}  {escape('[' + params + ']')} "
                  f"(`servetune export --study {view.name}` exports it; `--pick "
                  f"\"{goal.metrics[-1]}<=X\"` picks by a limit instead)", soft_wrap=True)


def _print_best(console: Console, view: StudyView, space: Space) -> None:
    choice = view.choice
    if choice is None or choice.value is None:
        console.print("[yellow]no COMPLETE trial yet[/]")
        return
    best, confirmed = choice.record, choice.confirmed
    params = ", ".join(f"{k}={v}" for k, v in best.params.items())
    sim = " (simulated)" if best.simulated else ""
    # 4 significant digits: a rate of 0.0656 req/s must not print as 0.1 (nor a throughput lose its unit's sense)
    if choice.basis == "confirmed" and confirmed is not None:
        console.print(f"[green]best[/] (confirmed over {confirmed.launches} launches, spread "
                      f"{confirmed.spread:.1%}): trial {best.number}, {space.objective.scored_by}="
                      f"{choice.value:.4g}{sim} ({_reported_from(choice)}) at C={space.target_level}  "
                      f"{escape('[' + params + ']')}", soft_wrap=True)
    else:
        console.print(f"[green]best[/]: trial {best.number}, {space.objective.scored_by}={choice.value:.4g}{sim} "
                      f"at C={space.target_level}  {escape('[' + params + ']')}", soft_wrap=True)


def summary_table(records: list[TrialFacts], metric: str, *, width: int = 100, chosen: int | None = None) -> Table:
    """One row per trial, one column per searched knob, laid out in ``width`` columns without breaking a word
    (headers and outcomes wrap at their spaces; see :func:`_fit`). The role column says why each trial ran;
    ``chosen`` (servetune's choice) reads ``<role> CHOSEN``."""
    knobs: list[str] = []
    for rec in records:
        knobs += [k for k in rec.params if k not in knobs]
    simulated = any(r.simulated for r in records)
    unit = OBJECTIVE_UNITS.get(metric)
    headers = ["#", "state", "outcome", "role", metric.replace("_", " ") + (f" ({unit})" if unit else ""),
               *(_short(k) for k in knobs), "free after capture (GiB)"]
    rows: list[list[str]] = []
    styles: list[str] = []
    for rec in records:
        free = rec.free_after_capture_gib
        outcome = rec.label + (f" ({rec.phase.value})" if rec.phase and rec.state != TrialState.COMPLETE else "")
        role = rec.role + (" CHOSEN" if rec.number == chosen else "")
        rows.append([str(rec.number), rec.state.name, outcome, role, value_text(rec),
                     *(_value(rec.params.get(k, "-")) for k in knobs), f"{free:.2f}" if free is not None else "-"])
        styles.append({TrialState.COMPLETE: "green", TrialState.PRUNED: "yellow", TrialState.FAIL: "red"}.get(
            rec.state, ""))
    title = "servetune trials" + (" (simulated host: every figure is simulated)" if simulated else "")
    columns = [[header, *(r[i] for r in rows)] for i, header in enumerate(headers)]
    # Two spaces between columns where they fit, else one (a narrow terminal), else rich folds as it must.
    gap = 2
    widths = _fit(columns, width, gap)
    if widths is None:
        gap = 1
        widths = _fit(columns, width, gap) or _squeeze(columns, width, gap)
    table = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, gap - 1), collapse_padding=True, pad_edge=False,
                  show_edge=False)
    for i, header in enumerate(headers):
        table.add_column(header, justify="right" if i == 0 else "left", width=widths[i], overflow="fold")
    for row, style in zip(rows, styles, strict=True):
        table.add_row(row[0], Text(row[1], style=style), row[2],
                      Text(row[3], style="bold" if row[3].endswith("CHOSEN") else ""), *row[4:])
    return table


def _fit(columns: list[list[str]], width: int, gap: int) -> list[int] | None:
    """Column widths that fit ``width`` (``gap`` columns between two cells) with no word broken: each column
    at least its longest word, then the spare width given to the columns whose whole text needs the least of
    it, so the fewest cells wrap. None when even the longest words do not fit."""
    mins = [max(len(word) for cell in col for word in (cell.split() or [""])) for col in columns]
    maxs = [max(len(cell) for cell in col) for col in columns]
    spare = width - gap * (len(columns) - 1) - sum(mins)
    if spare < 0:
        return None
    widths = list(mins)
    for i in sorted(range(len(columns)), key=lambda i: maxs[i] - mins[i]):
        extra = min(maxs[i] - widths[i], spare)
        widths[i] += extra
        spare -= extra
    return widths


def _squeeze(columns: list[list[str]], width: int, gap: int) -> list[int]:
    """Widths for a terminal too narrow for every word: the widest columns give up a column each in turn (only
    their longest words fold), never below 4."""
    widths = [max(len(word) for cell in col for word in (cell.split() or [""])) for col in columns]
    avail = width - gap * (len(columns) - 1)
    while sum(widths) > avail and max(widths) > 4:
        widths[widths.index(max(widths))] -= 1
    return widths


def status_view(status: StudyStatus) -> Group:
    """``servetune status`` for a terminal: a head line, the trial counts, the hosts and the running trials."""
    trials = status.trials
    best = status.best
    sim = " (simulated)" if best and best.simulated else ""
    elapsed = status.elapsed_s
    eta = status.eta_s
    head = Text.assemble(
        ("study ", "bold"), (status.study, "bold"), f"  {status.state}",
        f"  elapsed {format_duration(elapsed)}" if elapsed is not None else "",
        f"  time left about {format_duration(eta)}" if eta is not None and status.state == "running" else "",
    )
    best_line = Text("best: -") if best is None else Text.assemble(
        "best: ", (f"trial {best.number}", "green"),
        (f"  {' / '.join(_figure(v, m, best.level) for v, m in zip(best.values, best.metrics or [], strict=False))}"
         f" (knee of the front){sim}" if best.values
         else f"  {figure_text(best.value, best.metric, best.level)}{sim}" if best.value is not None else ""),
        f"  free after capture {best.free_after_capture_gib:.2f} GiB"
        if best.free_after_capture_gib is not None else "",
        "  [" + ", ".join(f"{_short(k)}={_value(v)}" for k, v in best.params.items()) + "]",
    )
    # Counted apart, as a person reads a search: the search's own launches against its budget, the
    # confirmations outside it, deaths, configurations skipped unlaunched (PRUNED too), infrastructure failures.
    search = f"{trials.search} of {status.n_trials}" if status.n_trials else str(trials.search)
    counts = Text.assemble(
        "trials: ", (f"search {search}", "bold"), f", confirmations {trials.confirmations}",
        ", died of OOM ", (str(trials.oom), "red" if trials.oom else ""),
        f", other deaths {max(trials.died - trials.oom, 0)}",
        f", skipped as predicted OOM {trials.skipped}",
        f", reused {trials.reused}" if trials.reused else "",
        f", failed (infrastructure) {trials.failed}",
        f", running {trials.running}" if trials.running else "",
        f", waiting {trials.waiting}" if trials.waiting else "",
        f"; {trials.total} trials in all",
    )
    hosts = Table(title="hosts", box=None, padding=(0, 2))
    for col in ("host", "state", "trial", "done", "last outcome"):
        hosts.add_column(col)
    for name, host in status.hosts.items():
        done = f"{host.complete} ok / {host.pruned} died / {host.failed} failed"
        hosts.add_row(name, host.state, str(host.trial) if host.trial is not None else "-", done,
                      host.last_outcome or "-")
    parts: list[Any] = [head, best_line, counts]
    if status.hosts:
        parts.append(hosts)
    return Group(*parts)


def _figure(value: float, metric: str, level: int | None) -> str:
    return figure_text(value, metric, level) if metric else f"{value:.1f}"


def _reported_from(choice: Choice) -> str:
    """What the confirmed figure is (the mean of the final launches, with its interval; the median of the
    repeats), as the choice says it."""
    confirmed = choice.confirmed
    interval = (f", ±{confirmed.interval:.1%} (90%)" if confirmed is not None and confirmed.interval is not None
                else "")
    return choice.reported_text() + interval
