"""The engines' own flag tables: which launch flags and environment variables a release has, and what they take.

A space may search any engine flag (``knobs.flags``) and environment variable (``knobs.env``) besides the named
knobs. Each is checked here against the table of the release on the host, shipped in ``data/flags-<engine>.json``
and regenerated from the releases' own argparse parsers by ``tests/engines/flag_tables.py`` (``make
flag-tables``). A version between two tabled releases is checked against the older one; an unknown version (the
host says later) against the newest; the run checks again once the host names its version.

A problem is one line naming the flag, the release and what is allowed, with the closest name where one is close.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from runners.errors import did_you_mean

__all__ = ["Flag", "FlagTable", "flag_args", "flag_table", "tabled_releases"]

DATA = Path(__file__).with_name("data")


def parse_version(text: str) -> tuple[int, ...]:
    """``0.5.10`` (``v0.5.10``, ``0.5.10.post1``) -> ``(0, 5, 10)``: the parts compared to pick a table."""
    m = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    if m is None:
        raise ValueError(f"not a version: {text!r}")
    return tuple(int(p or 0) for p in m.groups())

FlagKind = Literal["switch", "int", "float", "str", "list"]


@dataclass(frozen=True)
class Flag:
    """One option of a release's parser: what it takes, and its choices where the parser lists them."""

    name: str
    kind: FlagKind
    choices: tuple[str, ...] | None
    dest: str


@dataclass(frozen=True)
class FlagTable:
    """The flags and environment variables of one release of one engine."""

    engine: str
    release: str
    flags: Mapping[str, Flag]
    env: frozenset[str]
    env_prefix: str

    def flag_problem(self, flag: str, values: Iterable[Any]) -> str | None:
        """One line saying why ``flag`` with any of ``values`` would be refused by this release, or None."""
        spec = self.flags.get(flag)
        where = f"{self.engine} {self.release}"
        if spec is None:
            return f"{flag} is not a flag of {where}{did_you_mean(flag, self.flags)}"
        for value in values:
            problem = _value_problem(spec, value)
            if problem is not None:
                return f"{flag}={value!r}: {problem} ({where})"
        return None

    def resolve(self, flag: str) -> str | None:
        """The flag ``flag`` names as the release's argparse reads it: the flag itself, its ``_``-for-``-``
        spelling (vLLM's parser reads both), or the one flag it is a unique abbreviation of (argparse's
        ``allow_abbrev``, on in both engines); None when it names none (unknown or ambiguous)."""
        for name in dict.fromkeys((flag, flag.replace("_", "-"))):
            if name in self.flags:
                return name
        longer = [f for f in self.flags if f.startswith(flag.replace("_", "-"))]
        return longer[0] if len(longer) == 1 else None

    def args_problem(self, args: Sequence[str], also: Iterable[str] = ()) -> str | None:
        """One line naming the first of ``args`` (a space's ``fixed_args``, argv words) that this release's parser
        would refuse: a long flag it does not have (or an ambiguous abbreviation), a switch given a value, a flag
        left without its value, a value of the wrong kind or not among its choices; None when it takes them all.

        ``also``: flags the engine takes that the table does not list (its short spellings, e.g. vLLM's ``-tp``).
        Other single-dash words are not checked (the tables list long options only), nor are positionals."""
        words = list(args)
        extra = set(also)
        i = 0
        while i < len(words):
            word = words[i]
            i += 1
            if not word.startswith("--") or len(word) < 3:
                continue
            given, eq, _value = word.partition("=")
            if given in extra:
                i += 0 if eq else 1
                continue
            name = self.resolve(given)
            where = f"{self.engine} {self.release}"
            if name is None:
                close = [f for f in self.flags if f.startswith(given.replace("_", "-"))]
                if len(close) > 1:
                    return (f"{given} is ambiguous in {where}: it abbreviates {', '.join(sorted(close)[:4])}"
                            f"{' ...' if len(close) > 4 else ''}; spell the flag out")
                return f"{given} is not a flag of {where}{did_you_mean(given, self.flags)}"
            problem, i = self._value_at(given, word, self.flags[name], words, i)
            if problem is not None:
                return problem
        return None

    def _value_at(self, given: str, word: str, spec: Flag, words: Sequence[str], i: int) -> tuple[str | None, int]:
        """What is wrong with the value(s) of flag ``given`` (the word ``word``, whose values start at ``words[i]``),
        and the index of the next word."""
        where = f"{self.engine} {self.release}"
        _flag, eq, inline = word.partition("=")
        if spec.kind == "switch":
            return (f"{given} is a switch in {where}: it takes no value (got {word!r})" if eq else None), i
        if spec.kind == "list":
            if eq:
                return None, i
            start = i
            while i < len(words) and not _is_flag(words[i]):
                i += 1
            return (f"{given} needs at least one value in {where}" if i == start else None), i
        if eq:
            value = inline
        elif i < len(words) and not _is_flag(words[i]):
            value, i = words[i], i + 1
        else:
            return f"{given} needs a value ({spec.kind}) in {where}", i
        problem = _value_problem(spec, _typed(spec, value))
        return (None if problem is None else f"{given} {value}: {problem} ({where})"), i

    def env_problem(self, name: str) -> str | None:
        """Why ``name`` is not a variable this release reads (engine-prefixed names only), or None."""
        if not name.startswith(self.env_prefix) or name in self.env:
            return None
        return (f"{name} is not an environment variable {self.engine} {self.release} reads"
                f"{did_you_mean(name, self.env)}")


