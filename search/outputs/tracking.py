"""MLflow tracking: one experiment per study, a parent run for the study, a child run per finished trial.

Only :class:`mlflow.MlflowClient` with explicit experiment and run ids is used, never MLflow's fluent API (it
keeps a process-wide active run). mlflow is imported on first use: it takes a second or more to import, and
``servetune --help`` must stay fast.

What a child run holds (read from the trial record, :mod:`search.trial.records`):

* params: every searched knob (the trial's params), ``fixed_args``, ``engine``, ``engine_version``, ``host``,
  ``gpu_name``, ``gpu_count``, ``model_path``, the workload's settings (``workload.<name>``) and the memory
  figures that are settings or constants (``mem.<name>``, :data:`MEM_PARAMS`);
* metrics: each concurrency level's bench_serving figures named by their level (``c64.output_throughput``,
  ``c16.p99_tpot_ms``...; a level that served no request logs only ``cN.completed`` and ``cN.failed``), so
  a row of the runs table never mixes levels; the measured numeric ``mem.*`` figures, ``objective`` (COMPLETE only;
  again as ``Objective.c64.output_throughput_tok_s``, which MLflow's table shows first: :data:`OBJECTIVE_PREFIX`),
  ``level_reached``. Units are in the names (``_ms``, ``_gib``, ``_s``) or, for throughputs, in the
  experiment's description (:data:`METRIC_UNITS`);
* tags: ``servetune.study``, ``servetune.trial``, ``servetune.state``, ``servetune.outcome``, ``servetune.role``,
  ``servetune.phase``, ``servetune.oom_phase``, ``engine``, ``servetune.simulated`` (true for every trial of a
  study on the simulated host, skips included), ``mlflow.parentRunId``, ``mlflow.note.content`` (the trial's
  note, shown as the run's description);
* artifacts: the files of the trial's ``artifacts_dir``, or, when that directory is gone, the same files
  fetched from Optuna's artifact store by the ids in ``artifact_ids``; and ``trial.json``
  (:data:`RECORD_ARTIFACT`, :func:`record_document`): the trial's whole record, Optuna's facts of the trial and
  the ``servetune.facts`` system attr, as one JSON file to read or download, where no page has to show it.

How the MLflow 3 UI opens it. MLflow 3.17's UI decides between its GenAI view and its "Model training" view from
the ``workflowType`` URL parameter, else the browser's stored choice, else GenAI: the experiment tag
``mlflow.experimentKind`` is read only when the UI's workflow-based navigation is off, and in 3.17 it is
hard-wired on (read in the UI bundle of the mlflow 3.17.2 wheel, ``mlflow/server/js/build/static/js/main.*.js``:
the kind is derived from ``workflowType``, ``genai`` unless the URL or the browser says ``machine_learning``),
so a study opened by its plain URL lands on an empty GenAI overview. :func:`experiment_url` is the link servetune
prints: ``#/experiments/<id>/runs?viewStateShareKey=servetune&workflowType=machine_learning``. The share key
names an experiment tag (``mlflow.sharedViewState.servetune``, :data:`SHARED_VIEW`) holding the runs table's
view (the UI's own "share view" format): sorted by the objective, with the objective, the searched knobs, the
outcome and the role as columns, so they show without opening the column picker. The experiment keeps
``mlflow.experimentKind = custom_model_development`` for UIs that do read it, and
``mlflow.experiment.primaryMetric.name`` names the objective (:data:`TAG_PRIMARY_METRIC`).

Statuses: MLflow's run statuses are RUNNING, SCHEDULED, FINISHED, FAILED and KILLED; none says "pruned". A trial
that ran and died (an OOM, an NCCL error: Optuna's PRUNED) or hit infrastructure trouble (FAIL) is FAILED; a
COMPLETE trial and a configuration skipped as a predicted OOM (nothing was launched: the decision finished) are
FINISHED. KILLED, which reads as "someone stopped it", is never used. What happened is in the run's name
(``trial-14 oom``, ``trial-10 skipped``), the ``servetune.outcome`` and ``servetune.role`` tags (columns of the
shared view) and its description (``mlflow.note.content``: the trial's dashboard note).

Metrics are what a trial measured; what it was given (the workload's settings per level: ``burstiness``, ``seed``,
``random_range_ratio``, ``time_scale``, the request rate; the memory figures that are settings or constants of
the host and model: :data:`MEM_PARAMS`) are params, so MLflow's charts show only figures that can differ between
trials.
:meth:`MlflowTracker.finish_study` logs the study's figures (:mod:`search.outputs.figures`, plotly HTML with its
JavaScript inlined, so they open offline; the screened configurations' figure among them) and the HTML report to
the parent run, and the chosen configuration as its params (with ``choice.trial``) and its description.

Logging is idempotent: a trial's run is found by its ``servetune.trial`` tag and never logged twice, so the
study callback may fail (MLflow down) and :meth:`MlflowTracker.sync` back-fills later. A run left RUNNING by
an attempt that broke half-way is deleted and logged again. Two processes logging the same trial at the same
moment may still race; servetune logs from one callback per trial and ``sync`` is run by hand.

MLflow's errors (``MlflowException``, ``requests``, SQLAlchemy, ``OSError``) become one-line
:class:`~runners.errors.StudyError` here.
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import shlex
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

import optuna
from optuna.artifacts import download_artifact
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from runners.errors import ServetuneError, StudyError, first_line
from runners.telemetry import MemoryFigures
from search.outputs.explain import study_note_markdown
from search.outputs.notes import note_markdown
from search.outputs.sink import Publication, SinkContext, SinkUnavailable
from search.outputs.status import study_status
from search.settings import DEFAULT_TRACKING_URI
from search.storage import artifact_store, redact, sqlite_file
from search.strategy.view import StudyView
from search.trial.records import FACTS_ATTR, MEM_PREFIX, TrialFacts
from spaces.schema import OBJECTIVE_UNITS

if TYPE_CHECKING:
    import plotly.graph_objects as go
    from mlflow import MlflowClient
    from mlflow.entities import Run

    from search._optuna_compat import ArtifactStore

__all__ = ["DEFAULT_ARTIFACT_ROOT", "DEFAULT_TRACKING_URI", "RECORD_ARTIFACT", "MlflowCallback", "MlflowSink",
           "MlflowTracker", "SyncResult", "experiment_url", "record_document", "run_name", "run_status",
           "shared_view", "simulated"]

logger = logging.getLogger(__name__)

DEFAULT_ARTIFACT_ROOT = "mlruns/artifacts"

TAG_STUDY = "servetune.study"
TAG_KIND = "servetune.kind"
TAG_TRIAL = "servetune.trial"
TAG_STATE = "servetune.state"
TAG_OUTCOME = "servetune.outcome"
TAG_PHASE = "servetune.phase"
TAG_OOM_PHASE = "servetune.oom_phase"
TAG_SIMULATED = "servetune.simulated"
TAG_REASON = "servetune.reason"
TAG_ARTIFACTS = "servetune.artifacts"
TAG_PARENT = "mlflow.parentRunId"
#: MLflow 3's UI reads this experiment tag to choose its view; this value is the classic (runs) one.
TAG_EXPERIMENT_KIND = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
TAG_DESCRIPTION = "mlflow.note.content"
#: The child run's artifact holding the trial's whole record (:func:`record_document`).
RECORD_ARTIFACT = "trial.json"

#: Units of the metrics whose names do not say them (shown in the experiment's description).
METRIC_UNITS = {
    "cN.output_throughput": "output tokens/s at concurrency N",
    "cN.input_throughput": "input tokens/s",
    "cN.total_throughput": "tokens/s (input + output)",
    "cN.request_throughput": "requests/s",
    "cN.*_ms": "milliseconds (TTFT, TPOT, ITL, end-to-end latency)",
    "cN.completed, cN.failed": "requests",
    "cN.duration": "seconds",
    "mem.*_gib": "GiB per GPU",
    "mem.*_mib": "MiB per GPU",
    "mem.kv_tokens, mem.max_total_num_tokens": "tokens",
    "objective": "the space's objective metric at its target level (its unit above)",
    "Objective.cN.<metric>_<unit>": "the objective again, named by its level and unit so it sorts first "
                                    "(tok_s: tokens/s, req_s: requests/s); Best.* on the parent run",
    "*_s": "seconds",
}

#: The objective is logged a second time under a name that starts with a capital letter: MLflow's runs table
#: orders metric columns by JavaScript's default sort (code units: capitals before lowercase; MLflow 3.17's
#: ``experimentRunsSelector``: ``metricKeyList: Array.from(keys).sort()``), and no server-side setting chooses
#: the columns an experiment opens with, so this is how the objective comes first.
OBJECTIVE_PREFIX = "Objective"
#: The experiment tag MLflow's UI reads for the primary metric (its chart comes first in the charts view; without
#: the tag the UI takes the first metric key in that sort order). Set to the objective's name.
TAG_PRIMARY_METRIC = "mlflow.experiment.primaryMetric.name"
BEST_PREFIX = "Best"

#: Fail fast against an http tracking server: the callback runs inside the study loop, and ``sync``
#: back-fills whatever was missed. Set only where the environment does not already say otherwise.
HTTP_ENV_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "2"}

#: The view :func:`experiment_url` opens (an experiment tag ``mlflow.sharedViewState.<key>``).
SHARED_VIEW = "servetune"
TAG_SHARED_VIEW = f"mlflow.sharedViewState.{SHARED_VIEW}"
TAG_ROLE = "servetune.role"
#: Level figures that describe the request rather than measure the server: params ``workload.<name>``.
WORKLOAD_PARAMS = ("burstiness", "seed", "random_range_ratio", "time_scale", "request_rate", "dataset_name")
#: Memory figures that are settings (as the engine resolved them) or constants of the host and model: params.
MEM_PARAMS = (*MemoryFigures.settings(), "sim_speed")
#: Engines whose every trial is simulated, skips included (a skip launched nothing, so its record says nothing).
SIMULATED_ENGINES = ("sim",)
_FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
_MAX_PARAM = 6000
_MAX_TAG = 5000
_PAGE = 1000


@dataclass(frozen=True)
class SyncResult:
    """What :meth:`MlflowTracker.sync` did: runs ``added`` now, runs already ``present``."""

    added: int
    present: int


class MlflowTracker:
    """Logs a study's trials to MLflow (a local SQLite store by default, or an ``http://`` tracking server).

    ``artifact_root`` is where a new experiment keeps its artifacts: a path (made a ``file://`` URI) or a URI.
    For a local store it defaults to ``mlruns/artifacts``; for an http server the server's own default
    (``mlflow-artifacts:``, proxied) is used. ``optuna_artifact_store`` is where trial files are fetched from
    when their local ``artifacts_dir`` is gone.
    """

    def __init__(self, tracking_uri: str = DEFAULT_TRACKING_URI, artifact_root: str | None = None, *,
                 optuna_artifact_store: ArtifactStore | None = None) -> None:
        self.tracking_uri = tracking_uri
        self.remote = tracking_uri.startswith(("http://", "https://"))
        self.artifact_location = _artifact_location(artifact_root, remote=self.remote)
        self.optuna_artifact_store = optuna_artifact_store
        self._client_obj: MlflowClient | None = None
        self._experiments: dict[str, str] = {}
        self._primary: set[str] = set()
        """Experiments whose primary metric this tracker has set."""
        self._parents: dict[str, str] = {}
        self._views: set[str] = set()
        """Experiments whose shared view this tracker has written."""
        self._lock = threading.RLock()
        self._callbacks: list[MlflowCallback] = []

    # ---- public ------------------------------------------------------------------------------------

    def log_trial(self, study_name: str, trial: FrozenTrial) -> bool:
        """Log one finished trial as a child run; True if a run was added, False if it was already there
        (or the trial is not finished). Raises StudyError."""
        if trial.state not in _FINISHED:
            return False
        with self._lock, self._boundary(f"logging trial {trial.number} of study {study_name!r}"):
            experiment_id = self._experiment_id(study_name)
            existing = self._find_trial_run(experiment_id, trial.number)
            if existing is not None:
                if existing.info.status != "RUNNING":
                    return False
                self._discard_partial(existing)
            self._log(study_name, experiment_id, trial)
            return True

    def callback(self, *, background: bool = False) -> MlflowCallback:
        """An Optuna study callback that logs each finished trial and never raises.

        ``background=True`` logs on a worker thread so MLflow's latency stays off the trials' critical
        path; call :meth:`MlflowCallback.drain` before reading MLflow (``finish_study`` does).
        """
        callback = MlflowCallback(self, background=background)
        self._callbacks.append(callback)
        return callback

    def sync(self, study: optuna.Study) -> SyncResult:
        """Log every finished trial that MLflow lacks (``servetune sync-mlflow``). Raises StudyError."""
        name = study.study_name
        with self._lock, self._boundary(f"syncing study {name!r}"):
            experiment_id = self._experiment_id(name)
            logged: set[int] = set()
            for run in self._trial_runs(experiment_id):
                number = _int(run.data.tags.get(TAG_TRIAL))
                if number is None:
                    continue
                if run.info.status == "RUNNING":
                    self._discard_partial(run)
                else:
                    logged.add(number)
            added = present = 0
            for trial in study.get_trials(deepcopy=False, states=_FINISHED):
                if trial.number in logged:
                    present += 1
                    continue
                self._log(name, experiment_id, trial)
                logged.add(trial.number)
                added += 1
            return SyncResult(added=added, present=present)

    def finish_study(self, view: StudyView, *, figures: dict[str, go.Figure] | None = None,
                     report: Path | None = None) -> None:
        """Mark the study's parent run FINISHED with summary metrics (counts, best value), and log the
        ``figures`` (``figures/<id>.html``, self-contained) and the ``report`` file (``report/``) to it.

        Raises StudyError.
        """
        for callback in self._callbacks:
            callback.drain()
        name = view.name
        status = study_status(view)  # the figures of ``servetune status``
        counts, best = status.trials, status.best
        finished = counts.done
        now = _now_ms()
        from mlflow.entities import Metric, RunTag

        metrics = [
            Metric("n_trials", float(counts.total), now, finished),
            Metric("n_complete", float(counts.complete), now, finished),
            Metric("n_pruned", float(counts.pruned), now, finished),
            Metric("n_failed", float(counts.failed), now, finished),
            Metric("n_running", float(counts.running), now, finished),
            Metric("n_oom", float(counts.oom), now, finished),
        ]
        tags = [RunTag("servetune.direction", status.direction)]
        if best is not None and best.value is not None:
            metrics.append(Metric("best_value", float(best.value), now, finished))
            best_rec = view.choice.record if view.choice is not None else None
            if best_rec is not None:
                metrics.append(Metric(objective_key(best_rec, prefix=BEST_PREFIX), float(best.value), now,
                                      finished))
            tags.append(RunTag("servetune.best_trial", str(best.number)))
            # A pareto study: "best" is the knee of the front; its figures per metric as well.
            for metric, value in zip(view.goal.metrics, best.values or (), strict=False):
                metrics.append(Metric(f"knee.{metric}", float(value), now, finished))
            if best.free_after_capture_gib is not None:
                metrics.append(Metric("best_free_after_capture_gib", best.free_after_capture_gib, now,
                                      finished))
        choice = view.choice
        chosen: dict[str, str] = {}
        if choice is not None:
            chosen = {"choice.trial": str(choice.number), **{k: _str(v) for k, v in choice.record.params.items()}}
            tags.append(RunTag(TAG_DESCRIPTION, _note(study_note_markdown(view))))
            if choice.value is not None and math.isfinite(choice.value):
                # In the objective's column of the runs table, the parent's row shows the reported figure.
                metrics.append(Metric(objective_key(choice.record), float(choice.value), now, finished))
        with self._lock, self._boundary(f"finishing study {name!r}"):
            client = self._client()
            experiment_id = self._experiment_id(name)
            parent = self._parent_run_id(name, experiment_id)
            client.log_batch(parent, metrics=metrics, tags=tags)
            if choice is not None:
                client.update_run(parent, name=f"{name} (choice: trial {choice.number})")
                client.set_experiment_tag(experiment_id, TAG_SHARED_VIEW, shared_view(
                    choice.record, parent, maximize=view.direction == StudyDirection.MAXIMIZE))
            self._log_choice_params(parent, chosen)
            for graph_id, figure in (figures or {}).items():
                # NOTE: MLflow writes plotly HTML that loads plotly.js from a CDN by default; inlined, the
                # figure also opens where the MLflow UI has no network.
                client.log_figure(parent, figure, f"figures/{graph_id}.html",
                                  save_kwargs={"include_plotlyjs": True})
            if report is not None:
                client.log_artifact(parent, str(report), "report")
            client.set_terminated(parent, "FINISHED", end_time=now)

    def _log_choice_params(self, parent: str, chosen: dict[str, str]) -> None:
        """The chosen configuration as the parent run's params (the searched knobs' own names, so the runs table
        shows them in the knob columns). MLflow never changes a param: a study resumed after a new choice keeps
        the first one's and says so in the tag ``servetune.choice_params``."""
        from mlflow.entities import Param, RunTag

        client = self._client()
        logged = client.get_run(parent).data.params
        new = [Param(k, v[:_MAX_PARAM]) for k, v in chosen.items() if k not in logged]
        stale = sorted(k for k, v in chosen.items() if k in logged and logged[k] != v[:_MAX_PARAM])
        for i in range(0, len(new), 100):
            client.log_batch(parent, params=new[i:i + 100])
        note = (f"params of an earlier choice (trial {logged.get('choice.trial')}); now trial "
                f"{chosen.get('choice.trial')}: see the description" if stale else "the current choice")
        client.log_batch(parent, tags=[RunTag("servetune.choice_params", note)])

    def end_run(self, view: StudyView, callback: MlflowCallback | None = None, *,
                figures: dict[str, go.Figure] | None = None, report: Path | None = None) -> None:
        """What a run does with MLflow at its end: when its trial logging broke (an MLflow outage), the trials
        MLflow lacks are back-filled first (it may be back by now), then the parent run is finished
        (:meth:`finish_study`), so an outage never leaves it RUNNING once MLflow answers again. Raises
        StudyError while MLflow is still down (``servetune sync-mlflow`` does both later)."""
        if callback is not None:
            callback.drain()
            if callback.broken:
                self.sync(view.study)
        self.finish_study(view, figures=figures, report=report)

    def check(self, study_name: str) -> None:
        """Make sure MLflow can record ``study_name`` now: its experiment and parent run exist (created if
        needed) and take a write. Quick: a local SQLite store that cannot be written fails at once instead of
        MLflow's own ~100 s of retries. Raises StudyError (one line); ``servetune run`` calls it once before
        the first trial and skips MLflow for the run when it fails."""
        from mlflow.entities import RunTag

        with self._lock, self._boundary(f"opening study {study_name!r}"):
            parent = self._parent_run_id(study_name, self._experiment_id(study_name))
            self._client().log_batch(parent, tags=[RunTag("servetune.checked_at", str(_now_ms()))])

    def experiment_id(self, study_name: str) -> str:
        """The study's experiment id (created on first use). Raises StudyError."""
        with self._lock, self._boundary(f"opening the experiment of study {study_name!r}"):
            return self._experiment_id(study_name)

    def trial_runs(self, study_name: str) -> dict[int, Run]:
        """The study's trial runs by trial number (the first found when there is more than one)."""
        with self._lock, self._boundary(f"listing the runs of study {study_name!r}"):
            out: dict[int, Run] = {}
            for run in self._trial_runs(self._experiment_id(study_name)):
                number = _int(run.data.tags.get(TAG_TRIAL))
                if number is not None:
                    out.setdefault(number, run)
            return out

    # ---- MLflow plumbing ---------------------------------------------------------------------------

    def _client(self) -> MlflowClient:
        if self._client_obj is None:
            if self.remote:
                for key, value in HTTP_ENV_DEFAULTS.items():
                    os.environ.setdefault(key, value)
            db = sqlite_file(self.tracking_uri)
            if db is not None:
                db.parent.mkdir(parents=True, exist_ok=True)
                _check_sqlite(db, self.tracking_uri)
            from mlflow import MlflowClient

            self._client_obj = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client_obj

    @contextmanager
    def _boundary(self, what: str) -> Iterator[None]:
        """Map MLflow's (and its transports') errors to a one-line StudyError."""
        try:
            yield
        except ServetuneError:
            raise
        except Exception as exc:
            if not _is_mlflow_error(exc):
                raise
            where = redact(self.tracking_uri)
            raise StudyError(f"MLflow at {where}: {what} failed: {_one_line(exc)}") from None

    def _experiment_id(self, name: str) -> str:
        cached = self._experiments.get(name)
        if cached is not None:
            return cached
        from mlflow.exceptions import MlflowException

        client = self._client()
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            try:
                experiment_id = client.create_experiment(
                    name, artifact_location=self.artifact_location, tags=_experiment_tags(name),
                )
            except MlflowException as exc:
                # NOTE: another controller of the same study may have created it a moment ago.
                if getattr(exc, "error_code", "") != "RESOURCE_ALREADY_EXISTS":
                    raise
                experiment = client.get_experiment_by_name(name)
                if experiment is None:
                    raise
                experiment_id = experiment.experiment_id
        elif experiment.lifecycle_stage == "deleted":
            raise StudyError(
                f"MLflow experiment {name!r} (id {experiment.experiment_id}) is deleted: restore it "
                f"(mlflow experiments restore -x {experiment.experiment_id}) or remove it (mlflow gc)"
            )
        else:
            experiment_id = experiment.experiment_id
            # An experiment made by an older servetune: give it the classic view and the units too.
            for key, value in _experiment_tags(name).items():
                if key not in experiment.tags:
                    client.set_experiment_tag(experiment_id, key, value)
        self._experiments[name] = experiment_id
        return experiment_id

    def _parent_run_id(self, name: str, experiment_id: str) -> str:
        cached = self._parents.get(name)
        if cached is not None:
            return cached
        client = self._client()
        found = client.search_runs([experiment_id], filter_string=f"tags.`{TAG_KIND}` = 'study'",
                                   max_results=1, order_by=["attributes.start_time ASC"])
        if found:
            run_id = found[0].info.run_id
        else:
            run = client.create_run(experiment_id, run_name=name, tags={TAG_STUDY: name, TAG_KIND: "study"})
            run_id = run.info.run_id
        self._parents[name] = run_id
        return run_id

    def _find_trial_run(self, experiment_id: str, number: int) -> Run | None:
        found = self._client().search_runs(
            [experiment_id],
            filter_string=f"tags.`{TAG_KIND}` = 'trial' and tags.`{TAG_TRIAL}` = '{number}'",
            max_results=10,
        )
        done = [run for run in found if run.info.status != "RUNNING"]
        runs = done or list(found)
        return runs[0] if runs else None

    def _trial_runs(self, experiment_id: str) -> Iterator[Run]:
        client = self._client()
        token: str | None = None
        while True:
            page = client.search_runs([experiment_id], filter_string=f"tags.`{TAG_KIND}` = 'trial'",
                                      max_results=_PAGE, page_token=token)
            yield from page
            token = page.token
            if not token:
                return

    def _discard_partial(self, run: Run) -> None:
        """A run left RUNNING by an attempt that broke half-way: delete it so the trial is logged whole."""
        logger.info("deleting partial MLflow run %s of trial %s", run.info.run_id,
                    run.data.tags.get(TAG_TRIAL))
        self._client().delete_run(run.info.run_id)

    def _log(self, study_name: str, experiment_id: str, trial: FrozenTrial) -> None:
        from mlflow.entities import Metric, Param, RunTag

        client = self._client()
        parent = self._parent_run_id(study_name, experiment_id)
        rec = TrialFacts.from_trial(trial)
        if experiment_id not in self._primary and rec.objective_metric:
            client.set_experiment_tag(experiment_id, TAG_PRIMARY_METRIC, objective_key(rec))
            self._primary.add(experiment_id)
        start = _ms(trial.datetime_start) or _now_ms()
        end = _ms(trial.datetime_complete) or start
        tags = _tags(study_name, rec)
        tags[TAG_PARENT] = parent
        if experiment_id not in self._views:
            client.set_experiment_tag(experiment_id, TAG_SHARED_VIEW, shared_view(rec, parent))
            self._views.add(experiment_id)
        tags[TAG_DESCRIPTION] = _note(note_markdown(trial))
        run = client.create_run(experiment_id, start_time=start, tags=tags, run_name=run_name(rec))
        run_id = run.info.run_id
        try:
            params = [Param(k, v) for k, v in _params(rec).items()]
            metrics = [Metric(k, v, end, step) for k, v, step in _metrics(rec)]
            # MLflow takes at most 100 params and 1000 entities per batch.
            for i in range(0, len(params), 100):
                client.log_batch(run_id, params=params[i:i + 100])
            for i in range(0, len(metrics), 1000):
                client.log_batch(run_id, metrics=metrics[i:i + 1000])
            note = self._log_artifacts(run_id, rec)
            client.log_text(run_id, json.dumps(record_document(trial), indent=2, sort_keys=False, default=str)
                            + "\n", RECORD_ARTIFACT)
            if note:
                client.log_batch(run_id, tags=[RunTag(TAG_ARTIFACTS, note)])
            client.set_terminated(run_id, run_status(rec), end_time=end)
        except BaseException:
            # NOTE: a half-logged run would hide the trial from ``sync``; remove it (best effort), and if that
            # fails too, the run stays RUNNING, which the next log_trial/sync treats as missing.
            with suppress(Exception):
                client.delete_run(run_id)
            raise

    def _log_artifacts(self, run_id: str, rec: TrialFacts) -> str:
        """Upload the trial's files; returns a note (tag ``servetune.artifacts``) when some are missing."""
        client = self._client()
        local = rec.artifacts_dir
        if local and Path(local).is_dir():
            files = sorted(p for p in Path(local).iterdir() if p.is_file())
            if files:
                for path in files:
                    client.log_artifact(run_id, str(path))
                return ""
        ids = rec.artifact_ids or {}
        if not ids:
            return "none recorded" if not local else f"{local} is gone and no artifact ids were recorded"
        if self.optuna_artifact_store is None:
            return f"{local} is gone; no Optuna artifact store given to fetch {len(ids)} file(s)"
        missing = []
        with tempfile.TemporaryDirectory(prefix="servetune-artifacts-") as tmp:
            for name, artifact_id in sorted(ids.items()):
                target = Path(tmp) / Path(str(name)).name
                try:
                    download_artifact(artifact_store=self.optuna_artifact_store, file_path=str(target),
                                      artifact_id=str(artifact_id))
                except Exception as exc:  # a lost file must not stop the rest of the trial's record
                    logger.warning("trial %d: artifact %s (%s) not fetched: %s", rec.number, name,
                                   artifact_id, _one_line(exc))
                    missing.append(str(name))
                    continue
                client.log_artifact(run_id, str(target))
        return f"missing: {', '.join(missing)}" if missing else ""


