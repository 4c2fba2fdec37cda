"""`printable`: text a file controls, made safe for a terminal, a log or a report."""

from __future__ import annotations

from qpr.errors import printable


def test_escape_sequences_are_shown_not_run() -> None:
    hostile = "timestamp,\x1b]0;title\x07\x1b[2J,\x9b31m"
    shown = printable(hostile)
    assert shown == "timestamp,\\x1b]0;title\\x07\\x1b[2J,\\x9b31m"
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in shown)


def test_newlines_stay_only_where_lines_are_meant() -> None:
    assert printable("a\nb\tc") == "a\\x0ab\\x09c"
    assert printable("a\nb\tc\r", multiline=True) == "a\nb\tc\\x0d"


def test_bidirectional_overrides_are_shown() -> None:
    assert printable("evil\u202etxt.csv") == "evil\\u202etxt.csv"


def test_plain_text_is_unchanged() -> None:
    assert printable("How do I reset my phone? [/] é 日本") == "How do I reset my phone? [/] é 日本"


def test_long_text_is_cut_with_a_note() -> None:
    assert printable("x" * 50, limit=10) == "xxxxxxxxxx... (40 more characters)"
    assert printable("short", limit=10) == "short"
