"""``servetune export``: the launch script of a measured trial, rendered from the value the trial ran.

The script comes from :func:`spaces.launch.render_script` applied to the trial's stored ``launch_config`` and
``engine_version``, so its exports and its ``exec`` line are exactly what the trial ran. The header comments
carry the evidence: study, trial, engine and version, GPU and host, the measured figures per concurrency
level, the free GPU memory after CUDA graph capture, and a WARNING when that headroom is thin (seed 001:
0.82 GB left after capture was a crash waiting for a prefill burst).
"""

from __future__ import annotations

import statistics
from datetime import UTC, datetime

import optuna
from optuna.trial import TrialState
from pydantic import ValidationError

from runners.errors import ConfigError
from search.confirm import confirmed_best, launches_of
from search.records import TrialRecord, best_record, records
from search.report import THIN_HEADROOM_GIB
from spaces.launch import LaunchConfig, render_script

__all__ = ["export_script", "pick_record"]

_CLOSEST = 3


def export_script(study: optuna.Study, *, trial: int | None = None, min_free_gib: float | None = None,
                  now: datetime | None = None) -> str:
    """A runnable bash launch script for ``trial`` (default: the best COMPLETE feasible trial).

    With ``min_free_gib`` and no ``trial``, the best COMPLETE feasible trial whose measured free memory after
    CUDA graph capture is at least that; with an explicit ``trial`` it only moves the warning bar (default
    2 GiB). Raises ConfigError (one line) for an unknown or unfinished trial, a trial without a stored launch
    config, or when no trial clears the bar (naming the ones that came closest).
    """
    rec = pick_record(study, trial=trial, min_free_gib=min_free_gib)
    launch_data = rec.launch_config
    version = rec.engine_version
    if not launch_data or not version:
        missing = "launch_config" if not launch_data else "engine_version"
        raise ConfigError(f"trial {rec.number} of study {study.study_name!r} has no stored {missing}: "
                          "it cannot be exported")
    try:
        launch = LaunchConfig.model_validate(launch_data)
    except ValidationError as exc:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": str(exc)}
        where = ".".join(str(p) for p in first["loc"]) or "launch_config"
        raise ConfigError(f"trial {rec.number}: stored launch config is invalid ({where}: {first['msg']})"
                          ) from None
    bar = min_free_gib if min_free_gib is not None else THIN_HEADROOM_GIB
    header = _header(study, rec, version, bar, now or datetime.now(UTC))
    return render_script(launch, version, header=header)


def pick_record(study: optuna.Study, *, trial: int | None = None,
                min_free_gib: float | None = None) -> TrialRecord:
    """The trial record to export (see :func:`export_script`). Raises ConfigError."""
    name = study.study_name
    recs = records(study)
    if trial is not None:
        by_number = {r.number: r for r in recs}
        rec = by_number.get(trial)
        if rec is None:
            known = f"trials 0-{max(by_number)}" if by_number else "no trials yet"
            raise ConfigError(f"study {name!r} has no trial {trial} ({known})")
        if rec.state != "COMPLETE":
            why = rec.outcome + (f" in {rec.phase}" if rec.phase else "")
            raise ConfigError(f"trial {trial} of study {name!r} is {rec.state} ({why}): only COMPLETE trials "
                              "can be exported")
        return rec
    if min_free_gib is not None and min_free_gib < 0:
        raise ConfigError(f"--min-free-gib must be 0 or more, got {min_free_gib:g}")
    confirmed = confirmed_best(study.get_trials(deepcopy=False), study.direction)
    if confirmed is not None and confirmed.launches > 1:
        rec = next(r for r in recs if r.number == confirmed.trial)
        free = rec.free_after_capture_gib
        if min_free_gib is None or (free is not None and free >= min_free_gib):
            return rec
    best = best_record(recs, study.direction, min_free_gib=min_free_gib)
    if best is not None:
        return best
    complete = [r for r in recs if r.state == "COMPLETE" and r.feasible and r.value is not None]
    if not complete:
        raise ConfigError(f"study {name!r} has no COMPLETE feasible trial to export yet")
    measured = sorted((r for r in complete if r.free_after_capture_gib is not None),
                      key=lambda r: -(r.free_after_capture_gib or 0.0))
    closest = ", ".join(f"trial {r.number} ({r.free_after_capture_gib:.2f} GiB)" for r in measured[:_CLOSEST])
    raise ConfigError(f"no COMPLETE feasible trial of study {name!r} kept {min_free_gib:g} GiB free after "
                      f"CUDA graph capture; closest: {closest or 'none measured the headroom'}")