class MlflowCallback:
    """Study callback ``(view, frozen_trial) -> None`` that logs the trial and never raises.

    When logging a trial fails (MLflow unreachable or broken) it logs one warning (python ``logging``) and
    skips MLflow for every later trial of the run instead of trying again per trial (each try may cost
    seconds, or MLflow's own retries); nothing is lost, ``servetune sync-mlflow`` (``MlflowTracker.sync``)
    back-fills later. ``failures``: trials whose logging failed (at most one); ``skipped``: trials not tried.
    """

    def __init__(self, tracker: MlflowTracker, *, background: bool = False) -> None:
        self.tracker = tracker
        self.failures = 0
        self.skipped = 0
        self._broken = False
        self._queue: queue.Queue[tuple[str, FrozenTrial] | None] | None = None
        self._worker: threading.Thread | None = None
        if background:
            self._queue = queue.Queue()
            self._worker = threading.Thread(target=self._drain_forever, name="mlflow-logger", daemon=True)
            self._worker.start()

    def __call__(self, view: StudyView, trial: FrozenTrial) -> None:
        if self._queue is not None:
            self._queue.put((view.name, trial))
            return
        self._log(view.name, trial)

    def _drain_forever(self) -> None:
        assert self._queue is not None
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._log(*item)
            finally:
                self._queue.task_done()

    def drain(self) -> None:
        """Wait until every queued trial has been logged (or has failed to log)."""
        if self._queue is not None:
            self._queue.join()

    @property
    def broken(self) -> bool:
        """True once logging has failed: later trials are skipped (and the study's summary is not logged)."""
        return self._broken

    def _log(self, study_name: str, trial: FrozenTrial) -> None:
        if self._broken:
            self.skipped += 1
            return
        try:
            self.tracker.log_trial(study_name, trial)
        except Exception as exc:  # a tracking outage must never stop the study
            self.failures += 1
            self._broken = True
            logger.warning("MLflow logging failed at trial %d: %s; the study goes on without MLflow for this "
                           "run (back-fill later with `servetune sync-mlflow --study %s`)",
                           trial.number, _one_line(exc), study_name)


