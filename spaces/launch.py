"""The launch config: a frozen, validated value from which both the trial and the exported script render.

``LaunchConfig.from_params(space, params)`` turns one point of the space (as sampled) into the exact set
of knobs, fixed args and environment. :func:`render_script` renders it for an engine version into a bash
script whose last line is ``exec <python> -m <module> <flags>``, every value shell-quoted. The trial runs
that script on the host and ``servetune export`` renders it again from the same stored value, so the two
cannot drift.
"""

from __future__ import annotations

import shlex
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from runners.engines import get_engine
from runners.engines.base import Engine
from spaces.names import check_identifier
from spaces.schema import UNSET, Space


class LaunchConfig(BaseModel):
    """Everything that decides how one server is launched. Immutable; JSON round-trips exactly."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine: str
    python: str
    model_path: str
    host: str = "127.0.0.1"
    port: int = Field(ge=1, le=65535)
    knobs: dict[str, Any] = Field(default_factory=dict)
    fixed_args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    engine_options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        # Keys are written unquoted after `export`: a stored config must not smuggle shell text in either.
        for key in v:
            check_identifier(key)
        return v

    @classmethod
    def from_params(cls, space: Space, params: Mapping[str, Any], *, port: int | None = None) -> LaunchConfig:
        """Build the launch config for sampled ``params`` (knob names; NCCL as ``nccl.NAME``)."""
        knobs: dict[str, Any] = {}
        env = dict(space.env)
        for name, value in params.items():
            if name.startswith("nccl."):
                if value != UNSET:
                    env[name.removeprefix("nccl.")] = str(value)
            else:
                knobs[name] = value
        options: dict[str, Any] = {}
        if space.engine.sim is not None:
            options = {"profile": space.engine.sim.profile, "speed": space.engine.sim.speed}
            if space.engine.sim.seed is not None:
                options["seed"] = space.engine.sim.seed
            if space.engine.version:
                options["version"] = space.engine.version
        return cls(
            engine=space.engine.kind,
            python=space.engine.python,
            model_path=space.model_path,
            port=port or space.port,
            knobs=knobs,
            fixed_args=tuple(space.fixed_args),
            env=env,
            engine_options=options,
        )

    def engine_impl(self) -> Engine:
        return get_engine(self.engine, self.engine_options)

    def argv(self, version: str) -> list[str]:
        return self.engine_impl().argv(self, version)

    def environment(self, version: str) -> dict[str, str]:
        return self.engine_impl().environment(self, version)


def comment_text(text: str) -> str:
    """``text`` made safe for one ``#`` comment line: every control character (newline, carriage return,
    NUL, escape...) and every Unicode line or paragraph separator becomes a space, so nothing after it can
    start a new shell line."""
    return "".join(" " if unicodedata.category(c) in ("Cc", "Zl", "Zp") else c for c in text)


def render_script(launch: LaunchConfig, version: str, *, header: Sequence[str] = ()) -> str:
    """A runnable bash launch script: header comments, exports, then ``exec`` of the server.

    Header entries come from names and remote output (study, host, GPU): each is one comment line
    whatever it holds (:func:`comment_text`).
    """
    lines = ["#!/usr/bin/env bash"]
    lines += [f"# {comment_text(h)}" if h else "#" for h in header]
    lines.append("set -euo pipefail")
    env = launch.environment(version)
    for key in sorted(env):
        lines.append(f"export {key}={shlex.quote(env[key])}")
    argv = launch.argv(version)
    lines.append("exec " + " ".join(shlex.quote(a) for a in argv))
    return "\n".join(lines) + "\n"
