"""Credentials out of what the project says about itself: the service's responses and
log, and the tags, params and reports a retraining run writes to MLflow and to disk.

A registry URI may carry a password (``https://user:secret@host``) or a token in its query,
and MLflow repeats the URI word for word in its errors. Those errors reach /readyz,
/version, the log, a run's summary and its tags. `redact` replaces:

- the user-info of any URL (``scheme://user:password@`` → ``scheme://***@``);
- the value of a query parameter whose name says secret (token, password, key, ...);
- the value of every environment variable whose name says secret (``*PASSWORD*``,
  ``*TOKEN*``, ``*SECRET*``, ``*_KEY*``), wherever it appears.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

MASK = "***"
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@'\"]+@")
_SECRET_PARAM = re.compile(
    r"(?P<name>[?&;](?:[A-Za-z0-9_-]*(?:token|password|passwd|secret|key|signature|sig|auth))"
    r"=)[^&\s'\"]+",
    re.IGNORECASE,
)
_SECRET_ENV = re.compile(r"PASSWORD|PASSWD|TOKEN|SECRET|_KEY|CREDENTIAL", re.IGNORECASE)


def _env_secrets() -> list[str]:
    # Longest first, so a secret containing another is masked whole.
    values = {v for k, v in os.environ.items() if _SECRET_ENV.search(k) and len(v) >= 4}
    return sorted(values, key=len, reverse=True)


def redact(text: str) -> str:
    """`text` with URL credentials, secret query values and secret env values masked."""
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", text)
    text = _SECRET_PARAM.sub(lambda m: f"{m['name']}{MASK}", text)
    for secret in _env_secrets():
        text = text.replace(secret, MASK)
    return text


def redact_tree(value: Any) -> Any:
    """`redact` on every string of a JSON-like tree (dicts, lists, scalars)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redact_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_tree(v) for v in value]
    return value


class RedactingFilter(logging.Filter):
    """Masks credentials in a record's message and traceback before any handler sees it."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact(record.getMessage())
        record.args = None
        if record.exc_info:
            # Formatters print a cached exc_text instead of formatting exc_info again;
            # exc_info itself stays for handlers that inspect the exception.
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True
