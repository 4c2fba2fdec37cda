"""The process environment every entry point shares (CLI, flows, tests, Makefile).

Prefect and MLflow read their settings from environment variables at import time, so
`apply()` must run before either is imported. Values already set by the caller win:
team mode is just `MLFLOW_TRACKING_URI` / `PREFECT_API_URL` pointing at servers.
"""

from __future__ import annotations

import os
from pathlib import Path

QUIET_DEFAULTS: dict[str, str] = {
    "DO_NOT_TRACK": "1",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_SERVER_UI_ENABLED": "false",
    "PREFECT_UI_ENABLED": "false",
    "DVC_NO_ANALYTICS": "1",
    "GX_ANALYTICS_ENABLED": "false",
    "TOKENIZERS_PARALLELISM": "false",
    "GIT_PYTHON_REFRESH": "quiet",
}


def project_root(start: Path | None = None) -> Path:
    """The nearest directory at or above `start` (default: cwd) holding params.yaml."""
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / "params.yaml").is_file():
            return candidate
    return here


def local_defaults(root: Path) -> dict[str, str]:
    """Absolute local locations, so DVC experiment temp dirs do not scatter state."""
    return {
        "PREFECT_HOME": str(root / ".prefect"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
        "QPR_MLFLOW_ARTIFACTS": (root / "mlruns").as_uri(),
    }


def apply(root: Path | None = None) -> dict[str, str]:
    """Set every default that is not already set; return the values now in force."""
    root = project_root(root)
    wanted = {**QUIET_DEFAULTS, **local_defaults(root)}
    for key, value in wanted.items():
        os.environ.setdefault(key, value)
    return {key: os.environ[key] for key in wanted}
