"""Confirming the winner over run-to-run noise, and counting launches.

One lucky run must not win a study. Before a study finishes, the ``k`` best distinct configurations are
launched ``repeats`` more times each (real trials, queued with the tag ``confirmation_of``; a repeat is never reused
from an earlier value). :func:`confirmed_best` then picks the best on the repeated measurements (the
median with the pooled estimate of its knobs; a configuration that died on a repeat is out), and the one
chosen is launched ``final`` more times (tag ``final``), and more while the noise the study measured says the
mean of those is not yet within :data:`HONEST_HALF_WIDTH` (90%; at most :data:`MAX_FINAL`): its reported figure
is their mean, with that interval, which the choice never saw, so the luck that made it win does not
inflate it (the winner's curse). The spread
over all its launches is reported.

The budget counts launches: a skip (``predicted_oom``) costs no GPU time and holds no slot (a reused
duplicate still holds one, as it always has); confirmations are launched on top of the search budget.

Everything here reads a study's trials as :class:`~search.trial.records.TrialFacts` (``records(study)``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from optuna.study import StudyDirection
from optuna.trial import TrialState

from search.trial.records import TrialFacts
from spaces.schema import UNSET

#: The reported figure's 90% interval should be at most this share of the figure either side: the chosen
#: configuration gets more final launches while the run-to-run noise its launches show says it is wider.
HONEST_HALF_WIDTH = 0.02
#: One-sided z of the 90% interval (two-sided 90%: 1.645).
HONEST_Z = 1.645
#: The most final launches a noisy host is given (the interval is then stated as measured).
MAX_FINAL = 20

__all__ = [
    "CONFIRM_FINAL",
    "CONFIRM_K",
    "CONFIRM_REPEATS",
    "ConfirmLaunch",
    "Confirmed",
    "confirmation_launches",
    "confirmation_plan",
    "confirmed_best",
    "finals_needed",
    "forced_settings",
    "is_launch",
    "launches_of",
    "measured_noise",
    "noise_sd",
    "origin",
    "search_launches",
    "skip_summary",
]

CONFIRM_K = 3
CONFIRM_REPEATS = 1
CONFIRM_FINAL = 3


def confirmation_launches(k: int = CONFIRM_K, repeats: int = CONFIRM_REPEATS, final: int = CONFIRM_FINAL) -> int:
    """How many confirmation launches a study makes (none without ``k``)."""
    return k * repeats + final if k > 0 else 0


def is_launch(trial: TrialFacts) -> bool:
    """True for a trial that launched (or is launching) a server: not a skip, not a reuse."""
    return trial.launched


def search_launches(trials: Iterable[TrialFacts]) -> tuple[int, int]:
    """(finished, running) trials of the search proper that hold a budget slot: launches, and reuses of
    a measured configuration (cheap, but a sampler that keeps proposing measured configurations must
    still end). Skips (``predicted_oom``) and confirmations hold none."""
    done = running = 0
    for t in trials:
        if t.confirmation_of is not None or t.predicted_oom:
            continue
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
            done += 1
        elif t.state == TrialState.RUNNING:
            running += 1
    return done, running


def skip_summary(trials: Sequence[TrialFacts]) -> str:
    """One line: how many configurations were skipped as predicted OOMs, and the phases why."""
    skips = [t for t in trials if t.predicted_oom]
    launched = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and is_launch(t)]
    ooms = sum(1 for t in launched if t.oom)
    if not skips:
        return f"{len(launched)} launches, {ooms} died of OOM; no configuration skipped as a predicted OOM"
    phases: dict[str, int] = {}
    for t in skips:
        phase = t.predicted_phase or (t.phase.value if t.phase else "?")
        phases[phase] = phases.get(phase, 0) + 1
    why = ", ".join(f"{n} in {p}" for p, n in sorted(phases.items(), key=lambda x: -x[1]))
    rests = sorted({n for t in skips for n in t.prediction_rests_on})
    return (f"{len(launched)} launches, {ooms} died of OOM; {len(skips)} configurations not launched: "
            f"predicted to die of OOM ({why}), from the memory figures of trials {rests}")


def origin(t: TrialFacts) -> int:
    """The trial that first launched ``t``'s configuration (``t`` itself, or what it repeats or reused)."""
    if t.confirmation_of is not None:
        return t.confirmation_of
    return t.duplicate_of if t.duplicate_of is not None else t.number


