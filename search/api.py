"""The library call behind ``servetune run`` (and ``make demo``): :func:`run_study`.

It does the wiring a search needs around :func:`search.driver.run.run_search`: the hosts (``--host``, an
inventory, or this machine), the run's outputs (:mod:`search.outputs.sink`: the dashboard notes and figures, the
morning summary in Markdown and HTML written at the end, MLflow tracking; the settings' ``outputs`` pick them),
and the live progress. The CLI parses, calls it and renders the :class:`~search.driver.run.RunSummary`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from optuna.trial import FrozenTrial

from search.driver.hosts import build_groups, build_hosts
from search.driver.run import RunOptions, RunSummary, StopReason, StudyCallback, run_search
from search.outputs.registry import factories
from search.outputs.sink import Publication, SinkContext, Sinks
from search.settings import Settings
from search.settings import study_name as check_study_name
from search.storage import redact
from search.strategy.confirm import CONFIRM_FINAL, CONFIRM_K, CONFIRM_REPEATS
from search.strategy.view import StudyView
from search.trial.objective import TrialEvent
from spaces.schema import Space

__all__ = ["Progress", "RunPlan", "run_study"]

log = logging.getLogger("servetune")


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
    outputs = factories(o for o in settings.outputs if mlflow or o != "mlflow")
    budget = n_trials if n_trials is not None else space.budget.n_trials
    seconds = timeout if timeout is not None else space.budget.timeout
    opened = build_hosts(space, host_args=hosts, inventory=inventory, runs_root=settings.runs_root,
                         sim_dir=settings.sim_dir, accept_new_host_key=accept_new_host_key,
                         host_dir=settings.host_dir)
    groups = build_groups(inventory, opened)
    warnings: list[str] = []
    sinks = Sinks.open(outputs, SinkContext(settings, name), warnings)
    callbacks: list[StudyCallback] = sinks.callbacks()
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
        sinks.close()
        for host in opened:
            host.close()
    done = sinks.publish(summary.view, Publication(settings.artifacts_dir / name, settings.artifacts_dir,
                                                   files_refused=summary.stopped_by is StopReason.ARTIFACTS))
    summary.report_path, summary.report_html_path = done.report_markdown, done.report_html
    summary.report_error = done.errors.pop("report", None)
    summary.mlflow_error = done.errors.pop("mlflow", None)
    for output, line in done.errors.items():  # an output the summary has no field for
        log.warning("%s: %s", output, line)
    return summary
