"""Checks of a space's ``fixed_args`` that every trial would otherwise pay for.

servetune passes the server its own ``--host``/``--port`` and model flag; a fixed arg that sets them again
would make the server bind elsewhere (``--host=127.0.0.2``) or load another model. Both engines parse with
``argparse`` and ``allow_abbrev`` on (sglang-facts §1.0; vLLM's ``FlexibleArgumentParser`` also reads ``_``
as ``-`` in flag names), so a flag can be spelt ``--port 1``, ``--port=1``, ``--por 1``, ``--po=1``,
``--model_path=...``. :func:`bind_flag` therefore refuses *every* prefix of those flags (three characters
or more), alone or with ``=value``. That is a superset of the prefixes argparse accepts, so no spelling
slips through without checking either engine's full flag list (the reference has none): the prefixes that
are ambiguous (``--p``, ``--h``) end every trial in an argparse error anyway, so refusing them costs
nothing. The one cost would be a real engine flag that is itself a proper prefix of ``--host``,
``--port`` or ``--model-path``; none is known.

:func:`fixed_args_problem` adds what else every trial would die of: an empty argument, a NUL byte (no
argv can carry one), and a searched knob's own flag (the engine takes whichever comes last, so either the
fixed value or the search is silently lost), matched as argparse matches it: ``--mem-fraction 0.95`` is a
unique prefix of ``--mem-fraction-static`` and sets it (the trial would record the searched value and run with
0.95). Every prefix of a searched flag (three characters or more) is refused, as for the bind flags: a prefix
that is ambiguous in the engine ends every trial in an argparse error anyway.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["BIND_FLAGS", "MODEL_FLAGS", "bind_flag", "fixed_args_problem", "flag_of"]

BIND_FLAGS = ("--host", "--port")
MODEL_FLAGS = ("--model-path", "--model")
_MIN_PREFIX = 3  # "--x": a lone "--" is argparse's end of options, not a flag


def flag_of(arg: str) -> str | None:
    """The flag an argument names, as argparse reads it: ``--por_t=1`` -> ``--por-t``; None if not a flag."""
    if not arg.startswith("--") or len(arg) < _MIN_PREFIX:
        return None
    return arg.split("=", 1)[0].replace("_", "-")


def bind_flag(arg: str) -> str | None:
    """The servetune-owned flag (``--host``, ``--port``, ``--model-path``/``--model``) that ``arg`` would set
    in any spelling argparse may accept; None when it sets none of them."""
    flag = flag_of(arg)
    if flag is None:
        return None
    if flag in (*BIND_FLAGS, *MODEL_FLAGS):
        return flag
    return next((full for full in (*BIND_FLAGS, "--model-path") if full.startswith(flag)), None)


def fixed_args_problem(args: Iterable[str], knob_flags: Mapping[str, Iterable[str]] | None = None) -> str | None:
    """A one-line reason why every trial launched with these ``fixed_args`` would fail or mislead, or None.

    ``knob_flags``: for each searched knob, every spelling of its flag (all engine versions).
    """
    searched = {flag: knob for knob, flags in (knob_flags or {}).items() for flag in flags}
    for i, arg in enumerate(args):
        if arg == "":
            return f"fixed_args[{i}] is an empty argument (the engine would read it as a stray positional)"
        if "\0" in arg:
            return f"fixed_args[{i}] contains a NUL byte, which no command line can carry"
        owned = bind_flag(arg)
        if owned is not None:
            what = {"--port": "the space's port", "--host": "servetune (127.0.0.1)"}.get(
                owned, "the space's model_path")
            return f"fixed_args must not set {owned} ({arg!r} at [{i}]): it comes from {what}"
        flag = flag_of(arg)
        if flag is None:
            continue
        if flag in searched:
            return (f"fixed_args[{i}] {arg!r} is the flag of knob {searched[flag]!r}, which the search "
                    "sets on every trial; remove it from fixed_args or the knob from knobs")
        longer = sorted(full for full in searched if full.startswith(flag))
        if longer:
            return (f"fixed_args[{i}] {arg!r} is an abbreviation argparse expands to {longer[0]}, the flag of knob "
                    f"{searched[longer[0]]!r}, which the search sets on every trial; remove it from fixed_args or "
                    "the knob from knobs")
    return None
