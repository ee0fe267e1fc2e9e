"""optuna-dashboard notes: one Markdown note per finished trial, saved in the study's storage.

The note says what happened (outcome, phase, reason), the memory figures, the per-level results and the OOM
lines of the server's log tail, so a trial can be read in the dashboard without opening its files. Notes are
written from a study callback (:func:`notes_callback`) that never raises: a note is a convenience, the study
must go on without it.
"""

from __future__ import annotations

import logging
import re
import textwrap

import optuna
from optuna.trial import FrozenTrial

from search._optuna_compat import note_target
from search.outputs.dashboard import save_note
from search.outputs.explain import optuna_best, study_note_markdown, why_not
from search.outputs.sink import Publication, SinkContext
from search.outputs.text import THIN_HEADROOM_GIB, figure_text, fmt, levels_table, memory_table, unit
from search.strategy.choice import CHOICE_ATTR, NO_CHOICE_YET
from search.strategy.view import StudyView
from search.trial.records import TrialFacts

#: Characters per line of a log line quoted in a trial's note: the dashboard shows a code block unwrapped, so a
#: 700-character OOM line would make the trial page thousands of pixels wide.
LOG_WIDTH = 100

__all__ = ["LOG_WIDTH", "NotesCallback", "NotesSink", "note_markdown", "notes_callback", "oom_lines",
           "write_choice_notes", "write_note"]

logger = logging.getLogger(__name__)

_OOM_LINE = re.compile(
    r"out of memory|OutOfMemoryError|Tried to allocate|CUBLAS_STATUS_ALLOC_FAILED|Not enough memory"
    r"|Memory pool size is too small|leave no GPU memory|alloc_req_slots|\bOOM\b",
    re.IGNORECASE,
)
_MAX_OOM_LINES = 20


def write_note(study: optuna.Study, trial: FrozenTrial, view: StudyView | None = None) -> None:
    """Save (replace) the trial's dashboard note (with ``view``: saying whether it is servetune's choice)."""
    save_note(note_target(study, trial), note_markdown(trial, view))


def write_choice_notes(view: StudyView) -> None:
    """Save the study's note (servetune's choice and why, :func:`~search.outputs.explain.study_note_markdown`)
    and again the notes of the chosen trial and of the trial Optuna calls best, which then say which is the
    choice and why the other is not."""
    save_note(view.study, study_note_markdown(view))
    choice = view.choice
    # The study's user attributes are a table on the dashboard's study page: the choice in one line there.
    view.study.set_user_attr(CHOICE_ATTR, NO_CHOICE_YET if choice is None else
                             f"trial {choice.number}: {fmt(choice.value)} ({choice.why()}); "
                             "why: the study's Note page")
    numbers = {r.number for r in (view.choice.record if view.choice else None, optuna_best(view)) if r is not None}
    for trial in view.study.get_trials(deepcopy=False):
        if trial.number in numbers:
            write_note(view.study, trial, view)


def note_markdown(trial: FrozenTrial, view: StudyView | None = None) -> str:
    """The note's Markdown for one trial; with the study's ``view``, a first section when it is servetune's
    choice or the trial Optuna calls best without being the choice."""
    rec = TrialFacts.from_trial(trial)
    state = rec.state.name
    phase = rec.phase.value if rec.phase else None
    title = f"## Trial {rec.number}: {state}"
    if rec.label not in ("ok", state.lower()):
        title += f", {rec.label}" + (f" in {phase}" if phase else "")
    out = [title, ""]
    out += _choice_section(rec, view)
    facts = [
        f"**outcome** `{rec.label}`",
        f"**phase** `{phase}`" if phase else "",
        (", ".join(f"**{m}** {v:g} {unit(m)}".rstrip() for m, v in zip(rec.objective_metrics or (), rec.values,
                                                                          strict=False))
         if rec.values is not None else f"**value** {figure_text(rec.value, rec.objective_metric, rec.objective_level)}"
         if rec.value is not None else ""),
        f"host `{rec.host}`" if rec.host else "",
        f"{rec.gpu_name} x {rec.gpu_count}" if rec.gpu_name else "",
        f"{rec.engine} {rec.engine_version or ''}".strip() if rec.engine else "",
        "**simulated**" if rec.simulated else "",
    ]
    out += [" · ".join(f for f in facts if f), ""]
    if rec.reason:
        out += [f"> {' '.join(rec.reason.split())}", ""]
    if rec.duplicate_of is not None:
        out += [f"Same configuration as trial {rec.duplicate_of}: its result was reused.", ""]
    free = rec.free_after_capture_gib
    if free is not None and free < THIN_HEADROOM_GIB and rec.label == "ok":
        out += [f"**Thin headroom:** {free:.2f} GiB free after CUDA graph capture "
                f"(below {THIN_HEADROOM_GIB:g} GiB).", ""]
    if rec.memory:
        out += ["### Memory", "", *memory_table(rec.memory.figures()), ""]
    if rec.levels:
        out += ["### Results per concurrency level", "", *levels_table(rec.levels), ""]
    lines = oom_lines(rec.log_tail or "")
    if lines:
        wrapped = [part for line in lines for part in textwrap.wrap(line, LOG_WIDTH, subsequent_indent="  ") or [""]]
        out += ["### OOM lines from the log tail", "", "```text", *wrapped, "```", ""]
    return "\n".join(out).rstrip() + "\n"


