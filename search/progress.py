"""The live view of ``servetune run``: trial n of N, each running trial's host and phase, best so far,
OOMs so far; and the summary table at the end."""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial, TrialState
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from search.confirm import Confirmed, confirmed_best, skip_summary
from search.records import TrialFacts, best_record, records

if TYPE_CHECKING:
    from search.api import RunPlan
    from search.report import StudyStatus
    from search.run import RunSummary
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

    def __init__(self, console: Console, *, n_trials: int | None, metric: str, live: bool = True) -> None:
        self.console = console
        self.n_trials = n_trials
        self.done = 0
        self.metric = metric
        self.live_enabled = live and console.is_terminal
        self.running: dict[int, dict[str, Any]] = {}
        self.best: tuple[float, int] | None = None
        self.ooms = 0
        self.failed = 0
        self.simulated = False
        self._lock = threading.Lock()
        self._live: Live | None = None
        self._started = time.monotonic()

    # -- hooks ---------------------------------------------------------------------------------

    def hook(self, number: int, kind: str, value: Any) -> None:
        with self._lock:
            row = self.running.setdefault(number, {"host": "", "phase": "waiting for a host"})
            if kind == "host":
                row["host"] = value
                row["phase"] = "preflight"
            elif kind == "phase":
                row["phase"] = _PHASE_WORDS.get(str(value), str(value))
            elif kind == "level":
                sim = " (simulated)" if value.get("simulated") else ""
                row["phase"] = (f"benchmarked C={value.get('max_concurrency')}: "
                                f"{value.get('output_throughput', 0):.1f} tok/s{sim}")
        if not self.live_enabled and kind in ("host",):
            self.console.print(f"trial {number}: on {value}")
        self._refresh()

    def callback(self, study: optuna.Study, trial: FrozenTrial) -> None:
        rec = TrialFacts.from_trial(trial)
        with self._lock:
            self.running.pop(trial.number, None)
            self.done += 1
            self.simulated = self.simulated or rec.simulated
            if rec.oom:
                self.ooms += 1
            if rec.state == TrialState.FAIL:
                self.failed += 1
            if rec.value is not None and rec.feasible and (self.best is None or rec.value > self.best[0]):
                self.best = (rec.value, trial.number)
        if not self.live_enabled:
            self.console.print(_line(rec, self.metric), markup=False, highlight=False)
        self._refresh()

    # -- rendering -----------------------------------------------------------------------------

    def _render(self) -> Group:
        total = f" of {self.n_trials}" if self.n_trials else ""
        head = Text.assemble(
            ("servetune ", "bold"), f"trials done {self.done}{total}",
            "  best ", (f"{self.best[0]:.1f} (trial {self.best[1]})" if self.best else "-", "green"),
            " simulated" if self.simulated and self.best else "",
            "  OOMs ", (str(self.ooms), "red" if self.ooms else ""),
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
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None


def _line(rec: TrialFacts, metric: str) -> str:
    params = ", ".join(f"{_short(k)}={_value(v)}" for k, v in rec.params.items())  # printed without markup
    if rec.state == TrialState.COMPLETE:
        sim = " (simulated)" if rec.simulated else ""
        return f"trial {rec.number}: COMPLETE {metric}={rec.value:.1f}{sim}  [{params}]"
    where = f" in {rec.phase.value}" if rec.phase else ""
    return f"trial {rec.number}: {rec.state.name} {rec.label}{where}  [{params}]  {rec.reason}"


def _short(name: str) -> str:
    return {"mem_fraction_static": "mem frac", "cuda_graph_max_bs": "graph bs",
            "num_continuous_decode_steps": "decode steps"}.get(name, name.removeprefix("nccl."))


def _value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def print_plan(console: Console, plan: RunPlan) -> None:
    """What ``servetune run`` prints once its hosts are open: the study, the hosts, storage and budget."""
    console.print(f"study [bold]{plan.study}[/] on {', '.join(plan.hosts)} "
                  f"(storage {plan.storage}; budget {plan.n_trials or 'unlimited'} trials)")
    for line in plan.warnings:
        # One plain line on stderr: what the run goes on without (paths and errors may hold "[").
        sys.stderr.write(" ".join(line.split()) + "\n")


def print_run(console: Console, err_console: Console, summary: RunSummary, space: Space) -> None:
    """What ``servetune run`` prints after a run: the trials, hosts set aside, why it stopped, the best
    configuration and where the morning summary is."""
    if summary.mlflow_error is not None:
        err_console.print(f"mlflow: {summary.mlflow_error} (back-fill later with `servetune sync-mlflow`)")
    recs = records(summary.study)
    console.print(summary_table(recs, space.objective.scored_by))
    for orphan in summary.orphans_stopped:
        console.print(f"stopped an orphaned server: {orphan}")
    for line in summary.hosts_dropped:
        err_console.print(f"host dropped: {line}", markup=False, soft_wrap=True)
    set_aside = [f"{s.host} ({s.state}: {s.last_error})" for s in summary.host_states if s.state.out]
    if set_aside:
        console.print("hosts set aside: " + "; ".join(set_aside))
    console.print(f"ran {summary.ran} trial(s) in this run; stopped by: {summary.stopped_by}")
    console.print(skip_summary(recs), markup=False, soft_wrap=True)
    best = best_record(recs, summary.study.direction)
    confirmed = confirmed_best(recs, summary.study.direction)
    if confirmed is not None and confirmed.launches > 1:
        best = next(r for r in recs if r.number == confirmed.trial)
        params = ", ".join(f"{k}={v}" for k, v in best.params.items())
        console.print(f"[green]best[/] (confirmed over {confirmed.launches} launches, spread "
                      f"{confirmed.spread:.1%}): trial {best.number}, {space.objective.scored_by}="
                      f"{confirmed.reported:.1f} ({_reported_from(confirmed)}) at C={space.target_level}  "
                      f"{escape('[' + params + ']')}")
    elif best is not None:
        params = ", ".join(f"{k}={v}" for k, v in best.params.items())
        sim = " (simulated)" if best.simulated else ""
        console.print(f"[green]best[/]: trial {best.number}, {space.objective.scored_by}={best.value:.1f}{sim} "
                      f"at C={space.target_level}  {escape('[' + params + ']')}")
    else:
        console.print("[yellow]no COMPLETE trial yet[/]")
    if summary.report_path is not None:
        name = summary.study.study_name
        if summary.report_html_path is not None:
            console.print(f"morning summary: {summary.report_html_path} and {summary.report_path.name} (again "
                          f"any time: servetune report --study {name} --format html)", soft_wrap=True)
        else:
            console.print(f"morning summary: {summary.report_path} (again any time: servetune report --study {name})")


def summary_table(records: list[TrialFacts], metric: str) -> Table:
    """One row per trial, one column per searched knob."""
    knobs: list[str] = []
    for rec in records:
        knobs += [k for k in rec.params if k not in knobs]
    simulated = any(r.simulated for r in records)
    table = Table(title="servetune trials" + (" (simulated host: every figure is simulated)" if simulated else ""))
    # The trial's number, state and value never break; knob values and reasons wrap at their spaces.
    for col in ("#", "state"):
        table.add_column(col, no_wrap=True)
    for col in ("outcome", metric, *(_short(k) for k in knobs), "free after capture"):
        table.add_column(col, overflow="fold")
    for rec in records:
        free = rec.free_after_capture_gib
        style = {TrialState.COMPLETE: "green", TrialState.PRUNED: "yellow", TrialState.FAIL: "red"}.get(
            rec.state, "")
        outcome = rec.label + (f" ({rec.phase.value})" if rec.phase and rec.state != TrialState.COMPLETE else "")
        table.add_row(
            str(rec.number),
            Text(rec.state.name, style=style),
            outcome,
            f"{rec.value:.1f}" if rec.value is not None else "-",
            *(_value(rec.params.get(k, "-")) for k in knobs),
            f"{free:.2f} GiB" if free is not None else "-",
        )
    return table


def status_view(status: StudyStatus) -> Group:
    """``servetune status`` for a terminal: a head line, the trial counts, the hosts and the running trials."""
    from search.report import format_duration

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
        f"  value {best.value:.1f}{sim}" if best.value is not None else "",
        f"  free after capture {best.free_after_capture_gib:.2f} GiB"
        if best.free_after_capture_gib is not None else "",
        "  [" + ", ".join(f"{_short(k)}={_value(v)}" for k, v in best.params.items()) + "]",
    )
    counts = Table(title="trials", box=None, padding=(0, 2))
    keys = ("complete", "pruned", "failed", "running", "waiting", "oom", "total")
    for key in keys:
        counts.add_column(key, justify="right")
    counts.add_column("budget", justify="right")
    counts.add_row(*(str(getattr(trials, k)) for k in keys), str(status.n_trials or "-"))
    hosts = Table(title="hosts", box=None, padding=(0, 2))
    for col in ("host", "state", "trial", "done", "last outcome"):
        hosts.add_column(col)
    for name, host in status.hosts.items():
        done = f"{host.complete} ok / {host.pruned} pruned / {host.failed} failed"
        hosts.add_row(name, host.state, str(host.trial) if host.trial is not None else "-", done,
                      host.last_outcome or "-")
    parts: list[Any] = [head, best_line, counts]
    if status.hosts:
        parts.append(hosts)
    return Group(*parts)


def _reported_from(confirmed: Confirmed) -> str:
    """Which launches the confirmed figure is the median of."""
    if confirmed.final:
        return f"median of the {confirmed.final} launches made after it was chosen"
    return "median of the repeats"
