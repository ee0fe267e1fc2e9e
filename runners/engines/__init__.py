"""Serving engines behind one seam (:class:`~runners.engines.base.Engine`) and the registry that names them.

``get_engine(name, options)`` is the only place an engine is chosen by name; adding an engine is one module
and one line in ``_REGISTRY``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from runners.engines.base import Engine, LaunchLike, LogParser
from runners.engines.sglang import SGLangEngine
from runners.engines.sim import SimEngine
from runners.engines.vllm import VLLMEngine
from runners.errors import ConfigError

__all__ = ["Engine", "LaunchLike", "LogParser", "engine_for", "engine_names", "get_engine"]


def _check_options(name: str, options: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ConfigError(f"unknown option(s) {', '.join(unknown)} for engine {name!r}; "
                          f"allowed: {', '.join(sorted(allowed)) or 'none'}")


def _sglang(options: Mapping[str, Any]) -> Engine:
    _check_options("sglang", options, set())
    return SGLangEngine()


def _vllm(options: Mapping[str, Any]) -> Engine:
    _check_options("vllm", options, {"device"})
    return VLLMEngine(device=str(options.get("device") or "gpu"))


def _sim(options: Mapping[str, Any]) -> Engine:
    _check_options("sim", options, {"profile", "speed", "version", "seed", "extra"})
    extra = {str(k): str(v) for k, v in dict(options.get("extra") or {}).items()}
    if options.get("seed") is not None:
        extra.setdefault("sim-seed", str(options["seed"]))
    return SimEngine(  # checks profile, speed and version
        profile=str(options.get("profile") or ""),
        speed=options.get("speed", 1.0),
        version=str(options.get("version") or "0.5.10"),
        extra=extra,
    )


_REGISTRY: dict[str, Callable[[Mapping[str, Any]], Engine]] = {
    "sglang": _sglang,
    "sim": _sim,
    "vllm": _vllm,
}


def engine_names() -> list[str]:
    return sorted(_REGISTRY)


def get_engine(name: str, options: Mapping[str, Any] | None = None) -> Engine:
    """The engine called ``name``, built from its ``options``. Raises ConfigError naming the allowed ones."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown engine {name!r}; allowed: {', '.join(engine_names())}") from None
    return factory(options or {})


def engine_for(launch: LaunchLike) -> Engine:
    """The engine that runs ``launch`` (its ``engine`` name and ``engine_options``). Resolve it once per trial
    and pass it on."""
    return get_engine(launch.engine, launch.engine_options)
