"""Rendering a launch: argv, environment and the bash launch script, from one launch value and one engine.

A trial runs the script this renders on the host, and ``servetune export`` renders it again from the same stored
launch value, so the two cannot drift. The launch is anything that satisfies :class:`~runners.engines.base.
LaunchLike` (``spaces.launch.LaunchConfig`` does); the engine is resolved once by the caller
(:func:`runners.engines.engine_for`) and passed in.
"""

from __future__ import annotations

import shlex
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from runners.engines.base import Engine, LaunchLike

__all__ = ["RenderedLaunch", "comment_text", "render", "render_script", "script_text"]


@dataclass(frozen=True)
class RenderedLaunch:
    """One launch rendered for one engine version: the server's argv, its environment and the script."""

    argv: list[str]
    env: dict[str, str]
    script: str


def comment_text(text: str) -> str:
    """``text`` made safe for one ``#`` comment line: every control character (newline, carriage return,
    NUL, escape...) and every Unicode line or paragraph separator becomes a space, so nothing after it can
    start a new shell line."""
    return "".join(" " if unicodedata.category(c) in ("Cc", "Zl", "Zp") else c for c in text)


def script_text(argv: Sequence[str], env: dict[str, str], header: Sequence[str]) -> str:
    """The bash launch script of ``argv`` with ``env`` exported: header comments, exports, ``exec``."""
    # Header entries come from names and remote output (study, host, GPU): each stays one comment line.
    lines = ["#!/usr/bin/env bash"]
    lines += [f"# {comment_text(h)}" if h else "#" for h in header]
    lines.append("set -euo pipefail")
    lines += [f"export {key}={shlex.quote(env[key])}" for key in sorted(env)]
    lines.append("exec " + " ".join(shlex.quote(a) for a in argv))
    return "\n".join(lines) + "\n"


def render(engine: Engine, launch: LaunchLike, version: str, *, header: Sequence[str] = ()) -> RenderedLaunch:
    """``launch`` for ``engine`` at ``version``. Raises ConfigError for a knob or value the engine refuses."""
    argv = engine.argv(launch, version)
    env = engine.environment(launch, version)
    return RenderedLaunch(argv=argv, env=env, script=script_text(argv, env, header))


def render_script(engine: Engine, launch: LaunchLike, version: str, *, header: Sequence[str] = ()) -> str:
    """A runnable bash launch script: header comments, exports, then ``exec`` of the server, every value
    shell-quoted."""
    return render(engine, launch, version, header=header).script