class MlflowSink:
    """MLflow tracking as a run's output (:mod:`search.outputs.sink`): each finished trial a child run, logged on
    a worker thread (:class:`MlflowCallback`); at the end, the trials an outage missed back-filled and the
    parent run finished with the report's figures and HTML (:meth:`MlflowTracker.end_run`)."""

    name = "mlflow"

    def __init__(self, tracker: MlflowTracker, callback: MlflowCallback) -> None:
        self.tracker = tracker
        self.callback = callback

    @classmethod
    def open(cls, context: SinkContext) -> MlflowSink:
        """The tracker and its trial callback, checked once for the run: an MLflow that cannot be written is
        :class:`~search.outputs.sink.SinkUnavailable` (one line) instead of costing every trial its retries."""
        settings, name = context.settings, context.study
        tracker = MlflowTracker(settings.mlflow_uri, optuna_artifact_store=artifact_store(settings.artifacts_dir))
        try:
            tracker.check(name)
        except ServetuneError as exc:
            raise SinkUnavailable(f"mlflow: {exc}; this run does not log to MLflow "
                                  f"(back-fill later with `servetune sync-mlflow --study {name}`)") from None
        return cls(tracker, tracker.callback(background=True))

    def on_trial(self, view: StudyView, trial: FrozenTrial) -> None:
        self.callback(view, trial)

    def close(self) -> None:
        pass  # the queue is drained when the parent run is finished (publish)

    def publish(self, view: StudyView, publication: Publication) -> None:
        """Back-fill first if an outage broke the trials' logging; then the parent run is FINISHED. Raises
        StudyError while MLflow is down (the run's summary says so)."""
        self.tracker.end_run(view, self.callback, figures=publication.figures, report=publication.report_html)


