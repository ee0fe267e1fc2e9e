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
from tests.fixtures.trials import build_study, make_trial
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
    assert "Why these were screened: The screening repeats the 3 configurations ranked best" in note


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
    from search.strategy.choice import SCREENING_RULE
    assert f"Why these were screened: {SCREENING_RULE}" in part  # the rule, once, in one sentence
    assert SCREENING_RULE.count(". ") == 0 and SCREENING_RULE.endswith(".")
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


def test_the_choice_returns_its_reasons_as_verdicts(view: StudyView) -> None:
    """``choose`` gives every launched configuration a typed verdict; the outputs render it, none re-derives it."""
    from search.strategy.choice import Reported, Verdict

    choice = view.choice
    assert choice is not None and choice.reported == Reported.FINAL_MEAN
    verdicts = {c.number: c.verdict for c in choice.candidates}
    assert verdicts == {0: Verdict.CHOSEN, 1: Verdict.REPEATED_LOWER, 2: Verdict.ONE_LAUNCH}
    assert [c.number for c in choice.candidates if c.screened] == [0, 1]
    repeat = view.record(4)  # a screening repeat of the chosen configuration
    assert repeat is not None and repeat.confirmation_of == 0
    launch_of = choice.candidate(repeat)
    assert launch_of is not None and launch_of.verdict == Verdict.LAUNCH_OF_CHOICE
    reason = why_not(view, repeat)
    assert reason is not None and reason.startswith("it is one launch (2230.0 tok/s) of the chosen configuration")
    assert choice.reported_text() == "mean of the 3 launches made after it was chosen"
    assert "mean of the 3 launches" in choice.why() and "median" not in choice.why()


def test_died_infeasible_and_within_noise_verdicts(tmp_path: Path) -> None:
    from search.strategy.choice import TieBreak, Verdict

    died = make_trial(state=TrialState.PRUNED, mfs=0.9, cgbs=256, outcome="oom", phase="decode", start_min=3)
    broke = launch(0.82, 64, 2600.0, 4)
    broke.system_attrs = {**broke.system_attrs, "constraints": (4.5,)}
    trials = [launch(0.80, 128, 2200.0, 0), launch(0.84, 64, 2190.0, 1), died, broke,
              launch(0.80, 128, 2210.0, 6, confirmation_of=0), launch(0.84, 64, 2215.0, 7, confirmation_of=1)]
    v = StudyView.of(build_study(f"sqlite:///{tmp_path / 'v.db'}", "verdicts", trials))
    choice = v.choice
    assert choice is not None
    got = {c.number: c for c in choice.candidates}
    assert got[2].verdict == Verdict.DIED and got[3].verdict == Verdict.INFEASIBLE
    other = 1 if choice.number == 0 else 0
    assert got[other].verdict in (Verdict.WITHIN_NOISE, Verdict.REPEATED_LOWER)
    if got[other].verdict == Verdict.WITHIN_NOISE:
        assert got[other].tie_break == TieBreak.POOLED  # neither forces an environment setting
    rec2, rec3 = v.record(2), v.record(3)
    assert rec2 is not None and rec3 is not None
    assert (why_not(v, rec2) or "").startswith("died on a launch: trial 2 (oom)")
    assert (why_not(v, rec3) or "").startswith("infeasible: it broke a limit (trial 3: ")