def _value_problem(spec: Flag, value: Any) -> str | None:
    if value is None:
        return None  # the flag left out: the engine's default
    if spec.kind == "switch":
        return None if isinstance(value, bool) else "a switch takes true (given) or false (left out)"
    if isinstance(value, bool):
        return f"takes a value ({spec.kind}), not true/false"
    if spec.kind == "int" and not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
        return "takes an integer"
    if spec.kind == "float" and not isinstance(value, int | float):
        return "takes a number"
    if spec.choices is not None and spec.kind != "list" and str(value) not in spec.choices:
        return f"not one of its choices{did_you_mean(str(value), spec.choices)}; allowed: {', '.join(spec.choices)}"
    return None


def _is_flag(word: str) -> bool:
    """Whether argparse reads ``word`` as an option (``-0.5`` and ``-1`` are values)."""
    return word.startswith("-") and len(word) > 1 and not re.fullmatch(r"-\d+(?:\.\d*)?(?:[eE][-+]?\d+)?", word)


def _typed(spec: Flag, text: str) -> Any:
    """A fixed argument's text as the kind of value its flag takes (left as text when it is not one, so that
    :func:`_value_problem` names what is wrong)."""
    try:
        if spec.kind == "int":
            return int(text)
        if spec.kind == "float":
            return float(text)
    except ValueError:
        return text
    return text


def flag_args(flag: str, value: Any) -> list[str]:
    """``flag`` with ``value`` as argv words: true -> the flag alone, false or None -> nothing (the default), a
    list -> the flag then each item, anything else -> the flag and its text."""
    if value is None or value is False:
        return []
    if value is True:
        return [flag]
    if isinstance(value, list | tuple):
        return [flag, *(str(v) for v in value)]
    if isinstance(value, float):
        return [flag, repr(round(value, 6))]
    return [flag, str(value)]


@cache
def _data(engine: str) -> Mapping[str, Any]:
    path = DATA / f"flags-{engine}.json"
    return json.loads(path.read_text()) if path.exists() else {"releases": {}}


def tabled_releases(engine: str) -> list[str]:
    """The releases whose tables ship, oldest first."""
    return sorted(_data(engine)["releases"], key=parse_version)


@cache
def flag_table(engine: str, version: str | None) -> FlagTable | None:
    """The table that answers for ``engine`` at ``version`` (the newest tabled release at or below it; the oldest
    below every tabled one; the newest when ``version`` is None), or None when none ships."""
    releases = tabled_releases(engine)
    if not releases:
        return None
    if version is None:
        release = releases[-1]
    else:
        v = parse_version(version)
        older = [r for r in releases if parse_version(r) <= v]
        release = older[-1] if older else releases[0]
    raw = _data(engine)["releases"][release]
    flags = {name: Flag(name, spec["kind"], tuple(spec["choices"]) if spec.get("choices") else None,
                        spec.get("dest", ""))
             for name, spec in raw["flags"].items()}
    prefix = {"sglang": "SGLANG_", "vllm": "VLLM_"}.get(engine, "")
    return FlagTable(engine, release, flags, frozenset(raw.get("env", ())), prefix)