class ConfirmLaunch(NamedTuple):
    """One confirmation launch to queue: the configuration first launched as ``origin``; ``final`` once
    that configuration is the one chosen (its figure is then what is reported)."""

    origin: int
    params: dict[str, Any]
    final: bool = False

    @property
    def user_attrs(self) -> dict[str, Any]:
        """The tags to queue it with (``study.enqueue_trial(params, user_attrs=...)``)."""
        return {"confirmation_of": self.origin, **({"final": True} if self.final else {})}


def confirmation_plan(trials: Sequence[TrialFacts], direction: StudyDirection, *, k: int = CONFIRM_K,
                      repeats: int = CONFIRM_REPEATS, final: int = CONFIRM_FINAL) -> list[ConfirmLaunch]:
    """The confirmation launches still to make, in order: first ``repeats`` more launches of each of the
    ``k`` best distinct configurations (best first), then, once those have all finished, ``final`` more
    launches of the configuration chosen on them (:func:`confirmed_best`). Empty while the choice waits
    for a running repeat, and once everything is made."""
    if k <= 0:
        return []
    plan = _screening(trials, direction, k, repeats)
    if plan or final <= 0:
        return plan
    if any(t.confirmation_of is not None and t.state not in _FINISHED for t in trials):
        return []  # the choice waits for every repeat
    chosen = confirmed_best(trials, direction)
    if chosen is None:
        return []
    params = next(t.params for t in trials if t.number == chosen.trial)
    made = sum(1 for t in trials if t.final and t.confirmation_of == chosen.trial and t.state != TrialState.FAIL)
    if made < final:
        return [ConfirmLaunch(chosen.trial, dict(params), final=True)] * (final - made)
    if any(t.final and t.state not in _FINISHED for t in trials):
        return []  # the count waits for the running final launches
    return [ConfirmLaunch(chosen.trial, dict(params), final=True)] if made < finals_needed(trials, final) else []


def measured_noise(trials: Sequence[TrialFacts]) -> float | None:
    """The run-to-run noise the study's repeated configurations show, final launches included (one sd, a share
    of the value; pooled within configurations); None before two repeats."""
    return _pooled_sd([t for t in trials if not t.stopped_early])


def _pooled_sd(trials: Sequence[TrialFacts]) -> float | None:
    """The pooled within-configuration sd (a share of the value) of the measured launches of ``trials``
    grouped by configuration; None below two degrees of freedom."""
    groups: dict[int, list[float]] = {}
    for t in trials:
        if t.state == TrialState.COMPLETE and t.value is not None and is_launch(t):
            groups.setdefault(origin(t), []).append(float(t.value))
    ss = dof = 0.0
    for values in groups.values():
        if len(values) > 1:
            mean = statistics.fmean(values)
            if mean:
                ss += sum((v / mean - 1) ** 2 for v in values)
                dof += len(values) - 1
    return math.sqrt(ss / dof) if dof >= 2 else None


def finals_needed(trials: Sequence[TrialFacts], final: int = CONFIRM_FINAL) -> int:
    """How many final launches the reported figure needs for its 90% interval to be within
    :data:`HONEST_HALF_WIDTH` at the noise the study measured (at least ``final``, at most :data:`MAX_FINAL`):
    fewer where the repeats agree, more on a noisy host."""
    sd = measured_noise(trials)
    if sd is None or final <= 0:
        return final
    return max(final, min(MAX_FINAL, math.ceil((HONEST_Z * sd / HONEST_HALF_WIDTH) ** 2)))


_FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


def _screening(trials: Sequence[TrialFacts], direction: StudyDirection, k: int,
               repeats: int) -> list[ConfirmLaunch]:
    """The repeats of the top ``k`` distinct configurations still to make, best first."""
    if repeats <= 0:
        return []
    firsts = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None and t.feasible
              and t.confirmation_of is None and t.duplicate_of is None]
    # Ranked on the search's launches only: the repeats come in one by one, and a ranking that moved with
    # them would send more than k configurations to the screening.
    search = [t for t in trials if t.confirmation_of is None]
    pooled = pooled_estimates(search)
    firsts.sort(key=lambda t: pooled.get(t.number, t.value or 0.0), reverse=direction == StudyDirection.MAXIMIZE)
    top: list[TrialFacts] = []
    seen: list[dict[str, Any]] = []
    for t in firsts:
        if t.params not in seen:
            seen.append(t.params)
            top.append(t)
        if len(top) == k:
            break
    top = _with_plainest(top, firsts, pooled, search, direction)
    made: dict[int, int] = {}
    for t in trials:
        origin = t.confirmation_of
        if origin is not None and not t.final and t.state != TrialState.FAIL:
            made[origin] = made.get(origin, 0) + 1
    plan = []
    for t in top:
        plan += [ConfirmLaunch(t.number, dict(t.params))] * max(0, repeats - made.get(t.number, 0))
    return plan


