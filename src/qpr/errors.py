"""The package's error base, and `printable`, which makes text a file controls safe to show.

Every error a user can act on (bad data, a failed gate, a bad setting, a missing or broken
bundle, a registry refusal) derives from `QPRError`, so a command line or a flow catches
one class and prints one clear message.

Each subclass also keeps the builtin base it always had (ValueError, RuntimeError,
FileNotFoundError), so code that caught those still does. Imports nothing of `qpr`."""

from __future__ import annotations

import re


class QPRError(Exception):
    """An error with a message meant for the person running QPR."""


# C0 controls, DEL and C1 controls: an ESC starts a terminal sequence (set the title, clear
# the screen), and a C1 CSI (\x9b) does the same without one. Tab and newline are kept only
# where text is meant to span lines. Bidirectional overrides reorder what a person reads.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_CONTROL_ONE_LINE = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: object, *, multiline: bool = False, limit: int | None = None) -> str:
    """`text` safe for a terminal, a log or a report: every control character shown as an
    escape (ESC → ``\\x1b``), so nothing a file holds can move the cursor or set a title.

    `multiline` keeps newlines and tabs. `limit` cuts text longer than that many characters
    (binary-looking column names, say), saying how much was left out.
    """
    text = str(text)
    cut = 0
    if limit is not None and len(text) > limit:
        text, cut = text[:limit], len(text) - limit
    safe = (_CONTROL if multiline else _CONTROL_ONE_LINE).sub(_visible, text)
    return f"{safe}... ({cut:,} more characters)" if cut else safe
