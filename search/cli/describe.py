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

import optuna

from runners.engines import engine_for
from runners.engines.script import render
from runners.errors import ConfigError
from runners.simhost.profile import load_profile
from search.spaces import engine_of
from search.strategy.design import MEMORY_KNOB, probe_params, startup_design
from search.strategy.distributions import distributions, held_inert, inert_knobs
from spaces.correctness import changes_numerics
from spaces.coupling import EnvValues, FlagRange, FlagValues, is_active
from spaces.launch import LaunchConfig, engine_options
from spaces.nccl import version_text
from spaces.schema import OBJECTIVE_UNITS, BoolChoices, FloatRange, IntChoices, Space

__all__ = ["DryRun", "check_complete", "describe_space", "dry_run", "example_command", "grid_size", "knob_tree",
           "knob_values"]

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
    if isinstance(spec, FlagRange):
        if spec.integer:
            step = int(spec.step or 1)
            return f"{spec.low} to {spec.high}" + (f" in steps of {step}" if step != 1 else ""), \
                (int(spec.high) - int(spec.low)) // step + 1
        return knob_values(FloatRange(low=spec.low, high=spec.high, step=spec.step))
    if isinstance(spec, FlagValues):
        words = ["left out (engine default)" if c is None else str(c).lower() if isinstance(c, bool) else str(c)
                 for c in spec.values]
        return "one of " + ", ".join(words), len(words)
    if isinstance(spec, EnvValues):
        return knob_values(list(spec.values))
    values = [str(v) for v in spec]
    return "one of " + ", ".join("unset (engine default)" if v == "unset" else v for v in values), len(values)


def grid_size(space: Space) -> int | None:
    """Configurations in the searched grid, None when a knob is a continuous range: the product of every
    searched knob's values; with conditional knobs, the branches of the tree counted one by one (a knob counts
    only where its condition holds, a configuration only when it keeps the space's constraints)."""
    searched = space.knobs.searched()
    dists = distributions(space)
    # the node count (nodes: {choices: [...]}) is a categorical of its own, outside the knobs' tree
    nodes = math.prod(len(getattr(d, "choices", ())) for n, d in dists.items() if n not in searched)
    names = [n for n in space.knobs.order() if n in dists]
    values: dict[str, list[Any]] = {}
    for name in names:
        count = knob_values(searched[name])[1]
        if count is None:
            return None
        values[name] = _grid_values(searched[name], dists[name])
    if not space.knobs.conditions() and not space.knobs.constraints:
        return nodes * math.prod(len(v) for v in values.values())
    constraints = space.knobs.parsed_constraints()
    conditions = space.knobs.conditions()

    def branches(i: int, chosen: dict[str, Any]) -> int:
        if i == len(names):
            return int(all(c.holds(chosen) for c in constraints))
        name = names[i]
        if not is_active(name, chosen, conditions):
            return branches(i + 1, chosen)
        return sum(branches(i + 1, {**chosen, name: v}) for v in values[name])

    return nodes * branches(0, {})


def _grid_values(spec: Any, dist: Any) -> list[Any]:
    """The values a knob takes in the grid."""
    if isinstance(dist, optuna.distributions.CategoricalDistribution):
        return list(dist.choices)
    if isinstance(dist, optuna.distributions.IntDistribution):
        return list(range(dist.low, dist.high + 1, dist.step))
    n = knob_values(spec)[1] or 1
    return [dist.low + i * (dist.step or 0) for i in range(n)]


def knob_tree(space: Space, state: Mapping[str, str]) -> list[str]:
    """The searched knobs as a tree, one line each: a conditional knob under the knob and value(s) that switch
    it on. ``state`` says per knob whether the engine version reads it."""
    searched = space.knobs.searched()
    conditions = space.knobs.conditions()
    children: dict[tuple[str, str], list[str]] = {}
    roots: list[str] = []
    for name in space.knobs.order():
        when = conditions.get(name)
        if not when:
            roots.append(name)
            continue
        parent, wanted = next(iter(when.items()))  # drawn under its first condition; the others are named
        children.setdefault((parent, ", ".join(map(str, wanted))), []).append(name)
    lines: list[str] = []

    def show(name: str, depth: int) -> None:
        values, _ = knob_values(searched[name])
        extra = [f"{p} = {', '.join(map(str, w))}" for p, w in list(conditions.get(name, {}).items())[1:]]
        also = f" (and when {'; '.join(extra)})" if extra else ""
        lines.append(f"{'  ' * depth}  {name}: {values}{also} [{state.get(name, 'live')}]")
        for (parent, wanted), kids in children.items():
            if parent == name:
                lines.append(f"{'  ' * depth}    when {name} = {wanted}:")
                for kid in kids:
                    show(kid, depth + 2)

    for name in roots:
        show(name, 0)
    return lines


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
        sense = "minimise" if obj.directions[0] == "minimize" else "maximise"
        text = f"{sense} {obj.scored_by} ({unit}) at concurrency {space.target_level}"
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
    state = {}
    for name in space.knobs.searched():
        if name in held:
            state[name] = "inert in this engine version: held at the engine default, not searched"
        elif name in inert:
            state[name] = "inert in this engine version, searched anyway (search_inert)"
    lines += knob_tree(space, state)
    for text in space.knobs.constraints:
        lines.append(f"  constraint: {text} (a configuration that breaks it is not launched)")
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
    lines.append(f"correctness gate: {_gate_words(space)}")
    lines.append(f"budget: {_budget_words(space)}")
    command, env = example_command(space)
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    spelled = "" if space.engine.version or space.engine.simulated else \
        "; flags as the newest release spells them, the host's version decides"
    if _probe_follows_cards(space):
        spelled += "; --mem-fraction-static follows the host's cards (SGLang's default with twice its reserve)"
    lines.append(f"first launch (the probe{spelled}): " + (f"{exports} " if exports else "") + command)
    return lines


def _gate_words(space: Space) -> str:
    """Whether the correctness gate runs, why, and what it asks."""
    gate = space.correctness
    if not space.gate_on:
        why = "switched off (correctness.enabled: false)" if gate.enabled is False else \
            "off: no searched knob can change numerics (correctness.enabled: true turns it on)"
        return why
    numerics = [k for k in space.knobs.searched() if changes_numerics(k)]
    why = "on (correctness.enabled: true)" if gate.enabled else f"on: {', '.join(numerics)} can change the answers"
    limits = [f"agreement >= {gate.min_agreement:g}"]
    if gate.max_logprob_gap is not None:
        limits.append(f"logprob gap <= {gate.max_logprob_gap:g} nats")
    if gate.min_accuracy is not None:
        limits.append(f"accuracy >= {gate.min_accuracy:g}")
    reference = ", ".join(f"{k}={v}" for k, v in gate.reference.items()) or \
        "the probe with every numerics knob at the engine default"
    return (f"{why}; {len(gate.prompt_set())} prompts, greedy, {gate.max_tokens} tokens each, once per "
            f"configuration, against {reference}; needs {', '.join(limits)}")


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
