"""The simulated SGLang host (``runners.simhost.server``) as an engine.

It takes SGLang's flags for the emulated version and prints SGLang's log lines, so everything but the
module, the leading ``--sim-*`` flags and the version probe is :class:`~runners.engines.sglang.SGLangEngine`.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import ClassVar

from runners.engines.base import LaunchLike
from runners.engines.common import parse_version
from runners.engines.flags import FlagTable
from runners.engines.sglang import SGLangEngine, SimulatedLogParser
from runners.errors import ConfigError

__all__ = ["SimEngine"]


class SimEngine(SGLangEngine):
    """``python -m runners.simhost.server --sim-profile F --sim-speed K --sim-version X.Y.Z [SGLang flags]``.

    ``extra`` holds further simulator flags, rendered as ``--NAME VALUE`` after the standard ones
    (``{"sim-seed": "3"}`` -> ``--sim-seed 3``).
    """

    name: str = "sim"
    simulated: bool = True
    module: ClassVar[str] = "runners.simhost.server"

    def __init__(self, profile: str, speed: float = 1.0, version: str = "0.5.10",
                 extra: Mapping[str, str] | None = None) -> None:
        if not profile:
            raise ConfigError("the simulated host needs a profile file (engine.sim.profile)")
        if isinstance(speed, bool) or not isinstance(speed, int | float) or speed <= 0:
            raise ConfigError(f"sim speed must be a number > 0, got {speed!r}")
        parse_version(version)
        self.profile = str(profile)
        self.speed = float(speed)
        self.version = str(version)
        self.extra = {str(k): str(v) for k, v in (extra or {}).items()}

    def version_command(self, python: str) -> str:
        code = f"import runners.simhost.server; print({self.version!r})"
        return f"{shlex.quote(python)} -c {shlex.quote(code)}"

    def nccl_version_command(self, python: str) -> str:
        """The NCCL its profile names (the simulated host loads no torch)."""
        code = ("import sys; from runners.simhost.profile import load_profile; "
                "print(load_profile(sys.argv[1]).host.nccl_version)")
        return f"{shlex.quote(python)} -c {shlex.quote(code)} {shlex.quote(self.profile)}"

    def checkpoint_command(self, python: str, model_path: str) -> str:
        """The checkpoint its profile describes (the simulated host reads no model): a ``config.json`` and the
        weights' size, as a real host's checkpoint gives them."""
        return (f"{shlex.quote(python)} -m runners.simhost checkpoint --sim-profile {shlex.quote(self.profile)}"
                f" --model-path {shlex.quote(model_path)}")

    def _leading_args(self, launch: LaunchLike, version: str) -> list[str]:
        args = ["--sim-profile", self.profile, "--sim-speed", repr(self.speed), "--sim-version", version]
        for key, value in self.extra.items():
            args += ["--" + key.lstrip("-").replace("_", "-"), value]
        return args

    def inert_knobs(self, version: str | None) -> dict[str, str]:
        """SGLang's, for the emulated version (the simulated host gives an inert knob no effect either)."""
        return super().inert_knobs(version or self.version)

    def flag_table(self, version: str | None) -> FlagTable | None:
        """SGLang's, for the emulated version (the simulated host's parser takes every flag of that table)."""
        return super().flag_table(version or self.version)

    def parser(self) -> SimulatedLogParser:
        return SimulatedLogParser()
