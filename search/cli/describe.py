"""A space in words, and what a run would launch: what ``servetune validate`` and ``run --dry-run`` print.

Both read the space and the sampler's start-up plan (:mod:`search.strategy.design`) and render launches with the same
engines a trial uses (:mod:`runners.engines.script`); nothing here opens a host, a storage or MLflow, so
neither command launches anything or writes to a study.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runners.engines import engine_for
from runners.engines.script import render
from runners.errors import ConfigError
from runners.simhost.profile import load_profile
from search.spaces import engine_of
from search.strategy.design import MEMORY_KNOB, probe_params, startup_design
from search.strategy.distributions import distributions, held_inert, inert_knobs
from spaces.launch import LaunchConfig, engine_options
from spaces.nccl import version_text
from spaces.schema import OBJECTIVE_UNITS, BoolChoices, FloatRange, IntChoices, Space

__all__ = ["DryRun", "check_complete", "describe_space", "dry_run", "example_command", "grid_size", "knob_values"]

#: The version flags are spelled for when the space leaves it to the host (newest spelling of every flag).
_NEWEST = "999.0.0"


def check_complete(space: Space, source: str | Path) -> None:
    """What ``validate`` refuses beyond the schema: a space that states no objective (a search would maximise
    a default it never chose) and a simulated-host profile that is not there. Raises ConfigError (one line)."""
    if "objective" not in space.model_fields_set:
        raise ConfigError(f"{source}: objective: missing; say what a trial is scored by, e.g. "
                          "objective: {metric: output_throughput, level: 64} (or kind: max_rate_under_slo)")
    sim = space.engine.sim
    if sim is not None and not Path(sim.profile).is_file():
        raise ConfigError(f"{source}: engine.sim.profile: no such simulated-host profile {sim.profile} "
                          "(looked beside the space file and here)")


def knob_values(spec: Any) -> tuple[str, int | None]:
    """A knob's values in words and how many there are (None: a continuous range)."""
    if isinstance(spec, FloatRange):
        if spec.step is None:
            return f"any value from {spec.low:g} to {spec.high:g} (continuous)", None
        count = math.floor((spec.high - spec.low) / spec.step + 1e-9) + 1
        return f"{spec.low:g} to {spec.high:g} in steps of {spec.step:g}", count
    if isinstance(spec, IntChoices | BoolChoices):
        words = ["engine default" if c is None else str(c).lower() for c in spec.choices]
        return "one of " + ", ".join(words), len(words)
    values = [str(v) for v in spec]
    return "one of " + ", ".join("unset (engine default)" if v == "unset" else v for v in values), len(values)


def grid_size(space: Space) -> int | None:
    """Configurations in the searched grid (the product of every searched knob's values), None when a knob is
    a continuous range."""
    searched = space.knobs.searched()
    total = 1
    for name, dist in distributions(space).items():
        if name not in searched:  # the node count (nodes: {choices: [...]}): a categorical of its own
            total *= len(getattr(dist, "choices", ()))
            continue
        count = knob_values(searched[name])[1]
        if count is None:
            return None
        total *= count
    return total


def sim_card_mib(space: Space) -> float | None:
    """The card memory the simulated host's nvidia-smi reports (the probe's fraction follows it); None for
    a GPU engine, whose cards are read on the host when the run starts."""
    if space.engine.sim is None:
        return None
    try:
        return float(load_profile(Path(space.engine.sim.profile)).host.memory_total_mib)
    except (OSError, ValueError):
        return None


CARDS = "<set from the host's cards when the run starts>"
AFTER_PROBE = "<set after the probe>"


def _memory_placed_after_probe(space: Space) -> bool:
    """The start-up launches' --mem-fraction-static is placed by the memory model from the probe's figures."""
    return engine_of(space).memory_family == "sglang" and MEMORY_KNOB in distributions(space)


def _unknown_memory(command: str, value: Any, words: str) -> str:
    """``command`` with the memory flag's value replaced by ``words``."""
    return re.sub(rf"(--mem-fraction-static[ =]){re.escape(str(value))}\b", lambda m: m.group(1) + shlex.quote(words),
                  command)


def _probe_follows_cards(space: Space) -> bool:
    """The probe's --mem-fraction-static is only known once the run reads a GPU host's cards."""
    engine = engine_of(space)
    return engine.memory_family == "sglang" and not engine.simulated and "mem_fraction_static" in distributions(space)


