"""The service's query log and feedback: what was asked, what was answered, what people
made of it; written off the request path, read back for retraining and monitoring.

- `qpr.querylog.log_records`: the format (two JSON Lines streams, queries and feedback);
- `qpr.querylog.log_writer`: `QueryLog`, the bounded queue and the rotating files;
- `qpr.querylog.log_reader`: `read_queries`, `read_feedback`, `read_joined`;
- `qpr.querylog.personal_data`: `redact_personal`, applied to every logged question.

The service writes it (`QPR_SERVE_QUERY_LOG`, docs/serving.md); a Python program may too:

    with QueryLog("logs/service") as log:
        log.feedback(request_id, "taken")

The names below are loaded on first use: the writer's side does not import pandas.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "LogLimits": "log_writer",
    "QueryLog": "log_writer",
    "read_feedback": "log_reader",
    "read_joined": "log_reader",
    "read_queries": "log_reader",
    "redact_personal": "personal_data",
    "FEEDBACK": "log_records",
    "OUTCOMES": "log_records",
    "QUERIES": "log_records",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
