"""What the controller keeps of a server's log: its head and its tail, never the whole.

A server may log hundreds of MB (a chatty dependency, a warning per request). The controller follows every
line (the engine's parser sees them all, or all the host's follow script sends), but keeps only the first
:data:`HEAD_BYTES` and the last :data:`TAIL_BYTES`, so its memory stays flat whatever the log's size, and
every copy made from it (the artifact on disk, the artifact store, MLflow, the dashboard) is capped too.
:meth:`LogKeep.text` says how much was left out, and the log's whole size.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

__all__ = ["HEAD_BYTES", "LINE_BYTES", "TAIL_BYTES", "LogKeep"]

#: Kept from the log's start (the server's arguments, model loading, the memory figures).
HEAD_BYTES = 1024 * 1024
#: Kept from its end (how it died, the last batches).
TAIL_BYTES = 4 * 1024 * 1024
#: A longer line is cut (with a note of its length).
LINE_BYTES = 16 * 1024


class LogKeep:
    """The head and tail of a log fed one line at a time; sized in characters (UTF-8 text is mostly ASCII)."""

    def __init__(self, *, head_bytes: int = HEAD_BYTES, tail_bytes: int = TAIL_BYTES,
                 line_bytes: int = LINE_BYTES) -> None:
        self.head_bytes, self.tail_bytes, self.line_bytes = head_bytes, tail_bytes, line_bytes
        self._head: list[str] = []
        self._head_size = 0
        self._tail: deque[str] = deque()
        self._tail_size = 0
        self.lines = 0
        """Lines fed in all."""
        self.size = 0
        """Characters fed in all (newlines included)."""
        self.dropped_lines = 0

    def append(self, line: str) -> None:
        self.lines += 1
        self.size += len(line) + 1
        if len(line) > self.line_bytes:
            line = f"{line[:self.line_bytes]} [servetune: line cut, {len(line)} characters]"
        if self._head_size + len(line) + 1 <= self.head_bytes and not self._tail:
            self._head.append(line)
            self._head_size += len(line) + 1
            return
        self._tail.append(line)
        self._tail_size += len(line) + 1
        while self._tail_size > self.tail_bytes and len(self._tail) > 1:
            self._tail_size -= len(self._tail.popleft()) + 1
            self.dropped_lines += 1

    def __len__(self) -> int:
        return len(self._head) + len(self._tail)

    def __bool__(self) -> bool:
        return self.lines > 0

    def __iter__(self) -> Iterator[str]:
        """The lines kept (head, then tail)."""
        yield from self._head
        yield from self._tail

    def last(self, n: int) -> list[str]:
        """The last ``n`` lines kept."""
        if n <= 0:
            return []
        if n <= len(self._tail):
            return list(self._tail)[-n:]
        return self._head[-(n - len(self._tail)):] + list(self._tail)

    def text(self) -> str:
        """The kept lines as a log, with one line where the middle was left out saying how much, and the
        log's whole size."""
        if not self.lines:
            return ""
        parts = list(self._head)
        if self.dropped_lines:
            kept = self._head_size + self._tail_size
            parts.append(f"[servetune: {self.dropped_lines} lines ({_mib(self.size - kept)}) of the server log "
                         f"left out here; the log was {self.lines} lines, {_mib(self.size)}; kept: the first "
                         f"{_mib(self._head_size)} and the last {_mib(self._tail_size)}]")
        parts.extend(self._tail)
        return "\n".join(parts) + "\n"


def _mib(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MiB"
