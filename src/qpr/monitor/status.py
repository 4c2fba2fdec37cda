"""The monitor's latest verdict, kept beside the query log it read.

The monitor flow writes ``<query log folder>/monitor.json`` after each report; the
service, which knows that folder already (``QPR_SERVE_QUERY_LOG``), shows it on
/metrics. One small file, so the service imports nothing of the monitor's measures.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qpr.io import write_json_atomic

__all__ = ["STATUS_FILE", "read_status", "status_of", "write_status"]

STATUS_FILE = "monitor.json"


def status_of(report: dict[str, Any], at: float) -> dict[str, Any]:
    """The part of a report the service shows: when, each measure's value and alarm."""
    return {
        "at": at,
        "alarms": list(report["alarms"]),
        "measures": {
            name: {"value": m["value"], "alarm": bool(m["alarm"])}
            for name, m in report["measures"].items()
        },
    }


def write_status(folder: Path, status: dict[str, Any]) -> Path:
    """Replace the folder's status file at once (a reader sees the old or the new)."""
    return write_json_atomic(Path(folder) / STATUS_FILE, status)


def read_status(folder: Path) -> dict[str, Any] | None:
    """The folder's status, or None when there is none or it does not parse."""
    try:
        status = json.loads((Path(folder) / STATUS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return status if isinstance(status, dict) and "measures" in status else None
