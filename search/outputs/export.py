"""``servetune export``: the launch script of a measured trial, rendered from the value the trial ran.

The script comes from :func:`runners.engines.script.render_script` applied to the trial's stored ``launch_config`` and
``engine_version``, so its exports and its ``exec`` line are exactly what the trial ran. The header comments
carry the evidence: study, trial, engine and version, GPU and host, the measured figures per concurrency
level, the free GPU memory after CUDA graph capture, and a WARNING when that headroom is thin (seed 001:
0.82 GB left after capture was a crash waiting for a prefill burst).

A ``pareto`` study has a front, not one best: the trial is picked from the front by a rule
(:mod:`search.strategy.front`: ``knee`` by default, or conditions such as ``p99_tpot_ms<=200`` and then the best on the
first metric), and the header names the rule, the front and the picked configuration's figures.
"""

from __future__ import annotations

import statistics
from datetime import UTC, datetime
from pathlib import Path

import optuna
from optuna.trial import TrialState
from pydantic import ValidationError

from runners.engines import Engine, engine_for, get_engine
from runners.engines.nodes import render_node_script
from runners.engines.script import render_script
from runners.errors import ConfigError, validation_line
from search.files import write_file
from search.outputs.figures import gpus_used
from search.outputs.text import THIN_HEADROOM_GIB, terminal_safe
from search.strategy.choice import Choice, choose
from search.strategy.confirm import origin
from search.strategy.front import Goal, PickRule, front, parse_rule
from search.strategy.view import StudyView
from search.trial.records import DEPLOY_ATTR, LevelResult, TrialFacts
from spaces.launch import LaunchConfig
from spaces.schema import OBJECTIVE_UNITS, Deploy

__all__ = ["deployment", "export_script", "overridden", "pick_record", "stored_deploy", "write_script"]

_CLOSEST = 3
#: The front points a failed ``--pick`` names.
_FRONT_SHOWN = 6
#: ``--engine`` -> the engines whose trials it can serve (the simulated host takes SGLang's flags).
_DEPLOY_ENGINES = {"sglang": ("sglang", "sim")}


def export_script(view: StudyView, *, trial: int | None = None, min_free_gib: float | None = None,
                  pick: str | None = None, now: datetime | None = None, engine: str | None = None,
                  deploy: Deploy | None = None) -> str:
    """A runnable bash launch script for ``trial`` (default: servetune's choice,
    :func:`search.strategy.choice.choose`).

    With ``min_free_gib`` and no ``trial``, the choice among the configurations whose first launch kept at least
    that free after CUDA graph capture; with an explicit ``trial`` it only moves the warning bar (default
    2 GiB). In a ``pareto`` study the trial is the one ``pick`` (default ``knee``) picks from the front of
    the configurations that clear the bar. Raises ConfigError (one line) for an unknown or unfinished trial,
    a trial without a stored launch config, a bad rule (or a rule for a study that has no front), or when no
    trial clears the bar (naming the ones that came closest).

    With ``engine`` (``sglang``) the script serves the trial's configuration on a real GPU box instead of
    repeating the tuning launch: see :func:`deployment`; ``deploy`` (default: the one the study's run stored)
    names that box's python, model path, bind address, port and GPUs.
    """
    study = view.study
    goal = view.goal
    rule = _rule(study, goal, trial, pick)
    rec = pick_record(view, trial=trial, min_free_gib=min_free_gib, rule=rule)
    launch = rec.launch_config
    version = rec.engine_version
    if rec.launch_config_error is not None:
        raise ConfigError(f"trial {rec.number}: stored launch config is invalid ({rec.launch_config_error})")
    if launch is None or not version:
        missing = "launch_config" if launch is None else "engine_version"
        raise ConfigError(f"trial {rec.number} of study {study.study_name!r} has no stored {missing}: "
                          "it cannot be exported")
    bar = min_free_gib if min_free_gib is not None else THIN_HEADROOM_GIB
    chosen = None if trial is not None else (view.choice if min_free_gib is None and rule is None else choose(
        view.records, view.goal, min_free_gib=min_free_gib, rule=rule))
    # Comment lines of the script: one line each, nothing in them acts on a terminal that prints the script.
    header = [terminal_safe(line, one_line=True)
              for line in _header(view, rec, version, bar, now or datetime.now(UTC), rule=rule, choice=chosen,
                                  min_free_gib=min_free_gib)]
    if engine is None:
        return _script(engine_for(launch), launch, version, header)
    if deploy is None:
        deploy = stored_deploy(study)
    served, served_version = deployment(launch, version, engine=engine, deploy=deploy, trial=rec.number)
    return _script(get_engine(engine), served, served_version,
                   _deploy_header(header, rec, launch, served, served_version))


