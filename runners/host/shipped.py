"""The bash scripts servetune runs on a host: files in ``runners/host/scripts`` (shellcheck-clean, checked by
``tests/runners/test_host_scripts.py``), sent as text, so a host needs nothing of servetune installed.

A script takes its values as positional parameters: :func:`command` puts ``set --`` and the quoted values
before its text, so no value is ever pasted into shell code. A line ``. "${SERVETUNE_LIB:?}/NAME.sh"`` is
replaced by the text of ``scripts/lib/NAME.sh``; with ``SERVETUNE_LIB`` set to that folder the files also
run as they are.
"""

from __future__ import annotations

import functools
import re
import shlex
from importlib import resources
from importlib.resources.abc import Traversable

_LIB_LINE = re.compile(r'^\. "\$\{SERVETUNE_LIB:\?\}/([a-z_]+\.sh)"$', re.MULTILINE)


def folder() -> Traversable:
    """Where the scripts ship (``runners/host/scripts``); its ``lib`` holds the shared functions."""
    return resources.files(__package__).joinpath("scripts")


def names() -> list[str]:
    """Every script servetune runs on a host (the libraries in ``lib/`` are parts of them, not scripts)."""
    return sorted(p.name for p in folder().iterdir() if p.name.endswith(".sh"))


@functools.cache
def text(name: str) -> str:
    """Script ``name`` with its libraries inlined: the text that runs on the host."""
    if name not in names():
        raise ValueError(f"no host script {name!r}; shipped: {', '.join(names())}")
    lib = folder().joinpath("lib")
    return _LIB_LINE.sub(lambda m: lib.joinpath(m.group(1)).read_text().rstrip("\n"),
                         folder().joinpath(name).read_text())


def command(name: str, *args: str | int) -> str:
    """Shell text that runs script ``name`` with ``args`` as ``$1``, ``$2``, ... (each quoted)."""
    return " ".join(["set --", *(shlex.quote(str(a)) for a in args)]) + "\n" + text(name)