def forced_settings(params: dict[str, Any]) -> int:
    """How many environment overrides a configuration sets (``nccl.*`` knobs not left ``unset``): each
    overrides the library's own tuner, and forcing one can be unsafe on some hardware (``LL128`` off
    NVLink can corrupt data; a bare ``NCCL_ALGO=Tree`` kills NCCL >= 2.24), so one is kept only when the
    measurements show it pays."""
    return sum(1 for k, v in params.items() if k.startswith("nccl.") and v != UNSET)


def _with_plainest(top: list[TrialFacts], ranked: Sequence[TrialFacts], pooled: dict[int, float],
                   trials: Sequence[TrialFacts], direction: StudyDirection) -> list[TrialFacts]:
    """``top`` with its last slot given to the plainest configuration (fewest :func:`forced_settings`)
    whose pooled estimate is within one run-to-run sd of the leader's, when ``top`` has none as plain:
    the choice can then prefer it (:func:`confirmed_best`'s one-standard-error rule)."""
    if len(top) < 2 or not pooled:
        return top
    plainest = min(forced_settings(t.params) for t in top)
    sd = _noise_sd(trials, pooled)
    lead = pooled.get(top[0].number, top[0].value or 0.0)
    sign = 1.0 if direction == StudyDirection.MAXIMIZE else -1.0
    for t in ranked:
        if forced_settings(t.params) >= plainest or any(t.params == u.params for u in top):
            continue
        if sd is not None and sign * (lead - pooled.get(t.number, t.value or 0.0)) <= sd * abs(lead):
            return [*top[:-1], t]
    return top


def _noise_sd(trials: Sequence[TrialFacts], pooled: dict[int, float]) -> float | None:
    """The run-to-run noise as a share of the value: the pooled within-configuration sd of the
    configurations launched more than once, else the residual sd of ``pooled``, :func:`pooled_estimates`'s
    fit to ``trials``."""
    sd = _pooled_sd([t for t in trials if not t.final])
    if sd is not None:
        return sd
    resid = [float(t.value) / pooled[t.number] - 1 for t in trials
             if t.number in pooled and t.value is not None and pooled[t.number]]
    dof = len(resid) - _columns(trials) - 1  # the fit's own parameters leave that many degrees of freedom
    return math.sqrt(sum(r * r for r in resid) / dof) if dof >= 3 else None


def noise_sd(trials: Sequence[TrialFacts]) -> float | None:
    """The run-to-run noise the study's launches show (one sd, a share of the value; None: not yet known)."""
    search = [t for t in trials if not t.stopped_early]
    return _noise_sd(search, pooled_estimates(search))


def _columns(trials: Sequence[TrialFacts]) -> int:
    """How many parameters :func:`pooled_estimates` fits (one per numeric knob, one per level otherwise)."""
    done = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None and is_launch(t)
            and not t.final]
    n = 0
    for name in {k for t in done for k in t.params}:
        values = [t.params.get(name) for t in done]
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        n += 1 if numeric and len(set(values)) > 3 else len({repr(v) for v in values})
    return n


def pooled_estimates(trials: Sequence[TrialFacts], *, ridge: float = 1.0) -> dict[int, float]:
    """Each COMPLETE launch's value as an additive model of its knobs predicts it (ridge regression on
    one-hot categorical knobs and linear numeric ones, fitted on every COMPLETE launch but the ``final``
    ones, which are kept out of the choice).

    One launch of a configuration is one noisy draw; the knob values it shares with other launches are
    measured many times. Ranking the candidates for confirmation on the pooled estimate instead of their
    single draw keeps a lucky run from taking a confirmation slot. Empty with fewer than 4 launches.
    """
    import numpy as np

    done = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None and is_launch(t)
            and not t.final]
    if len(done) < 4:
        return {}
    names = sorted({k for t in done for k in t.params})
    columns: list[tuple[str, Any]] = []
    for name in names:
        values = [t.params.get(name) for t in done]
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values) and len(set(values)) > 3:
            columns.append((name, None))
        else:
            columns += [(name, v) for v in sorted({repr(v) for v in values})]

    def row(t: TrialFacts) -> list[float]:
        out = []
        for name, level in columns:
            v = t.params.get(name)
            out.append(float(v) if level is None and isinstance(v, int | float) else float(repr(v) == level))
        return out

    x = np.array([row(t) for t in done], dtype=float)
    y = np.array([float(t.value) for t in done if t.value is not None])
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale == 0] = 1.0
    z = (x - mean) / scale
    coef = np.linalg.solve(z.T @ z + ridge * np.eye(z.shape[1]), z.T @ (y - y.mean()))
    fitted = y.mean() + z @ coef
    return {t.number: float(f) for t, f in zip(done, fitted, strict=True)}