def _script(engine: Engine, launch: LaunchConfig, version: str, header: list[str]) -> str:
    """The launch script: one server's, or for a server spanning nodes one script every node runs with its rank
    (:func:`runners.engines.nodes.render_node_script`)."""
    if launch.nodes > 1:
        return render_node_script(engine, launch, version, launch.nodes, header=header)
    return render_script(engine, launch, version, header=header)


def stored_deploy(study: optuna.Study) -> Deploy:
    """The space's ``deploy`` section as the study's latest run stored it (defaults when none was)."""
    data = study.user_attrs.get(DEPLOY_ATTR) or {}
    try:
        return Deploy.model_validate(data)
    except ValidationError as exc:
        where, msg = validation_line(exc)
        raise ConfigError(f"study {study.study_name!r}: stored deploy settings are invalid "
                          f"(deploy.{where}: {msg})") from None


def overridden(deploy: Deploy, *, python: str | None = None, bind: str | None = None) -> Deploy:
    """``deploy`` with the CLI's ``--python`` and ``--bind`` (CLI > space file > stored), checked as the space
    file's values are; ConfigError (one line) for a bad one."""
    flags = {"python": ("--python", python), "host": ("--bind", bind)}
    given = {key: value for key, (_flag, value) in flags.items() if value is not None}
    try:
        return Deploy.model_validate({**deploy.model_dump(), **given})
    except ValidationError as exc:
        where, msg = validation_line(exc)
        raise ConfigError(f"{flags[where][0] if where in flags else 'deploy.' + where}: {msg}") from None


def deployment(launch: LaunchConfig, version: str, *, engine: str, deploy: Deploy,
               trial: int) -> tuple[LaunchConfig, str]:
    """The launch that serves ``launch``'s configuration with the real ``engine`` on a GPU box, and the engine
    version its flags are spelled for.

    Knobs, fixed args and environment are the trial's; the python, model path, port and version come from
    ``deploy`` (python: never the simulated host's, which is servetune's own); the server binds to
    ``deploy.host`` (not the tuning loopback) and sees as ``CUDA_VISIBLE_DEVICES`` the GPUs ``deploy.gpus``,
    else those the trial's environment gave it (when they are as many as the TP size), else 0 .. TP size - 1.
    Raises ConfigError (one line) for an engine the trial cannot be rendered for.
    """
    tuned = launch.engine
    if engine not in _DEPLOY_ENGINES:
        raise ConfigError(f"--engine: {engine!r} is not one of {', '.join(_DEPLOY_ENGINES)}")
    if tuned not in _DEPLOY_ENGINES[engine]:
        raise ConfigError(f"trial {trial} ran on engine {tuned}, whose knobs {engine} does not take; --engine "
                          f"{engine} renders trials of {' or '.join(_DEPLOY_ENGINES[engine])}")
    python = deploy.python or (launch.python if not engine_for(launch).simulated else None)
    if python is None:
        raise ConfigError(f"trial {trial} ran on the simulated host, whose python is servetune's own: name the GPU "
                          "box's engine python in the space (deploy: {python: /path/to/python}) or with --python")
    tp = engine_for(launch).tp_size(launch.fixed_args) // launch.nodes  # the GPUs of one node
    if deploy.gpus is not None:
        if len(deploy.gpus) != tp:
            raise ConfigError(f"deploy.gpus names {len(deploy.gpus)} GPU(s) {deploy.gpus} for a TP size of {tp}: "
                              f"give {tp}")
        visible = ",".join(str(g) for g in deploy.gpus)
    else:
        # The GPUs the trial itself was given (its environment), else the first TP-size ones.
        tuned_gpus = launch.env.get("CUDA_VISIBLE_DEVICES", "")
        visible = tuned_gpus if len(tuned_gpus.split(",")) == tp and tuned_gpus else \
            ",".join(str(g) for g in range(tp))
    env = {**launch.env, "CUDA_VISIBLE_DEVICES": visible}
    served = LaunchConfig(
        engine=engine, python=python, model_path=deploy.model_path or launch.model_path, host=deploy.host,
        port=deploy.port or launch.port, knobs=launch.knobs, fixed_args=launch.fixed_args, env=env,
        nodes=launch.nodes,
    )
    return served, deploy.version or version