def example_command(space: Space, params: Mapping[str, Any] | None = None) -> tuple[str, dict[str, str]]:
    """The server command (shell words) and exported environment of one configuration (default: the probe,
    the study's first launch), rendered exactly as a trial renders it."""
    launch = LaunchConfig.from_params(space, probe_params(space, sim_card_mib(space)) if params is None else params)
    engine = engine_for(launch)
    rendered = render(engine, launch, space.engine.version or getattr(engine, "version", None) or _NEWEST)
    return " ".join(shlex.quote(a) for a in rendered.argv), rendered.env


def _objective_words(space: Space) -> str:
    obj = space.objective
    unit = OBJECTIVE_UNITS.get(obj.scored_by, "")
    slo = ", ".join(f"{k} <= {v:g}" for k, v in obj.slo.limits().items())
    if obj.kind == "max_rate_under_slo":
        rate = obj.rate_search
        text = (f"maximise {obj.scored_by} ({unit}): the highest request rate with every SLO limit held ({slo}), "
                f"at most {space.target_level} requests in flight, searched from {rate.start:g} req/s within "
                f"[{rate.low:g}, {rate.high:g}]")
    elif obj.kind == "pareto":
        goal = ", ".join(f"{'maximise' if d == 'maximize' else 'minimise'} {m}"
                         for m, d in zip(obj.metric_names, obj.directions, strict=True))
        text = f"the Pareto front of {goal} at concurrency {space.target_level}"
        if slo:
            text += f", subject to {slo}"
    else:
        text = f"maximise {obj.metric} ({unit}) at concurrency {space.target_level}"
        if slo:
            text += f", subject to {slo}"
    return text


def _workload_words(space: Space) -> str:
    w = space.workload
    source = {"sharegpt": f"prompts from {w.dataset}",
              "generated-shared-prefix": "random prompts sharing "
                                         f"{w.prefix.groups if w.prefix else 1} prefix(es) of "
                                         f"{w.prefix.len if w.prefix else 0} tokens",
              "random": "random prompts"}[w.shape]
    lengths = f"{w.input_len} input / {w.output_len} output tokens"
    if w.range_ratio < 1:
        lengths += f" (drawn from {w.range_ratio:g} x to 1 x those)"
    if w.shape == "sharegpt":
        lengths = "prompt and reply lengths as the file has them"
    levels = ", ".join(f"C={c} ({n} requests)" for c, n in zip(w.concurrency, w.requests(), strict=True))
    how = "each level one burst of C requests" if w.burst else f"{w.warmup_requests} warm-up request(s) first"
    return f"{source}, {lengths}; levels {levels}; {how}"


def _budget_words(space: Space) -> str:
    from search.outputs.report import format_duration

    b = space.budget
    trials = f"{b.n_trials} trials" if b.n_trials else "no trial limit"
    timeout = f", at most {format_duration(b.timeout)}" if b.timeout else ", no time limit"
    return (f"{trials}{timeout}; a server gets {format_duration(b.startup_timeout)} to start and "
            f"{format_duration(b.benchmark_timeout)} to benchmark")


