"""The library call behind ``servetune run`` (and ``make demo``): :func:`run_study`.

It does the wiring a search needs around :func:`search.driver.run.run_search`: the hosts (``--host``, an
inventory, or this machine), MLflow tracking, the dashboard notes and figures, the live progress, and the
morning summary (Markdown and HTML) written at the end. The CLI parses, calls it and renders the
:class:`~search.driver.run.RunSummary`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from optuna.trial import FrozenTrial

from runners.errors import ConfigError, ServetuneError
from search.driver.hosts import build_groups, build_hosts
from search.driver.run import RunOptions, RunSummary, StopReason, StudyCallback, run_search
from search.outputs.figures import FiguresCallback
from search.outputs.html import Published, publish
from search.outputs.notes import notes_callback
from search.outputs.tracking import MlflowCallback, MlflowTracker
from search.settings import Settings
from search.settings import study_name as check_study_name
from search.storage import artifact_store, redact
from search.strategy.confirm import CONFIRM_FINAL, CONFIRM_K, CONFIRM_REPEATS
from search.strategy.view import StudyView
from search.trial.objective import TrialEvent
from spaces.schema import Space

__all__ = ["Progress", "RunPlan", "run_study"]


class Progress(Protocol):
    """What watches a run live (the CLI's terminal view): trial events, finished trials, entered around the run."""

    n_trials: int | None

    def hook(self, number: int, event: TrialEvent) -> None: ...

    def callback(self, view: StudyView, trial: FrozenTrial) -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> None: ...


@dataclass(frozen=True)
class RunPlan:
    """What a run is about to do (given to ``on_start`` once the hosts are open)."""

    study: str
    hosts: list[str]
    storage: str
    n_trials: int | None
    timeout: float | None
    warnings: tuple[str, ...] = ()
    """What the run goes on without (e.g. an unusable MLflow), one line each."""


def run_study(space: Space, settings: Settings, *, study_name: str | None = None, n_trials: int | None = None,
              timeout: float | None = None, hosts: Sequence[str] = (), inventory: Path | None = None,
              accept_new_host_key: bool = False, mlflow: bool = True, seed: int | None = None,
              cooldown: float = 300.0, progress: Progress | None = None,
              on_start: Callable[[RunPlan], None] | None = None, confirm_k: int = CONFIRM_K,
              confirm_repeats: int = CONFIRM_REPEATS, confirm_final: int = CONFIRM_FINAL,
              warm_start: Sequence[str] = (), early_stop: bool = True) -> RunSummary:
    """Run (or resume) the study of ``space`` until its budget, its timeout or a signal.

    ``study_name``, ``n_trials`` and ``timeout`` default to the space's. ``hosts`` are ``user@name[:port]``
    arguments; with neither them nor an ``inventory`` the search runs on this machine. ``progress`` gets
    the trial events and results (its budget is set here); the dashboard figures are redrawn after each
    trial. Before the study ends, the ``confirm_k`` best distinct configurations are launched
    ``confirm_repeats`` more times each, and the one chosen on them ``confirm_final`` more times: its
    reported figure is the mean of those (:mod:`search.strategy.confirm`; in a ``pareto`` study, those of the front
    nearest its ideal point are repeated, :mod:`search.strategy.front`). ``warm_start`` names earlier studies in
    the same storage to start from (``auto``: all on the same cards, model, engine version and fixed args;
    :mod:`search.strategy.warm`). ``early_stop``: a search launch whose target level's first requests show it
    cannot beat the best stops its benchmark there (:mod:`search.trial.early`). The morning summary is written to
    ``<artifacts>/<study>/report.md`` and ``report.html`` (``RunSummary.report_path``, ``report_html_path``;
    the HTML is also a study artifact and is logged with the figures to the MLflow parent run); an MLflow
    failure at the end is reported in ``RunSummary.mlflow_error``, never raised. Raises ServetuneError for
    bad input or an
    unusable storage or host.
    """
    name = check_study_name(space.name if study_name is None else study_name)
    budget = n_trials if n_trials is not None else space.budget.n_trials
    seconds = timeout if timeout is not None else space.budget.timeout
    opened = build_hosts(space, host_args=hosts, inventory=inventory, runs_root=settings.runs_root,
                         sim_dir=settings.sim_dir, accept_new_host_key=accept_new_host_key,
                         host_dir=settings.host_dir)
    groups = build_groups(inventory, opened)
    callbacks: list[StudyCallback] = []
    warnings: list[str] = []
    tracker, mlflow_callback = _tracking(settings, name, warnings) if mlflow else (None, None)
    if mlflow_callback is not None:
        callbacks.append(mlflow_callback)
    callbacks.append(notes_callback())
    figures_callback = FiguresCallback(background=True)
    callbacks.append(figures_callback)
    if progress is not None:
        progress.n_trials = budget
        callbacks.append(progress.callback)
    options = RunOptions(
        study_name=name, storage_url=settings.storage, artifacts_dir=settings.artifacts_dir,
        n_trials=budget, timeout=seconds, seed=seed, smi_interval=settings.smi_interval, cooldown=cooldown,
        heartbeat_interval=settings.heartbeat_interval, grace_period=settings.heartbeat_grace,
        storage_retry=settings.storage_retry, callbacks=callbacks, hook=progress.hook if progress is not None else None,
        confirm_k=confirm_k, confirm_repeats=confirm_repeats, confirm_final=confirm_final,
        warm_start=tuple(warm_start), early_stop=early_stop,
    )
    if on_start is not None:
        on_start(RunPlan(name, [h.name for h in opened], redact(settings.storage), budget, seconds, tuple(warnings)))
    try:
        if progress is not None:
            with progress:
                summary = run_search(space, opened, options, groups=groups)
        else:
            summary = run_search(space, opened, options, groups=groups)
    finally:
        figures_callback.close()
        for host in opened:
            host.close()
    published: Published | None = None
    # The disk that refused a trial's files (StopReason.ARTIFACTS) would refuse the report too.
    if summary.stopped_by is not StopReason.ARTIFACTS:
        try:
            published = publish(summary.view, settings.artifacts_dir / name,
                                artifact_store=artifact_store(settings.artifacts_dir))
            summary.report_path, summary.report_html_path = published.markdown, published.html
        except ConfigError as exc:
            summary.report_error = str(exc)
        except Exception as exc:  # the report is a convenience: every result is in the study already
            summary.report_error = f"report not written ({type(exc).__name__}: {exc})"
    if tracker is not None and mlflow_callback is not None:
        try:
            # Back-fills first if an outage broke the trials' logging; then the parent run is FINISHED.
            tracker.end_run(summary.view, mlflow_callback, figures=published.figures if published else None,
                            report=published.html if published else None)
        except ServetuneError as exc:
            summary.mlflow_error = str(exc)
    return summary


def _tracking(settings: Settings, name: str, warnings: list[str]) -> tuple[MlflowTracker | None,
                                                                          MlflowCallback | None]:
    """The MLflow tracker and its trial callback, checked once for the run: an MLflow that cannot be
    written is left out (with one line in ``warnings``) instead of costing every trial its retries."""
    tracker = MlflowTracker(settings.mlflow_uri, optuna_artifact_store=artifact_store(settings.artifacts_dir))
    try:
        tracker.check(name)
    except ServetuneError as exc:
        warnings.append(f"mlflow: {exc}; this run does not log to MLflow "
                        f"(back-fill later with `servetune sync-mlflow --study {name}`)")
        return None, None
    return tracker, tracker.callback(background=True)
