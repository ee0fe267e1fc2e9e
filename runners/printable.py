"""Text read from a host, made safe to print: terminal control characters escaped.

A server's error line, a GPU name from ``nvidia-smi``, a lease file's fields and a log excerpt are written by
programs servetune does not control. Printed raw, an ``ESC ]0;...`` sequence sets the terminal's title, ``ESC
[2J`` clears the screen, ``ESC ]8;;URL`` plants a hyperlink, a carriage return overwrites what the line said,
and a right-to-left override reverses it. :func:`printable` turns every such character into a visible escape
(``\\x1b``), so what was there can still be read and nothing acts on the terminal. The command line and the
reports call it at their output boundary (``search.outputs.text.terminal_safe``); :mod:`runners` calls it where
a foreign string enters a one-line error.
"""

from __future__ import annotations

import re

__all__ = ["printable"]

# C0 controls but tab and newline, DEL, C1 controls; line and paragraph separators; the bidirectional
# embeddings, overrides and isolates (Unicode TR9) and the marks that steer them.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_CONTROL_OR_NEWLINE = re.compile(_CONTROL.pattern[:-1] + "\n\t]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str, *, newlines: bool = True) -> str:
    """``text`` with every terminal control character written as a visible escape (``\\x1b``, ``\\u202e``);
    tab and newline are kept unless ``newlines`` is False (then they are escaped too: one line)."""
    pattern = _CONTROL if newlines else _CONTROL_OR_NEWLINE
    return pattern.sub(_escaped, text) if pattern.search(text) else text
