"""Credentials out of what the project says about itself: the service's responses and
log, and the tags, params and reports a retraining run writes to MLflow and to disk.

A registry URI may carry a password (``https://user:secret@host``) or a token in its query,
and MLflow repeats the URI word for word in its errors. Those errors reach /readyz,
/version, the log, a run's summary and its tags. `redact` replaces:

- the user-info of any URL (``scheme://user:password@`` → ``scheme://***@``);
- the value of a query parameter whose name says secret (token, password, key, ...);
- the value of every environment variable whose name says secret (``*PASSWORD*``,
  ``*TOKEN*``, ``*SECRET*``, ``*_KEY*``), wherever it appears.

`hide_paths` shortens absolute paths for /version and /readyz: where the service's files
live on the host is nobody's business but the operator's (who has the log).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import PurePosixPath
from typing import Any

MASK = "***"
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@'\"]+@")
_SECRET_PARAM = re.compile(
    r"(?P<name>[?&;](?:[A-Za-z0-9_-]*(?:token|password|passwd|secret|key|signature|sig|auth))"
    r"=)[^&\s'\"]+",
    re.IGNORECASE,
)
# An absolute POSIX path of two or more parts, alone or after a scheme ("local:/srv/m",
# "file:///srv/m"), not inside a URL ("https://h/a/b") or a one-part URI ("models:/qpr@x").
_ABS_PATH = re.compile(
    r"(?<![^\s'\"(=:\[,])(?:file://)?(/[^/\s'\"(),:\[\]]+(?:/[^/\s'\"(),:\[\]]+)+)"
)
# TOKEN but not TOKENIZERS_PARALLELISM (Hugging Face's switch, set for every stage).
_SECRET_ENV = re.compile(r"PASSWORD|PASSWD|TOKEN(?!IZER)|SECRET|_KEY|CREDENTIAL", re.IGNORECASE)
# A switch is no secret, and masking "false" wherever it appears would garble every record.
_SWITCHES = {"true", "false", "yes", "no", "on", "off", "none", "null"}


def _env_secrets() -> list[str]:
    # Longest first, so a secret containing another is masked whole.
    values = {
        v
        for k, v in os.environ.items()
        if _SECRET_ENV.search(k) and len(v) >= 4 and v.lower() not in _SWITCHES
    }
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


def hide_paths(value: Any, root: str | os.PathLike[str]) -> Any:
    """Every absolute path in the strings of a JSON-like tree made relative to `root` (the
    project directory), or cut to its last part when outside it."""
    if isinstance(value, str):
        base = PurePosixPath(os.fspath(root))

        def short(match: re.Match[str]) -> str:
            path = PurePosixPath(match[1].rstrip("."))
            tail = match[1][len(match[1].rstrip(".")) :]
            if path == base:
                return "." + tail
            if path.is_relative_to(base):
                return path.relative_to(base).as_posix() + tail
            return path.name + tail

        return _ABS_PATH.sub(short, value)
    if isinstance(value, dict):
        return {k: hide_paths(v, root) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [hide_paths(v, root) for v in value]
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