def _choice_section(rec: TrialFacts, view: StudyView | None) -> list[str]:
    choice = view.choice if view is not None else None
    if view is None or choice is None:
        return []
    if rec.number == choice.number:
        return [f"**servetune's choice**: its configuration is the one servetune recommends, at "
                f"{fmt(choice.value)} ({choice.why()}). See the study's note.", ""]
    best = optuna_best(view)
    if best is not None and best.number == rec.number:
        reason = why_not(view, rec)
        return [f"**Not servetune's choice** (Optuna calls it the best trial: its single value is the highest). "
                f"servetune chose trial {choice.number} ({fmt(choice.value)}); this one is not it: {reason}", ""]
    return []


#: What tells one tensor-parallel rank's copy of a line from another's: SGLang's ``[time TPn]`` prefix, and
#: PyTorch's ``GPU n`` in an OOM message.
_RANK = re.compile(r"^\[[^\]]*?\bTP(\d+)\]\s*|\bGPU (\d+)\b")


def oom_lines(log_tail: str) -> list[str]:
    """The lines of a log tail that speak of running out of memory (the last few, ``\\r`` fragments split),
    each once: a line every rank logged is shown once, with the ranks that logged it (``on ranks 0-3``)."""
    found = [line.rstrip() for line in re.split(r"[\r\n]+", log_tail) if _OOM_LINE.search(line)]
    order: list[str] = []
    ranks: dict[str, set[int]] = {}
    first: dict[str, str] = {}
    for line in found:
        key = _RANK.sub(lambda m: "" if m.group(1) is not None else "GPU #", line).strip()
        seen = {int(g) for m in _RANK.finditer(line) for g in m.groups() if g is not None}
        if key not in ranks:
            order.append(key)
            ranks[key] = set()
            first[key] = line
        ranks[key] |= seen
    out = []
    for key in order[-_MAX_OOM_LINES:]:
        on = sorted(ranks[key])
        text = first[key]
        if len(on) > 1:
            span = f"{on[0]}\u2013{on[-1]}" if on == list(range(on[0], on[-1] + 1)) else ", ".join(map(str, on))
            text += f"  [on ranks {span}]"
        out.append(text.replace("```", "'''"))
    return out


class NotesCallback:
    """Study callback that writes the finished trial's note; logs a warning and carries on on error."""

    def __init__(self) -> None:
        self.failures = 0

    def __call__(self, view: StudyView, trial: FrozenTrial) -> None:
        try:
            write_note(view.study, trial)
        except Exception as exc:  # a note is a convenience: the study goes on without it
            self.failures += 1
            log = logger.warning if self.failures == 1 else logger.debug
            log("dashboard note for trial %d not saved: %s", trial.number, exc)


def notes_callback() -> NotesCallback:
    """A study callback ``(view, frozen_trial) -> None`` that saves each trial's note and never raises."""
    return NotesCallback()


class NotesSink:
    """The dashboard notes as a run's output (:mod:`search.outputs.sink`): each finished trial's note. The
    study's note and the choice's are written with the report (:func:`search.outputs.html.publish`)."""

    name = "notes"

    def __init__(self) -> None:
        self.callback = NotesCallback()

    @classmethod
    def open(cls, context: SinkContext) -> NotesSink:
        return cls()

    def on_trial(self, view: StudyView, trial: FrozenTrial) -> None:
        self.callback(view, trial)

    def close(self) -> None:
        pass

    def publish(self, view: StudyView, publication: Publication) -> None:
        pass