# ---- what a run holds ------------------------------------------------------------------------------


def record_document(trial: FrozenTrial) -> dict[str, Any]:
    """The trial's whole record, as the child run's :data:`RECORD_ARTIFACT`: Optuna's facts of the trial (number,
    state, value or values, params, times, user attrs) and, under :data:`~search.trial.records.FACTS_ATTR`,
    the record servetune wrote (read back through :meth:`TrialFacts.from_trial`, so a study written by an older
    release gives the same document)."""
    rec = TrialFacts.from_trial(trial)
    return {
        "number": trial.number,
        "state": trial.state.name,
        "values": trial.values,
        "params": rec.params,
        "datetime_start": trial.datetime_start.isoformat() if trial.datetime_start else None,
        "datetime_complete": trial.datetime_complete.isoformat() if trial.datetime_complete else None,
        "user_attrs": trial.user_attrs,
        FACTS_ATTR: rec.stored(),
    }


def _params(rec: TrialFacts) -> dict[str, str]:
    launch = rec.launch_config
    out: dict[str, str] = {str(k): _str(v) for k, v in rec.params.items()}
    extra: dict[str, Any] = {
        "engine": rec.engine or (launch.engine if launch else None),
        "engine_version": rec.engine_version,
        "host": rec.host,
        "gpu_name": rec.gpu_name,
        "gpu_count": rec.gpu_count,
        "model_path": launch.model_path if launch else None,
        "fixed_args": shlex.join(str(a) for a in launch.fixed_args) if launch and launch.fixed_args else None,
    }
    for key, value in extra.items():
        if value is not None and key not in out:
            out[key] = _str(value)
    for level in rec.levels[:1]:  # the workload's settings: the same at every level of a trial
        for key in WORKLOAD_PARAMS:
            value = level.figure(key)
            if value is not None:
                out[f"workload.{key}"] = _str(value)
    for key in MEM_PARAMS:
        value = rec.memory.figure(key)
        if _number(value):
            out[MEM_PREFIX + key] = _str(value)
    return {k: v[:_MAX_PARAM] for k, v in out.items()}


