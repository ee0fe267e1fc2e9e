"""Names that end up in paths and shell text: study names and environment variable names.

A study name becomes a directory on every host (``<runs root>/<study>/<trial>``), a directory under the
artifacts directory, an MLflow experiment and a comment line of ``launch.sh``. :func:`check_name` allows
only names that are safe in all of these: one path component (no ``/``, not ``.`` or ``..``, no ``..``
inside), printable ASCII letters, digits, ``.``, ``_`` and ``-``, starting with a letter or digit, at most
128 characters. Environment variable names must be shell identifiers (:func:`check_identifier`): a key is
written unquoted after ``export``.

Both raise ``ValueError`` with a one-line reason; callers map it to their own error (a space file's
``ConfigError``, a CLI option's one line).
"""

from __future__ import annotations

import re

__all__ = ["IDENTIFIER_RE", "NAME_MAX", "NAME_RE", "check_identifier", "check_name"]

NAME_MAX = 128
NAME_RE = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{NAME_MAX - 1}}}")
"""A study name (matched whole, with :func:`re.fullmatch`)."""
IDENTIFIER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""A shell variable name (matched whole)."""


def check_name(value: object, what: str = "study name") -> str:
    """``value`` if it is a safe study name (see the module docstring); else ValueError."""
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {type(value).__name__}")
    if not NAME_RE.fullmatch(value) or ".." in value:
        raise ValueError(f"{what} {value!r} is not allowed: use 1-{NAME_MAX} letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit, without '..'")
    return value


def check_identifier(value: object, what: str = "environment variable") -> str:
    """``value`` if it is a shell identifier (``[A-Za-z_][A-Za-z0-9_]*``); else ValueError."""
    if not isinstance(value, str) or not IDENTIFIER_RE.fullmatch(value):
        raise ValueError(f"{what} name {value!r} is not a shell identifier (letters, digits and '_', "
                         "not starting with a digit)")
    return value