def _deploy_header(tuned_header: list[str], rec: TrialFacts, tuned: LaunchConfig, served: LaunchConfig,
                   version: str) -> list[str]:
    """The tuning header with its engine and GPU lines replaced by what the script serves with."""
    gpus = served.env["CUDA_VISIBLE_DEVICES"]
    count = len(gpus.split(","))
    per_node = f" per node on {served.nodes} nodes" if served.nodes > 1 else ""
    sim = ", SIMULATED" if rec.simulated else ""
    lines = [
        tuned_header[0] + f", rendered to serve with {served.engine} {version} on a GPU box",
        tuned_header[1],
        f"engine: {served.engine} {version} (tuned on {tuned.engine} {rec.engine_version or '?'}{sim})",
        f"GPU: {rec.gpu_name or 'unknown GPU'} x {count}{per_node} (TP {engine_for(served).tp_size(served.fixed_args)}"
        f"; CUDA_VISIBLE_DEVICES={gpus}); tuned on host {rec.host or 'unknown'}",
        f"serves on {served.host}:{served.port}, model {served.model_path}",
    ]
    # The rest (objective, launches, figures per level, headroom) is the tuning header's from the objective on.
    rest = [line for line in tuned_header[2:] if not line.startswith(("engine: ", "GPU: "))]
    return lines + rest


def write_script(path: Path, script: str) -> None:
    """Write an exported script, executable, replacing ``path`` at once (never half-written); ConfigError
    (one line) when it cannot be written."""
    write_file(path, script, mode=0o755)


def _rule(study: optuna.Study, goal: Goal, trial: int | None, pick: str | None) -> PickRule | None:
    """The pick rule of a pareto study's export (``knee`` unless stated); None for one objective or a trial
    given by number. ConfigError (one line) for a rule that does not apply or does not parse."""
    if pick is not None and not goal.pareto:
        raise ConfigError(f"--pick chooses from a pareto front, and study {study.study_name!r} has one objective "
                          f"({goal.describe()}): leave --pick out (the best is exported) or give --trial")
    if pick is not None and trial is not None:
        raise ConfigError("--pick and --trial both choose the trial: give one of them")
    if not goal.pareto or trial is not None:
        return None
    return parse_rule(pick if pick is not None else "knee", goal.metrics)


