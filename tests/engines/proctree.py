"""The real process tree of a server, read from /proc (the SSH host of the suite is this machine)."""

from __future__ import annotations

import os
import re
import stat
import tempfile
from pathlib import Path

# The engine tests import these two from here.
from tests.fixtures.procs import alive as live  # noqa: F401
from tests.fixtures.procs import wait_for  # noqa: F401


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def tree_members(pgid: int) -> list[int]:
    """Live processes whose process group or session is ``pgid``."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields and fields[0] != "Z" and (int(fields[2]) == pgid or int(fields[3]) == pgid):
                out.append(int(entry))
    return sorted(out)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {k: v for k, _, v in pairs}


def ppid(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[1]) if fields else None


_SOCKET_NAME = re.compile(r"^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$")


def vllm_temp_files() -> set[str]:
    """Files vLLM leaves in a temp dir (notes §2) that are in the system one: none may appear."""
    out = set()
    tmp = Path(tempfile.gettempdir())
    for p in tmp.iterdir():
        name = p.name
        if name.startswith(("vllm_dist_", "torchinductor_")):
            out.add(name)
            continue
        try:
            if _SOCKET_NAME.match(name) and stat.S_ISSOCK(p.lstat().st_mode):
                out.add(name)
        except OSError:
            continue
    return out
