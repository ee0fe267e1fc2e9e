"""A space as a search loads it: the schema's checks, plus those that need the engines' knowledge.

``spaces/`` does not import the engines, so what only an engine knows is checked here, at the one place every
entry point (``validate``, ``run``, ``worker``, the demo) loads a space: a searched knob's own flag in
``fixed_args`` (the engine takes whichever comes last, so the fixed value or the search is silently lost), in
every spelling any release of the engine uses, and an ``env`` entry that a knob sets.
"""

from __future__ import annotations

from pathlib import Path

from runners.engines import Engine, get_engine
from runners.errors import ConfigError
from runners.simhost.profile import ProfileError, load_profile
from spaces.guards import fixed_args_problem
from spaces.launch import engine_options
from spaces.schema import Space, load_space

#: Versions that bracket every flag spelling the engines' tables know (renames happen in between).
_SPELLING_VERSIONS = ("0.0.0", "999.0.0")


def engine_of(space: Space) -> Engine:
    """The engine a space's trials run on, with the space's options (ask its traits; never compare its name)."""
    return get_engine(space.engine.kind, engine_options(space))


def sim_calibration(space: Space) -> str | None:
    """For a space on the simulated host, what its profile is calibrated to, in one line (None otherwise, or
    when the profile cannot be read: the run says so itself)."""
    if space.engine.sim is None:
        return None
    try:
        return load_profile(Path(space.engine.sim.profile)).calibration_line
    except (OSError, ProfileError):
        return None


def free_flag_problem(space: Space, engine: Engine, version: str | None, *,
                      with_fixed_args: bool = True) -> str | None:
    """One line naming the first free flag or variable of ``space`` that the engine release at ``version`` (None:
    the newest tabled) would refuse, or that servetune owns, or None; then the first of its ``fixed_args`` that
    release's parser would refuse (:func:`fixed_args_release_problem`; left to the caller with
    ``with_fixed_args=False``)."""
    knob_spellings = {f: k for k in engine.knob_flags for f in {engine.knob_flag(k, v) for v in _SPELLING_VERSIONS}}
    table = engine.flag_table(version)
    for flag, spec in space.knobs.flags.items():
        if flag in engine.owned_flags:
            return (f"knobs.flags.{flag}: servetune sets {flag} itself (bind address, port, model, parallelism); "
                    "it cannot be searched")
        if flag in knob_spellings:
            return f"knobs.flags.{flag}: {flag} is the named knob {knob_spellings[flag]}; search it there"
        if table is not None:
            values = getattr(spec, "values", None) or [spec.low, spec.high]  # type: ignore[union-attr]
            problem = table.flag_problem(flag, values)
            if problem is not None:
                return f"knobs.flags: {problem}"
    owned_env = set(engine.scratch_vars) | set(engine.env_knobs.values()) | {"CUDA_VISIBLE_DEVICES"}
    for var in space.knobs.env:
        if var in owned_env:
            return f"knobs.env.{var}: servetune sets {var} itself; it cannot be searched"
        if var in space.env:
            return f"knobs.env.{var}: env sets it too; remove it from env"
        problem = table.env_problem(var) if table is not None else None
        if problem is not None:
            return f"knobs.env: {problem}"
    return fixed_args_release_problem(space, engine, version) if with_fixed_args else None


def fixed_args_release_problem(space: Space, engine: Engine, version: str | None) -> str | None:
    """One line naming the first of ``space``'s ``fixed_args`` that the parser of the engine release at ``version``
    (None: the newest tabled) would refuse (a flag it does not have, a value it does not take), or None."""
    table = engine.flag_table(version)
    problem = table.args_problem(space.fixed_args, also=engine.tp_flags) if table is not None else None
    return None if problem is None else f"fixed_args: {problem}; every trial would die of it"


def host_gpus_problem(space: Space, engine: Engine) -> str | None:
    """For a space whose host is known before any run (the simulated host's profile names its GPUs), one line when
    its tensor parallel size over its most nodes asks each node for more GPUs than the host has, or None. Other
    hosts are checked by the preflight (``gpus_needed``), before the first launch."""
    if space.engine.sim is None:
        return None
    try:
        have = load_profile(Path(space.engine.sim.profile)).host.gpu_count
    except (OSError, ProfileError):
        return None  # the run says what is wrong with the profile
    tp = engine.tp_size(space.fixed_args)
    need = -(-tp // space.max_nodes)
    if need <= have:
        return None
    return (f"fixed_args: tensor parallel size {tp} needs {need} GPUs per node, but the host "
            f"({space.engine.sim.profile}) has {have}; use a tensor parallel size of at most {have * space.max_nodes}")


def engine_problem(space: Space) -> str | None:
    """One line naming what the engine's flag table says every trial of ``space`` would lose, or what its known
    host cannot give it, or None."""
    engine = engine_of(space)
    problem = host_gpus_problem(space, engine)
    if problem is not None:
        return problem
    problem = free_flag_problem(space, engine, space.engine.version, with_fixed_args=False)
    if problem is not None:
        return problem
    searched = [k for k in space.knobs.named]
    flags = {k: {engine.knob_flag(k, v) for v in _SPELLING_VERSIONS} for k in searched if k in engine.knob_flags}
    flags.update({flag: {flag} for flag in space.knobs.flags})
    problem = fixed_args_problem(space.fixed_args, flags)
    if problem is not None:
        return f"fixed_args: {problem}"
    for knob in searched:
        var = engine.env_knobs.get(knob)
        if var is not None and var in space.env:
            return f"env: env sets {var}, which knob {knob} searches; remove it from env"
    return fixed_args_release_problem(space, engine, space.engine.version)


def load_checked_space(path: str | Path) -> Space:
    """:func:`spaces.schema.load_space` plus :func:`engine_problem`; any problem is one ConfigError line."""
    space = load_space(path)
    problem = engine_problem(space)
    if problem is not None:
        raise ConfigError(f"{path}: {problem}")
    return space