def pick_record(view: StudyView, *, trial: int | None = None, min_free_gib: float | None = None,
                rule: PickRule | None = None) -> TrialFacts:
    """The trial record to export (see :func:`export_script`): trial ``trial``, else servetune's choice
    (its figure the reported one). Raises ConfigError."""
    name = view.name
    recs = view.records
    if trial is not None:
        rec = view.record(trial)
        if rec is None:
            known = f"trials 0-{max(r.number for r in recs)}" if recs else "no trials yet"
            raise ConfigError(f"study {name!r} has no trial {trial} ({known})")
        if rec.state != TrialState.COMPLETE:
            why = rec.label + (f" in {rec.phase.value}" if rec.phase else "")
            raise ConfigError(f"trial {trial} of study {name!r} is {rec.state.name} ({why}): only COMPLETE trials "
                              "can be exported")
        return rec
    if min_free_gib is not None and min_free_gib < 0:
        raise ConfigError(f"--min-free-gib must be 0 or more, got {min_free_gib:g}")
    choice = view.choice if min_free_gib is None and rule is None else choose(
        recs, view.goal, min_free_gib=min_free_gib, rule=rule)
    if choice is not None:
        return choice.record
    if view.goal.pareto:
        _no_front_pick(view, rule or PickRule("knee"), min_free_gib)
    complete = [r for r in recs if r.state == TrialState.COMPLETE and r.feasible and r.value is not None]
    if not complete:
        raise ConfigError(f"study {name!r} has no COMPLETE feasible trial to export yet")
    measured = sorted((r for r in complete if r.free_after_capture_gib is not None),
                      key=lambda r: -(r.free_after_capture_gib or 0.0))
    closest = ", ".join(f"trial {r.number} ({r.free_after_capture_gib:.2f} GiB)" for r in measured[:_CLOSEST])
    raise ConfigError(f"no COMPLETE feasible trial of study {name!r} kept {min_free_gib:g} GiB free after "
                      f"CUDA graph capture; closest: {closest or 'none measured the headroom'}")


def _no_front_pick(view: StudyView, rule: PickRule, min_free_gib: float | None) -> None:
    """Raise ConfigError naming the front when nothing on it (of the configurations whose first launch kept
    ``min_free_gib`` free after graph capture) satisfies ``rule``."""
    goal = view.goal
    by_number = {r.number: r for r in view.records}
    kept = [r for r in view.records if min_free_gib is None
            or ((free := by_number.get(origin(r), r).free_after_capture_gib) is not None and free >= min_free_gib)]
    points = front(kept, goal)
    bar = f" that kept {min_free_gib:g} GiB free after CUDA graph capture" if min_free_gib is not None else ""
    if not points:
        raise ConfigError(f"study {view.name!r} has no COMPLETE feasible configuration{bar} yet: no front "
                          "to pick from")
    shown = "; ".join(f"trial {p.number}: " + ", ".join(f"{m}={v:.4g}" for m, v in zip(goal.metrics, p.values,
                                                                                        strict=True))
                      for p in points[:_FRONT_SHOWN])
    more = f" and {len(points) - _FRONT_SHOWN} more" if len(points) > _FRONT_SHOWN else ""
    raise ConfigError(f"--pick {rule.text}: no configuration on the front{bar} satisfies it; the front: "
                      f"{shown}{more}")


def _pareto_lines(view: StudyView, rec: TrialFacts, rule: PickRule | None) -> list[str]:
    """The header lines of a pareto study's export: the objective, the front, the rule, the picked figures."""
    goal = view.goal
    at = f" at concurrency {rec.objective_level}" if rec.objective_level is not None else ""
    points = view.front
    lines = [f"objective: pareto front{at}: {goal.describe()}",
             f"front: {len(points)} configuration(s) (trials {', '.join(str(p.number) for p in points) or '-'})"]
    if rule is not None:
        lines.append(f"picked by: --pick {rule.describe()}")
    else:
        on = any(p.number == rec.number for p in points)
        lines.append(f"picked by: --trial {rec.number} ({'on' if on else 'not on'} the front)")
    runs = view.launches_of(rec.number)
    how = f"median of {len(runs)} launches" if len(runs) > 1 and rule is not None else "this trial's launch"
    lines.append("picked figures: " + ", ".join(f"{m}={v:.2f}" for m, v in zip(goal.metrics, rec.values or [],
                                                                              strict=False)) + f" ({how})")
    return lines