def _header(study: optuna.Study, rec: TrialRecord, version: str, bar: float, now: datetime) -> list[str]:
    sim = " (SIMULATED)" if rec.simulated else ""
    lines = [
        f"servetune export: study {study.study_name}, trial {rec.number}",
        f"exported {now.isoformat(timespec='seconds')}",
        f"engine: {rec.engine or (rec.launch_config or {}).get('engine', '?')} {version}{sim}",
    ]
    gpu = rec.gpu_name or "unknown GPU"
    count = rec.attrs.get("gpu_count")
    lines.append(f"GPU: {gpu}" + (f" x {count}" if count else "") + f" on host {rec.host or 'unknown'}")
    if rec.simulated:
        lines.append("NOTE: every figure below is SIMULATED (servetune's simulated GPU host), not measured "
                     "on real hardware")
    metric = rec.attrs.get("objective_metric", "objective")
    level = rec.attrs.get("objective_level")
    at = f" at concurrency {level}" if level is not None else ""
    value = f"{rec.value:.2f}" if rec.value is not None else "?"
    lines.append(f"objective: {metric}{at} = {value} ({study.direction.name.lower()})")
    lines.append(_launches_line(study, rec.number))
    lines.append("measured" + (" (simulated)" if rec.simulated else "") + " per concurrency level:")
    for level_row in sorted(rec.levels, key=lambda lv: lv.get("max_concurrency") or 0):
        lines.append("  " + _level_line(level_row))
    if not rec.levels:
        lines.append("  (no levels recorded)")
    free = rec.free_after_capture_gib
    if free is None:
        lines.append("free GPU memory after CUDA graph capture: not measured")
    else:
        lines.append(f"free GPU memory after CUDA graph capture: {free:.2f} GiB")
        if free < bar:
            lines.append(f"WARNING: only {free:.2f} GiB free after CUDA graph capture (below {bar:g} GiB): "
                         "a prefill burst may run out of memory; lower mem_fraction_static or "
                         "cuda_graph_max_bs")
    # Host and GPU names come from remote output: keep every header entry on one comment line.
    return [" ".join(line.splitlines()) for line in lines]


def _launches_line(study: optuna.Study, number: int) -> str:
    """Over how many launches the figures hold (the trial and its confirmation repeats)."""
    runs = launches_of(study.get_trials(deepcopy=False), number)
    values = [t.value for t in runs if t.value is not None]
    if len(runs) <= 1:
        return "launches of this configuration: 1 (not confirmed by repeats; figures below are that launch's)"
    died = sum(1 for t in runs if t.state != TrialState.COMPLETE)
    med = statistics.median(values) if values else float("nan")
    spread = (max(values) - min(values)) / med if values and med else 0.0
    return (f"launches of this configuration: {len(runs)} (trials {', '.join(str(t.number) for t in runs)}), "
            f"{died} died; objective median {med:.2f}, run-to-run spread {spread:.1%}; levels below are "
            f"trial {number}'s")


_LEVEL_FIGURES = (
    ("output_throughput", "output {:.1f} tok/s"),
    ("request_throughput", "{:.2f} req/s"),
    ("mean_ttft_ms", "TTFT mean {:.1f} ms"),
    ("p99_ttft_ms", "p99 {:.1f} ms"),
    ("mean_tpot_ms", "TPOT mean {:.2f} ms"),
    ("p99_tpot_ms", "p99 {:.2f} ms"),
)


def _level_line(level: dict[str, object]) -> str:
    parts = [f"c={level.get('max_concurrency', '?')}:"]
    for key, fmt in _LEVEL_FIGURES:
        value = level.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            parts.append(fmt.format(value) + ",")
    failed = level.get("failed")
    if failed:
        parts.append(f"{failed} failed,")
    return " ".join(parts).rstrip(",")
