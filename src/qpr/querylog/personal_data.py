"""Personal data out of logged questions: e-mail addresses, phone numbers, long digit runs.

People type their own details into a search box ("my order 48213377 never came", "call me
on +44 20 7946 0958"). The query log keeps questions for retraining and monitoring, not
those details, so `redact_personal` replaces them before a line is written:

- an e-mail address (``name@host.tld``) → ``<email>``;
- a phone number: 7 to 15 digits in two or more groups split by spaces, dashes, dots or a
  bracketed area code, or after ``+`` (``+1 (555) 123-4567``) → ``<phone>``; a date
  (``2026-11-28``, ``28.11.2026``), a range of years (``1990-2000``) and a decimal
  number are kept;
- a run of `MIN_DIGITS` or more digits, or more than 15 in groups (order, card and account
  numbers, one-time codes) → ``<number>``. Years and short numbers ("iphone 15", "in
  2019", "zip 10001") are kept.

The placeholders are words the tokeniser keeps, so a redacted question still searches.
Credentials in what the project says about itself are `qpr.redact`'s concern.
"""

from __future__ import annotations

import re

__all__ = ["MIN_DIGITS", "PLACEHOLDERS", "redact_personal"]

MIN_DIGITS = 6
PLACEHOLDERS = ("<email>", "<phone>", "<number>")

_EMAIL = re.compile(
    r"(?<![\w.+-])[A-Za-z0-9][A-Za-z0-9._%+-]*@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)+"
)
# A candidate phone number: digits, with at most two separators (space, dot, dash,
# bracket) between two digits, after an optional + or (; _phone decides.
_PHONE = re.compile(r"(?<![\w+.-])(?:\+ ?|\()?\d(?:[ .()\-]{0,2}\d)+\)?(?!\w)")
_DATE = re.compile(r"\d{4}[-./]\d{1,2}[-./]\d{1,2}|\d{1,2}[-./]\d{1,2}[-./]\d{2,4}")
_YEARS = re.compile(r"(?:19|20)\d\d-(?:19|20)\d\d")
_DECIMAL = re.compile(r"\d+\.\d+")
_DIGITS = re.compile(rf"(?<!\d)\d{{{MIN_DIGITS},}}(?!\d)")


def _phone(match: re.Match[str]) -> str:
    """<phone> for 7 to 15 digits split into groups (or after a +), <number> for more (a
    card number in groups of four); a date, a range of years or a decimal number is kept,
    and a plain digit run is left to _DIGITS."""
    text = match[0]
    digits = sum(c.isdigit() for c in text)
    grouped = text.startswith("+") or not text.isdigit()
    if digits < 7 or not grouped:
        return text
    if digits > 15:
        return "<number>"
    if _DATE.fullmatch(text) or _YEARS.fullmatch(text) or _DECIMAL.fullmatch(text):
        return text
    return "<phone>"


def redact_personal(text: str) -> str:
    """`text` with e-mail addresses, phone numbers and long digit runs replaced by
    ``<email>``, ``<phone>`` and ``<number>`` (see the module docstring)."""
    if "@" in text:
        text = _EMAIL.sub("<email>", text)
    if any(c.isdigit() for c in text):
        text = _PHONE.sub(_phone, text)
        text = _DIGITS.sub("<number>", text)
    return text