def _experiment_tags(name: str) -> dict[str, str]:
    units = "\n".join(f"| `{k}` | {v} |" for k, v in METRIC_UNITS.items())
    description = (f"servetune study `{name}`: one child run per trial, the parent run holds the figures and "
                   f"the report.\n\n| metric | unit |\n|---|---|\n{units}\n")
    return {TAG_STUDY: name, TAG_KIND: "study", TAG_EXPERIMENT_KIND: EXPERIMENT_KIND, TAG_DESCRIPTION: description}


def objective_key(rec: TrialFacts, *, prefix: str = OBJECTIVE_PREFIX) -> str:
    """The objective's metric name that MLflow's runs table shows first: ``Objective.c64.output_throughput_tok_s``
    (the level and the unit in the name; ``Best.`` for the parent run's best value)."""
    metric = rec.objective_metric or "value"
    level = f"c{rec.objective_level}." if rec.objective_level is not None else ""
    unit = OBJECTIVE_UNITS.get(metric)  # "tok/s": a slash would make a section of MLflow's charts
    return f"{prefix}.{level}{metric}" + (f"_{unit.replace('/', '_')}" if unit else "")


def _metrics(rec: TrialFacts) -> list[tuple[str, float, int]]:
    """(name, value, step) of a trial's metrics: per level ``c<N>.<bench_serving name>`` (a level that
    served no request has only its request counts: no throughput or latency was measured there)."""
    out: list[tuple[str, float, int]] = []
    for level in rec.levels:
        concurrency = level.max_concurrency
        served = (level.completed or 0) > 0
        for key, value in level.stored().items():
            if key == "max_concurrency" or key in WORKLOAD_PARAMS or not _number(value):
                continue
            if served or key in ("completed", "failed"):
                out.append((f"c{concurrency}.{key}", float(value), 0))
    for key, value in rec.memory.figures().items():
        if _number(value) and key not in MEM_PARAMS:
            out.append((MEM_PREFIX + key, float(value), 0))
    out += _objective_metrics(rec)
    for key, figure in (("level_reached", rec.level_reached), ("queue_s", rec.queue_s),
                        ("startup_s", rec.startup_s), ("stop_s", rec.stop_s)):
        if _number(figure):
            out.append((key, float(figure), 0))
    if rec.duration_s is not None:
        out.append(("duration_s", rec.duration_s, 0))
    return out


