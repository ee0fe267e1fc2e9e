"""The command line's output boundary: every character a terminal would act on is escaped before it is shown.

What servetune prints carries text from hosts (a server's error line, a GPU name, a lease's fields) and from
stored studies. :class:`SafeConsole` passes each piece of text rich renders through
:func:`~search.outputs.text.terminal_safe`, leaving rich's own styles and cursor control alone;
:func:`safe_write` does the same for the plain lines written to ``sys.stdout``/``sys.stderr``, and
:class:`SafeLogHandler` for log records.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from typing import Any, TextIO

from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment
from rich.text import Text

from search.outputs.text import terminal_safe

__all__ = ["SafeConsole", "SafeLogHandler", "safe_write"]


class SafeConsole(Console):
    """A rich console whose rendered text is :func:`terminal_safe`: strings are made safe before layout (so
    widths are right), and every segment that is not rich's own control on the way out."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(terminal_safe(text), **kwargs)

    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None) -> Iterable[Segment]:
        for segment in super().render(renderable, options):
            if segment.control or not segment.text:
                yield segment
            else:
                safe = terminal_safe(segment.text)
                yield segment if safe is segment.text else Segment(safe, segment.style)


def safe_write(text: str, stream: TextIO | None = None) -> None:
    """Write ``text`` to ``stream`` (default ``sys.stdout``) with control characters escaped."""
    (stream or sys.stdout).write(terminal_safe(text))


class SafeLogHandler(logging.Handler):
    """What Python's last-resort handler does (the message alone, WARNING and above, on the current
    ``sys.stderr``), with the message made :func:`terminal_safe`."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(terminal_safe(record.getMessage()) + "\n")
        except Exception:  # a logging handler never raises (as logging.StreamHandler)
            self.handleError(record)
