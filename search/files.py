"""Writing the files servetune hands to people (exported scripts, reports): whole or not at all."""

from __future__ import annotations

import contextlib
from pathlib import Path

from runners.errors import ConfigError


def write_file(path: Path, text: str, *, mode: int | None = None, parents: bool = False) -> None:
    """Write ``text`` to ``path`` whole or not at all (a temporary file renamed over it); a missing
    directory, a full disk or a directory in the way is one ConfigError line. ``parents``: create the
    directory first."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        if parents:
            path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        if mode is not None:
            tmp.chmod(mode)
        tmp.replace(path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from None
