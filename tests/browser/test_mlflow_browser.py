"""In a real browser against the real UI of the pinned MLflow (``mlflow server`` over the demo's store): the link
servetune prints opens the study's runs table in the "Model training" view (not the GenAI overview) with the
objective, the searched knobs and each trial's outcome as columns, sorted by the objective; a pruned trial's run
reads as what happened, with its note as the description; the parent run shows the chosen configuration and
its figure; every page fits 1440 px."""

from __future__ import annotations

import re
from typing import Any

import optuna
import pytest
from mlflow import MlflowClient

from search.outputs.explain import CHOICE_FIGURE_ID
from search.outputs.tracking import experiment_url, objective_key
from search.strategy.view import StudyView
from tests.fixtures.browser import DemoStudy, scroll_width
from tests.fixtures.mlflow_server import MlflowServer

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _experiment_id(mlflow_ui: MlflowServer, name: str) -> str:
    experiment = MlflowClient(mlflow_ui.url).get_experiment_by_name(name)
    assert experiment is not None
    return str(experiment.experiment_id)


def _run_id(mlflow_ui: MlflowServer, experiment_id: str, filter_string: str) -> str:
    runs = MlflowClient(mlflow_ui.url).search_runs([experiment_id], filter_string)
    assert len(runs) == 1, filter_string
    return str(runs[0].info.run_id)


def test_the_link_opens_the_runs_table_with_the_objective_and_knobs(demo: DemoStudy, study: optuna.Study,
                                                                   mlflow_ui: MlflowServer, page: Any) -> None:
    view = StudyView.of(study)
    assert view.choice is not None
    experiment_id = _experiment_id(mlflow_ui, demo.name)
    page.goto(experiment_url(mlflow_ui.url, experiment_id))
    grid = page.get_by_role("grid")
    grid.get_by_text("trial-0", exact=False).first.wait_for()
    # The "Model training" view's runs table, not the GenAI overview (which has no runs grid).
    assert page.get_by_role("heading", name="Runs").count() > 0
    # The grid renders the columns in view (it scrolls the rest in): the objective and the knobs come first.
    columns = page.locator('[role="columnheader"][col-id]').evaluate_all("els => els.map(e => e.getAttribute('col-id'))")
    objective = objective_key(view.choice.record)
    for column in (f"metrics.`{objective}`", *(f"params.`{k}`" for k in view.choice.record.params)):
        assert column in columns, (column, columns)
    # Sorted by the objective, best first: the first trial row is the best single launch.
    assert page.get_by_text(re.compile(rf"^Sort: {re.escape(objective)}")).count() == 1
    # What happened, not "Killed": the OOM trial's row is named after its outcome.
    assert grid.get_by_text("trial-0 oom").count() == 1
    assert page.get_by_text("Killed", exact=True).count() == 0
    assert scroll_width(page, fit=1440) <= 1440


def test_pruned_trial_run_reads_as_what_happened(demo: DemoStudy, mlflow_ui: MlflowServer, page: Any) -> None:
    experiment_id = _experiment_id(mlflow_ui, demo.name)
    run_id = _run_id(mlflow_ui, experiment_id, "tags.`servetune.trial` = '0'")
    page.goto(f"{mlflow_ui.url}/#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning")
    page.get_by_role("heading", name="trial-0 oom").wait_for()
    # Its description is the trial's note (the one optuna-dashboard shows).
    page.get_by_text(re.compile(r"Trial 0: PRUNED, oom in decode")).first.wait_for()
    body = page.locator("body").inner_text()
    assert "Failed" in body and "Killed" not in body
    assert scroll_width(page, fit=1440) <= 1440


def test_parent_run_holds_the_choice_and_its_figure(demo: DemoStudy, study: optuna.Study,
                                                   mlflow_ui: MlflowServer, page: Any) -> None:
    view = StudyView.of(study)
    assert view.choice is not None
    experiment_id = _experiment_id(mlflow_ui, demo.name)
    run_id = _run_id(mlflow_ui, experiment_id, "tags.`servetune.kind` = 'study'")
    page.goto(f"{mlflow_ui.url}/#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning")
    page.get_by_role("heading", name=f"{demo.name} (choice: trial {view.choice.number})").wait_for()
    page.get_by_text(f"servetune's choice for {demo.name}").first.wait_for()
    params = page.locator("body").inner_text()
    assert "choice.trial" in params
    assert scroll_width(page, fit=1440) <= 1440
    page.goto(f"{mlflow_ui.url}/#/experiments/{experiment_id}/runs/{run_id}/artifacts?workflowType=machine_learning")
    page.get_by_text("figures", exact=True).first.click()
    page.get_by_text(f"{CHOICE_FIGURE_ID}.html", exact=True).first.wait_for()
