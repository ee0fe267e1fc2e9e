"""optuna-dashboard notes: one per trial, with outcome, memory figures, levels and the OOM lines."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from optuna_dashboard._note import get_note_from_system_attrs

from search._optuna_compat import storage_of, study_id, trial_id
from search.outputs import notes
from search.outputs.notes import note_markdown, notes_callback, oom_lines, write_note
from search.strategy.view import StudyView
from tests.fixtures.trials import OOM_CUDA_GRAPH_TAIL, level, make_trial, optuna_callback

REPO = Path(__file__).resolve().parents[2]


def read_note(study: optuna.Study, number: int) -> str:
    # NOTE: get_note() wants a live optuna.Trial; read the stored note the way the dashboard does.
    attrs = storage_of(study).get_study_system_attrs(study_id(study))
    return str(get_note_from_system_attrs(attrs, trial_id(study.trials[number]))["body"])


def test_oom_note(study: optuna.Study) -> None:
    write_note(study, study.trials[2])
    body = read_note(study, 2)
    assert body.startswith("## Trial 2: PRUNED, oom in cuda_graph\n")
    assert "**outcome** `oom` · **phase** `cuda_graph` · host `gpu-a`" in body
    assert "> CUDA out of memory in cuda_graph: tried to allocate 3.94 GiB with 2.80 GiB free" in body
    assert "| OOM: tried to allocate (GiB) | 3.94 |" in body
    assert "| OOM: free at the time (GiB) | 2.80 |" in body
    assert "| OOM phase | cuda_graph |" in body
    section = body.split("### OOM lines from the log tail", 1)[1]
    assert "Capture cuda graph failed: CUDA out of memory. Tried to allocate 3.94 GiB." in section
    assert "torch.OutOfMemoryError" in section
    assert "Load weight end" not in section and "Received sigquit" not in section
    # Levels: none ran.
    assert "### Results per concurrency level" not in body


def test_complete_note_and_rewrite(study: optuna.Study) -> None:
    write_note(study, study.trials[1])
    write_note(study, study.trials[1])  # a second save replaces the note
    body = read_note(study, 1)
    assert body.count("## Trial 1: COMPLETE") == 1
    assert "**value** 2400" in body and "sglang 0.5.23" in body
    assert "**Thin headroom:** 0.82 GiB free after CUDA graph capture" in body
    assert "| free after CUDA graph capture (GiB) | 0.82 |" in body
    assert "| 16 | 2400.0 | 9.38 | 640.0 | 1440.0 | 9.0 | 17.0 | 64 | 0 |" in body
    assert "### OOM lines" not in body


def test_failed_note_without_telemetry(study: optuna.Study) -> None:
    body = note_markdown(study.trials[4])
    assert body.startswith("## Trial 4: FAIL, host_busy\n")
    assert "> GPU 0 on gpu-b is busy" in body
    assert "### Memory" not in body


def test_oom_lines_split_progress_fragments() -> None:
    tail = "Capturing batches (bs=8 avail_mem=1.0 GB)\rCUDA out of memory. Tried to allocate 2 GiB\nok line"
    assert oom_lines(tail) == ["CUDA out of memory. Tried to allocate 2 GiB"]
    last = oom_lines(OOM_CUDA_GRAPH_TAIL)[-1]
    assert last == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.94 GiB."


def test_callback_in_a_real_study(tmp_path: Path) -> None:
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'o.db'}", direction="maximize")

    def objective(trial: optuna.Trial) -> float:
        x = trial.suggest_float("mem_fraction_static", 0.6, 0.95)
        trial.set_user_attr("outcome", "ok")
        trial.set_user_attr("mem.free_after_capture_gib", 3.5)
        if trial.number == 1:
            trial.set_user_attr("outcome", "oom")
            trial.set_user_attr("phase", "decode")
            trial.set_user_attr("log_tail", "Decode out of memory. Try to lower your batch size.")
            raise optuna.TrialPruned("oom in decode")
        return x

    study.optimize(objective, n_trials=2, callbacks=[optuna_callback(notes_callback())])
    assert "## Trial 0: COMPLETE" in read_note(study, 0)
    assert "Decode out of memory." in read_note(study, 1)


def test_callback_never_raises(study: optuna.Study, monkeypatch: pytest.MonkeyPatch,
                               caplog: pytest.LogCaptureFixture) -> None:
    def broken(*_: object) -> None:
        raise RuntimeError("storage went away")

    monkeypatch.setattr(notes, "save_note", broken)
    callback = notes_callback()
    with caplog.at_level(logging.DEBUG, logger="search.outputs.notes"):
        callback(StudyView.of(study), study.trials[0])
        callback(StudyView.of(study), study.trials[1])
    assert callback.failures == 2
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "storage went away" in warnings[0].getMessage()


def test_notes_and_figures_are_saved_without_the_dashboards_web_app(tmp_path: Path) -> None:
    """``import optuna_dashboard`` loads its web app and scikit-learn (about 160 MB of the controller's memory):
    a note, the study's note of the choice and a figure are stored with the two modules that write them,
    loaded alone."""
    code = (
        "import sys, optuna, plotly.graph_objects as go\n"
        "from search._optuna_compat import note_target\n"
        "from search.outputs.dashboard import save_note, save_plotly_graph_object\n"
        "from search.outputs.notes import write_choice_notes\n"
        "from search.strategy.view import StudyView\n"
        f"study = optuna.create_study(storage='sqlite:///{tmp_path}/s.db')\n"
        "study.optimize(lambda t: t.suggest_float('x', 0, 1), n_trials=1)\n"
        "save_note(note_target(study, study.trials[0]), 'a note')\n"
        "write_choice_notes(StudyView.of(study))\n"
        "save_plotly_graph_object(study, go.Figure(), graph_object_id='g')\n"
        "print(sorted(m for m in sys.modules if m.startswith(('optuna_dashboard', 'sklearn'))))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
    stored = optuna.load_study(study_name=None, storage=f"sqlite:///{tmp_path}/s.db")
    attrs = storage_of(stored).get_study_system_attrs(study_id(stored))
    assert any(key.startswith("dashboard:plot_data:") for key in attrs)
    assert get_note_from_system_attrs(attrs, None)["body"], "the study's note"


def test_an_oom_line_every_rank_logged_is_shown_once_with_its_ranks() -> None:
    tail = (REPO / "tests" / "data" / "logs" / "sim-capture-oom.log").read_text()
    lines = oom_lines(tail)
    torch_lines = [line for line in lines if line.startswith("torch.OutOfMemoryError")]
    assert len(torch_lines) == 1 and torch_lines[0].endswith("[on ranks 0\u20133]")
    assert len(lines) == len(set(lines))


def test_a_note_gives_the_value_with_its_metric_and_unit_and_memory_in_gib() -> None:
    trial = make_trial(state=TrialState.COMPLETE, mfs=0.8, cgbs=64, value=28.71, levels=[level(16, 28.71)],
                       memory={"smi_peak_used_mib": 80900.0, "sim_speed": 100, "engine_pool_gib": 1.5})
    body = note_markdown(trial)
    assert "**value** 28.7 tok/s (output_throughput at C=16)" in body
    assert "| nvidia-smi peak used (GiB) | 79.00 |" in body and "| sim speed | 100 |" in body
    assert "| engine pool (GiB) | 1.50 |" in body and "MiB" not in body
