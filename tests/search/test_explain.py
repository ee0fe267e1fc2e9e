"""servetune's choice explained wherever it is shown: in a study where Optuna's best trial (trial 2, one lucky
launch, never repeated) is not the configuration chosen on its repeated launches (trial 0), the dashboard's
study note names trial 0 first and why, trial 2's note says why it is not the choice, the figure of the
screened configurations marks trial 0, the report has a "How the winner was chosen" table, and ``trials``
(table and ``--json``) gives each trial's role and marks the chosen one."""

from __future__ import annotations

import io
import json
import statistics
from pathlib import Path

import pytest
from optuna.trial import TrialState
from optuna_dashboard._custom_plot_data import get_plotly_graph_objects
from optuna_dashboard._note import get_note_from_system_attrs
from rich.console import Console

from search._optuna_compat import storage_of, study_id, trial_id
from search.cli.views import summary_table
from search.outputs.explain import (
    CHOICE_FIGURE_ID,
    choice_figure,
    optuna_best,
    screened,
    study_note_markdown,
    trial_rows,
    why_not,
)
from search.outputs.html import publish
from search.outputs.report import report_markdown
from search.strategy.choice import CHOICE_ATTR
from search.strategy.view import StudyView
from tests.fixtures.trials import build_study
from tests.search.test_one_choice import FINALS, launch

REPORTED = statistics.median(FINALS)


@pytest.fixture
def view(tmp_path: Path) -> StudyView:
    trials = [launch(0.80, 128, 2200.0, 0, probe=True), launch(0.84, 64, 2100.0, 5, design=True),
              launch(0.86, 256, 2500.0, 10), launch(0.84, 64, 2050.0, 12, confirmation_of=1),
              launch(0.80, 128, 2230.0, 15, confirmation_of=0)]
    trials += [launch(0.80, 128, v, 20 + i, confirmation_of=0, final=True) for i, v in enumerate(FINALS)]
    return StudyView.of(build_study(f"sqlite:///{tmp_path / 's.db'}", "explain", trials))


def test_roles_and_the_chosen_trial(view: StudyView) -> None:
    rows = trial_rows(view)
    assert [r["role"] for r in rows] == ["probe", "design", "search", "screening", "screening", "final", "final",
                                         "final"]
    assert [r["number"] for r in rows if r["chosen"]] == [0]
    assert list(rows[0])[:5] == ["number", "state", "outcome", "role", "chosen"]
    json.dumps(rows, default=str)  # what `trials --json` prints
    console = Console(file=io.StringIO(), width=160)
    console.print(summary_table(view.records, "output_throughput", width=160, chosen=0))
    lines = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert any(line.split()[:1] == ["0"] and "probe CHOSEN" in line for line in lines)
    assert any(line.split()[:1] == ["2"] and "search" in line and "CHOSEN" not in line for line in lines)


def test_why_optunas_best_is_not_the_choice(view: StudyView) -> None:
    best = optuna_best(view)
    assert best is not None and best.number == 2 and view.choice is not None and view.choice.number == 0
    reason = why_not(view, best)
    assert reason is not None and reason.startswith("one launch, never repeated: 2500.0 tok/s is a single draw")
    assert why_not(view, view.choice.record) is None
    # Trial 1 was repeated and came out lower than the choice's median over the launches it was chosen on.
    one = view.record(1)
    assert one is not None
    assert why_not(view, one) == ("repeated lower: its 2 launches gave 2100.0, 2050.0 (median 2075.0 tok/s); the "
                                  "choice's median over the launches it was chosen on is 2215.0 tok/s.")
    rows = screened(view)
    assert [(s.number, s.chosen) for s in rows] == [(0, True), (2, False), (1, False)]
    assert rows[0].values == [2200.0, 2230.0, *FINALS]


def test_study_note_names_the_choice_first(view: StudyView) -> None:
    note = study_note_markdown(view)
    first_heading = next(line for line in note.splitlines() if line.startswith("## "))
    assert first_heading == f"## Trial 0: `output_throughput` **{REPORTED:.1f} tok/s** at concurrency 16"
    assert "## How the winner was chosen" in note
    assert "Optuna's best trial (optuna-dashboard's *Best Trial* card) is **trial 2** (2500.0 tok/s), not the " \
           "choice: one launch, never repeated" in note
    assert "| #0 (chosen) | #0 2200.0 (probe); #4 2230.0 (screening); #5 2150.0 (final)" in note


def test_figure_marks_the_choice_and_shows_every_launch(view: StudyView) -> None:
    fig = choice_figure(view)
    assert fig.layout.title.text.startswith(f"servetune's choice: trial 0, {REPORTED:.1f} tok/s")
    star = next(t for t in fig.data if t.name == "servetune's choice (reported)")
    assert list(star.x) == [REPORTED] and star.y[0].startswith("★ #0")
    launches = [x for t in fig.data if t.mode == "markers" and t.name in (
        "search launch", "screening repeat", "launched after the choice (reported)") for x in t.x]
    assert sorted(launches) == sorted([2200.0, 2230.0, *FINALS, 2100.0, 2050.0, 2500.0])
    medians = next(t for t in fig.data if t.name == "median")
    assert len(medians.x) == 2  # the configurations launched more than once


def test_report_says_how_the_winner_was_chosen(view: StudyView) -> None:
    text = report_markdown(view)
    part = text.split("## How the winner was chosen\n", 1)[1].split("\n## ", 1)[0]
    assert part.lstrip().startswith("servetune chose **trial 0**: confirmed on 5 launches")
    assert "| #2 | #2 2500.0 (search) | 2500.0 | - |" in part
    assert "not chosen: one launch, never repeated |" in part
    assert text.index("## Verdict") < text.index("## How the winner was chosen") < text.index("## Trials")


def test_publish_writes_the_notes_and_the_figure(view: StudyView, tmp_path: Path) -> None:
    publish(view, tmp_path / "out")
    study = view.study
    attrs = storage_of(study).get_study_system_attrs(study_id(study))
    study_note = get_note_from_system_attrs(attrs, None)["body"]
    assert study_note == study_note_markdown(view)
    assert CHOICE_FIGURE_ID in get_plotly_graph_objects(attrs)
    assert study.user_attrs[CHOICE_ATTR].startswith(f"trial 0: {REPORTED:.1f}")
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    lucky = get_note_from_system_attrs(attrs, trial_id(trials[2]))["body"]
    assert "**Not servetune's choice** (Optuna calls it the best trial" in lucky
    assert "one launch, never repeated" in lucky
    chosen = get_note_from_system_attrs(attrs, trial_id(trials[0]))["body"]
    assert "**servetune's choice**" in chosen
    assert trials[2].state == TrialState.COMPLETE