def _objective_metrics(rec: TrialFacts) -> list[tuple[str, float, int]]:
    """A COMPLETE trial's ``objective``; a pareto trial's values also under ``objective.<metric>``."""
    if rec.state != TrialState.COMPLETE:
        return []
    out = [("objective", float(rec.value), 0), (objective_key(rec), float(rec.value), 0)] \
        if rec.value is not None and math.isfinite(rec.value) else []
    named = zip(rec.objective_metrics or (), rec.values or (), strict=False)
    return out + [(f"objective.{name}", float(v), 0) for name, v in named if math.isfinite(v)]


def _tags(study_name: str, rec: TrialFacts) -> dict[str, str]:
    tags: dict[str, Any] = {
        TAG_STUDY: study_name,
        TAG_KIND: "trial",
        TAG_TRIAL: str(rec.number),
        TAG_STATE: rec.state.name,
        TAG_OUTCOME: rec.label,
        TAG_ROLE: rec.role,
        TAG_PHASE: rec.phase.value if rec.phase else None,
        TAG_OOM_PHASE: rec.oom_phase,
        TAG_REASON: rec.reason or None,
        TAG_SIMULATED: "true" if simulated(rec) else "false",
        "engine": rec.engine or (rec.launch_config.engine if rec.launch_config is not None else None),
        "servetune.duplicate_of": rec.duplicate_of,
        "servetune.retried_from": rec.retried_from,
    }
    return {k: _str(v)[:_MAX_TAG] for k, v in tags.items() if v is not None and v != ""}