def describe_space(space: Space) -> list[str]:
    """``servetune validate``'s account of a space, one line each: the engine, each knob and its values
    (and whether the engine version reads it), the grid size, the workload, objective and budget, and the
    launch command of the study's first configuration."""
    sim = " (SIMULATED GPU host: every figure it produces is simulated)" if space.engine.simulated else ""
    version = space.engine.version or "detected on the host"
    lines = [f"study {space.name}: engine {space.engine.kind} {version}{sim}, model {space.model_path}"]
    inert = inert_knobs(space.engine.kind, space.engine.version, engine_options(space))
    held = held_inert(space)
    lines.append("knobs (live: the engine version reads it; inert: it has no effect, see the warnings):")
    for name, spec in space.knobs.searched().items():
        values, _count = knob_values(spec)
        if name in held:
            state = "inert in this engine version: held at the engine default, not searched"
        elif name in inert:
            state = "inert in this engine version, searched anyway (search_inert)"
        else:
            state = "live"
        lines.append(f"  {name}: {values} [{state}]")
    if space.max_nodes > 1:
        counts = space.node_counts
        which = f"{counts[0]}" if len(counts) == 1 else f"searched over {', '.join(map(str, counts))}"
        lines.append(f"nodes: {which}; one rank per node, the TP size in fixed_args is the total over the nodes; "
                     "runs on an inventory group (groups:)")
    size = grid_size(space)
    lines.append("grid: " + (f"{size} configuration(s)" if size is not None
                             else "continuous (a float knob has no step), sampled"))
    if space.knobs.nccl or any(k.startswith("NCCL_") for k in space.env):
        lines.append(f"NCCL rules: {_nccl_words(space)}")
    lines.append(f"workload: {_workload_words(space)}")
    lines.append(f"objective: {_objective_words(space)}")
    lines.append(f"budget: {_budget_words(space)}")
    command, env = example_command(space)
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    spelled = "" if space.engine.version or space.engine.simulated else \
        "; flags as the newest release spells them, the host's version decides"
    if _probe_follows_cards(space):
        spelled += "; --mem-fraction-static follows the host's cards (SGLang's default with twice its reserve)"
    lines.append(f"first launch (the probe{spelled}): " + (f"{exports} " if exports else "") + command)
    return lines


def _nccl_words(space: Space) -> str:
    """Which NCCL version the NCCL settings were checked against, and what the run checks again."""
    version, where = space.engine.nccl_rules
    said = f"NCCL {version_text(version)} ({where})"
    if space.engine.sim is not None:
        try:
            host = load_profile(Path(space.engine.sim.profile)).host
        except (OSError, ValueError):
            return said
        return f"{said}; the simulated host's profile loads NCCL {host.nccl_version}, which the run checks again"
    return said + ("" if space.engine.nccl else "; the run checks again against the NCCL each host's torch loads")


@dataclass(frozen=True)
class DryRun:
    """What ``servetune run`` would do: the study, the hosts, and the first launches with their commands."""

    study: str
    hosts: list[str]
    n_trials: int | None
    timeout: float | None
    launches: list[tuple[str, dict[str, Any], str]] = field(default_factory=list)
    """(what it is, params, shell command) of each first launch, in order."""
    resumed: int = 0
    """Trials the study holds already (then the sampler proposes from them, and no probe is queued)."""
    version_unknown: bool = False
    """The engine version is detected on the host: the commands spell flags as the newest release does."""


def dry_run(space: Space, *, study: str, hosts: Sequence[str], n_trials: int | None, timeout: float | None,
            existing_trials: int = 0, first: int = 3) -> DryRun:
    """The plan of a run, without launching or writing anything: for a new study the probe and the next
    ``first - 1`` start-up launches (:func:`search.strategy.distributions.startup_design`), each with its command."""
    launches: list[tuple[str, dict[str, Any], str]] = []
    if existing_trials == 0:
        # What the run sets only once it runs is shown as such, never as a placeholder value: the probe's
        # memory fraction on a real SGLang host (from the host's cards), and the start-up launches' (placed
        # by the memory model from the probe's figures).
        later: list[str | None] = [CARDS if _probe_follows_cards(space) else None]
        plan = [("probe", probe_params(space, sim_card_mib(space)))]
        placed = _memory_placed_after_probe(space)
        # With the memory model, the first start-up launch is the probe's configuration at the fraction the
        # model places (the base), then one knob at a time from it (search.strategy.design.startup_design).
        design = ([plan[0][1]] if placed else []) + [p for p in startup_design(space) if not placed
                                                      or p != plan[0][1]]
        design = design[:max(0, first - 1)]
        plan += [(f"start-up {i + 1}", p) for i, p in enumerate(design)]
        later += [AFTER_PROBE if placed else None] * len(design)
        for (label, params), unknown in zip(plan, later, strict=True):
            command, env = example_command(space, params)
            exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
            command = (f"{exports} " if exports else "") + command
            if unknown is not None:
                command = _unknown_memory(command, params[MEMORY_KNOB], unknown)
                params = {**params, MEMORY_KNOB: unknown}
            launches.append((label, params, command))
    return DryRun(study=study, hosts=list(hosts), n_trials=n_trials, timeout=timeout, launches=launches,
                  resumed=existing_trials,
                  version_unknown=not space.engine.version and not space.engine.simulated)