@dataclass(frozen=True)
class Confirmed:
    """The configuration chosen on repeated measurements."""

    trial: int  # the first launch of the configuration
    median: float  # over the launches it was chosen on (all but the final ones): what it is ranked by
    values: tuple[float, ...]  # every launch's figure, in order
    spread: float  # (max - min) / median over all its launches
    launches: int
    reported: float  # the mean of the final launches (else the median of the repeats): free of the choice's luck
    final: int = 0  # how many of its launches were made after it was chosen
    interval: float | None = None
    """Half-width of the reported figure's 90% interval, a share of it (the measured noise over the final
    launches); None without final launches or a noise figure."""


def confirmed_best(trials: Sequence[TrialFacts], direction: StudyDirection) -> Confirmed | None:
    """The best configuration by the median of its launches (the ``final`` ones left out: they are made
    after the choice), averaged with the pooled estimate of its knobs; among those with the most
    launches. A configuration that died on any launch is excluded. Its ``reported`` figure is the median
    of its final launches, or without them of its repeats alone: the launches it was chosen on were
    chosen for being high, and counting them inflates the figure (the winner's curse)."""
    groups: dict[int, list[TrialFacts]] = {}
    for t in trials:
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and is_launch(t):
            groups.setdefault(origin(t), []).append(t)
    rows: list[Confirmed] = []
    for first, ts in groups.items():
        if any(t.state != TrialState.COMPLETE or t.value is None or not t.feasible for t in ts):
            continue
        ts = sorted(ts, key=lambda t: t.number)
        values = tuple(float(t.value) for t in ts if t.value is not None)
        chosen_on = [float(t.value) for t in ts if t.value is not None and not t.final]
        finals = [float(t.value) for t in ts if t.value is not None and t.final]
        repeats = [float(t.value) for t in ts if t.value is not None and t.confirmation_of is not None
                   and not t.final]
        med = statistics.median(chosen_on) if chosen_on else statistics.median(values)
        spread = (max(values) - min(values)) / statistics.median(values) if statistics.median(values) else 0.0
        reported = statistics.fmean(finals) if finals else statistics.median(repeats or chosen_on)
        rows.append(Confirmed(first, med, values, spread, len(values), reported, len(finals)))
    if not rows:
        return None
    most = max(r.launches - r.final for r in rows)
    pool = [r for r in rows if r.launches - r.final == most] if most > 1 else rows
    sign = 1.0 if direction == StudyDirection.MAXIMIZE else -1.0
    # Ranked on the configuration's own launches, averaged with what the rest of the study says about
    # its knobs (the pooled estimate): with a few noisy launches each, neither alone is reliable.
    pooled = pooled_estimates(trials)

    def score(r: Confirmed) -> float:
        own = pooled.get(r.trial)
        return sign * (r.median if own is None else (r.median + own) / 2)

    best = _with_interval(max(pool, key=score), trials)
    # The one-standard-error rule: among the configurations the measurements cannot tell from the best
    # (within one standard error of the difference), the one that forces the fewest settings.
    sd = _noise_sd(trials, pooled)
    if sd is None:
        return best
    params = {t.number: t.params for t in trials}

    def close(r: Confirmed) -> bool:
        n_best, n_r = best.launches - best.final, r.launches - r.final
        se = sd * abs(best.median) * math.sqrt(1 / max(n_best, 1) + 1 / max(n_r, 1))
        return score(best) - score(r) <= se

    band = [r for r in pool if close(r)]
    return _with_interval(min(band, key=lambda r: (forced_settings(params.get(r.trial, {})), -score(r))), trials)


def _with_interval(row: Confirmed, trials: Sequence[TrialFacts]) -> Confirmed:
    """``row`` with the 90% interval of its reported figure (the measured noise over its final launches)."""
    sd = measured_noise(trials)
    if sd is None or row.final == 0:
        return row
    return replace(row, interval=HONEST_Z * sd / math.sqrt(row.final))


def launches_of(trials: Sequence[TrialFacts], number: int) -> list[TrialFacts]:
    """Every finished launch of the configuration first launched as trial ``number`` (it, its repeats)."""
    return sorted((t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and is_launch(t)
                   and origin(t) == number), key=lambda t: t.number)