def simulated(rec: TrialFacts) -> bool:
    """The trial belongs to a study on the simulated host: it ran there, or it is a skip of such a study."""
    engine = rec.engine or (rec.launch_config.engine if rec.launch_config is not None else None)
    return rec.simulated or engine in SIMULATED_ENGINES


def run_status(rec: TrialFacts) -> str:
    """The MLflow status that reads as what happened (see the module docstring): FINISHED for a COMPLETE trial
    and a skip, FAILED for a launch that died or infrastructure trouble; never KILLED."""
    if rec.state == TrialState.COMPLETE or rec.predicted_oom:
        return "FINISHED"
    return "FAILED"


def run_name(rec: TrialFacts) -> str:
    """``trial-<n>``, with what happened when it was not ``ok`` (``trial-14 oom``, ``trial-10 skipped``)."""
    if rec.predicted_oom:
        return f"trial-{rec.number} skipped (predicted OOM)"
    return f"trial-{rec.number}" + ("" if rec.ok else f" {rec.label}")


def shared_view(rec: TrialFacts, parent_run_id: str, *, maximize: bool | None = None) -> str:
    """The runs table's view that :func:`experiment_url` opens (JSON, the MLflow UI's shared-view format): sorted
    by the objective (best first), its columns the objective, the searched knobs, the outcome and the role, the
    parent run expanded."""
    objective = f"metrics.`{objective_key(rec)}`"
    columns = [objective, *(f"params.`{k}`" for k in rec.params), f"tags.`{TAG_OUTCOME}`", f"tags.`{TAG_ROLE}`",
               f"metrics.`{MEM_PREFIX}free_after_capture_gib`"]
    # Before the study's direction is at hand (the first trial's run), a latency objective is minimized.
    direction_max = maximize if maximize is not None else not (rec.objective_metric or "").endswith("_ms")
    state = {
        "searchFilter": "", "orderByKey": objective, "orderByAsc": not direction_max, "startTime": "ALL",
        "lifecycleFilter": "Active", "datasetsFilter": [], "modelVersionFilter": "All Runs",
        "selectedColumns": columns, "columnOrder": [], "columnWidths": {objective: 230},
        "runsExpanded": {parent_run_id: True}, "runsPinned": [parent_run_id], "runsHidden": [],
        "runsVisibilityMap": {}, "runsHiddenMode": "SHOW_ALL", "viewMaximized": False, "runListHidden": False,
        "isAccordionReordered": False, "useGroupedValuesInCharts": True, "hideEmptyCharts": True, "groupBy": None,
        "groupsExpanded": {}, "autoRefreshEnabled": True,
    }
    return json.dumps(state, separators=(",", ":"))