def _header(view: StudyView, rec: TrialFacts, version: str, bar: float, now: datetime, *,
            rule: PickRule | None = None, choice: Choice | None = None,
            min_free_gib: float | None = None) -> list[str]:
    sim = " (SIMULATED)" if rec.simulated else ""
    lines = [
        f"servetune export: study {view.name}, trial {rec.number}",
        f"exported {now.isoformat(timespec='seconds')}",
        f"engine: {rec.engine or (rec.launch_config.engine if rec.launch_config else '?')} {version}{sim}",
    ]
    gpu = rec.gpu_name or "unknown GPU"
    used = gpus_used(rec)  # the GPUs the server held (its TP size), not the host's count
    host_has = f"; the host has {rec.gpu_count}" if rec.gpu_count and rec.gpu_count != used else ""
    lines.append(f"GPU: {gpu} x {used}{host_has} on host {rec.host or 'unknown'}")
    if rec.simulated:
        lines.append("NOTE: every figure below is SIMULATED (servetune's simulated GPU host), not measured "
                     "on real hardware")
    goal = view.goal
    if goal.pareto:
        lines += _pareto_lines(view, rec, rule)
    else:
        metric = rec.objective_metric or "objective"
        level = rec.objective_level
        at = f" at concurrency {level}" if level is not None else ""
        value = f"{rec.value:.2f}" if rec.value is not None else "?"
        unit = OBJECTIVE_UNITS.get(metric, "")
        # The one figure servetune reports for it, and what that figure is (a mean, a median, one launch).
        lines.append(f"objective: {metric}{at} = {value}{' ' + unit if unit else ''} ({_basis(choice, rec)}; "
                     f"{view.direction.name.lower()})")
    lines.append(_launches_line(view, rec.number))
    if min_free_gib is not None and choice is not None:
        excluded = ", ".join(str(n) for n in choice.excluded)
        lines.append(f"--min-free-gib {min_free_gib:g}: " + (
            f"excluded trial(s) {excluded}, which rank above it but kept less than {min_free_gib:g} GiB free "
            "after CUDA graph capture" if excluded else
            "excluded no configuration that ranks above it"))
    lines.append("measured" + (" (simulated)" if rec.simulated else "") + " per concurrency level:")
    for level_row in sorted(rec.levels, key=lambda lv: lv.max_concurrency or 0):
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


def _basis(choice: Choice | None, rec: TrialFacts) -> str:
    """What the exported figure is: for the choice, what its reported figure is (:meth:`Choice.reported_text`);
    for another trial, its one launch's."""
    if choice is not None and choice.number == rec.number:
        return choice.reported_text()
    return "one launch"


def _launches_line(view: StudyView, number: int) -> str:
    """Over how many launches the figures hold (the trial and its confirmation repeats): how many, deaths,
    spread; the figure itself is the objective line's, printed once."""
    runs = view.launches_of(number)
    values = [t.value for t in runs if t.value is not None]
    if len(runs) <= 1:
        return "launches of this configuration: 1 (not confirmed by repeats; figures below are that launch's)"
    died = sum(1 for t in runs if t.state != TrialState.COMPLETE)
    med = statistics.median(values) if values else float("nan")
    spread = (max(values) - min(values)) / med if values and med else 0.0
    return (f"launches of this configuration: {len(runs)} (trials {', '.join(str(t.number) for t in runs)}), "
            f"{died} died, run-to-run spread {spread:.1%}; levels below are trial {number}'s")


def _level_line(level: LevelResult) -> str:
    parts = [f"c={level.max_concurrency}:"]
    for key, fmt in LevelResult.HEADLINE:
        value = level.figure(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            parts.append(fmt.format(value) + ",")
    failed = level.figure("failed")
    if failed:
        parts.append(f"{failed} failed,")
    return " ".join(parts).rstrip(",")
