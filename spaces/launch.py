"""The launch config: a frozen, validated value from which both the trial and the exported script render.

``LaunchConfig.from_params(space, params)`` turns one point of the space (as sampled) into the exact set
of knobs, fixed args and environment. It says *what* to launch; how an engine spells it (argv, environment,
the launch script) is :mod:`runners.engines.script`'s job, typed on the launch protocol
(:class:`runners.engines.base.LaunchLike`) that this class satisfies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from spaces.names import check_identifier
from spaces.schema import UNSET, Space

NODES_PARAM = "nodes"
"""The trial parameter of a searched node count (``nodes: {choices: [...]}``)."""


def engine_options(space: Space) -> dict[str, Any]:
    """The engine-specific settings a space gives its engine (the simulated host's profile, speed, seed and
    version; for vLLM on the CPU its device, which decides how it is started): what
    ``runners.engines.get_engine`` takes as ``options``."""
    sim = space.engine.sim
    if sim is None:
        return {"device": "cpu"} if space.engine.kind == "vllm" and space.engine.device == "cpu" else {}
    options: dict[str, Any] = {"profile": sim.profile, "speed": sim.speed}
    if sim.seed is not None:
        options["seed"] = sim.seed
    if space.engine.version:
        options["version"] = space.engine.version
    return options


class LaunchConfig(BaseModel):
    """Everything that decides how one server is launched. Immutable; JSON round-trips exactly."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine: str
    python: str
    model_path: str
    host: str = "127.0.0.1"
    port: int = Field(ge=1, le=65535)
    knobs: dict[str, Any] = Field(default_factory=dict)
    flags: dict[str, Any] = Field(default_factory=dict)
    """Free engine flags searched (``--schedule-policy``: ``lpm``); None or false: left out."""
    fixed_args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    engine_options: dict[str, Any] = Field(default_factory=dict)
    nodes: int = Field(default=1, ge=1)
    """The nodes the server spans (one rank per node; ``runners.engines.nodes`` renders each rank's command)."""

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        # Keys are written unquoted after `export`: a stored config must not smuggle shell text in either.
        for key in v:
            check_identifier(key)
        return v

    @classmethod
    def from_params(cls, space: Space, params: Mapping[str, Any], *, port: int | None = None) -> LaunchConfig:
        """Build the launch config for sampled ``params`` (knob names; NCCL as ``nccl.NAME``, free variables as
        ``env.NAME``, free flags by their own name ``--flag``). Knobs a condition switches off are left out."""
        knobs: dict[str, Any] = {}
        flags: dict[str, Any] = {}
        env = dict(space.env)
        nodes = space.node_counts[0]
        for name, value in space.knobs.active(dict(params)).items():
            if name == NODES_PARAM:
                nodes = int(value)
            elif name.startswith(("nccl.", "env.")):
                if value != UNSET:
                    env[name.split(".", 1)[1]] = str(value)
            elif name.startswith("--"):
                flags[name] = value
            else:
                knobs[name] = value
        return cls(
            engine=space.engine.kind,
            python=space.engine.python,
            model_path=space.model_path,
            port=port or space.port,
            knobs=knobs,
            flags=flags,
            fixed_args=tuple(space.fixed_args),
            env=env,
            engine_options=engine_options(space),
            nodes=nodes,
        )