def experiment_url(ui_url: str, experiment_id: str) -> str:
    """The link to a study's runs table in MLflow 3's UI at ``ui_url``: the "Model training" view (not the GenAI
    overview), with the objective and the searched knobs as columns (:func:`shared_view`)."""
    return (f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs?viewStateShareKey={SHARED_VIEW}"
            "&workflowType=machine_learning")


def _note(markdown: str) -> str:
    if len(markdown) <= _MAX_TAG:
        return markdown
    return markdown[:_MAX_TAG - 80].rsplit("\n", 1)[0] + "\n\n(cut here: the whole note is in optuna-dashboard)\n"


# ---- small helpers ---------------------------------------------------------------------------------


def _artifact_location(root: str | None, *, remote: bool) -> str | None:
    if root is None:
        if remote:
            return None
        root = DEFAULT_ARTIFACT_ROOT
    if "://" in root or root.startswith("mlflow-artifacts:"):
        return root
    return Path(root).expanduser().resolve().as_uri()


def _check_sqlite(db: Path, uri: str) -> None:
    """Open ``db`` and take its write lock, or raise StudyError at once.

    NOTE: MLflow retries creating its SQLAlchemy engine ten times with exponential back-off (about 100 s in
    all, ``mlflow.store.db.utils.create_sqlalchemy_engine_with_retry``) when the database cannot be opened: a
    read-only directory, a file that is not a database. Checking with sqlite3 first costs a millisecond.
    """
    import sqlite3

    try:
        conn = sqlite3.connect(db, timeout=5)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise StudyError(f"MLflow at {uri}: {db} cannot be written: {exc}") from None


def _is_mlflow_error(exc: BaseException) -> bool:
    from mlflow.exceptions import MlflowException

    kinds: list[type[BaseException]] = [MlflowException, OSError]
    with suppress(ImportError):
        from requests import RequestException

        kinds.append(RequestException)
    with suppress(ImportError):
        from sqlalchemy.exc import SQLAlchemyError

        kinds.append(SQLAlchemyError)
    return isinstance(exc, tuple(kinds))


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for cause in ("Connection refused", "timed out", "Name or service not known", "No route to host"):
        if cause in text:
            return f"unreachable ({cause.lower()})"
    line = first_line(exc)
    return line if len(line) <= 240 else line[:237] + "..."


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _str(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _ms(when: datetime | None) -> int | None:
    return int(when.timestamp() * 1000) if when is not None else None


def _now_ms() -> int:
    return int(time.time() * 1000)
