"""The process environment every entry point shares (CLI, flows, tests, Makefile).

Prefect and MLflow read their settings from environment variables at import time, so
`apply()` must run before either is imported. Values already set by the caller win:
team mode is just `MLFLOW_TRACKING_URI` / `PREFECT_API_URL` pointing at servers.

Quiet by default: a run prints the stages' progress, warnings and errors. `QPR_LOG_LEVEL`
(INFO, DEBUG) brings back the frameworks' own lines, as `qpr --verbose` does.
"""

from __future__ import annotations

import logging
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


LOG_LEVEL_VARIABLE = "QPR_LOG_LEVEL"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# Where `qpr ui` serves the Prefect and MLflow UIs on this machine.
UI_HOST = "127.0.0.1"
PREFECT_UI_PORT = 4200
MLFLOW_UI_PORT = 5000

# Libraries that set their own logger to INFO or DEBUG when imported, whatever the root
# logger says (bm25s: "Building index from tokens"; GX: a line per temporary docs dir).
CHATTY_LOGGERS = ("bm25s", "great_expectations.data_context.types.base")
# Prefect's run loggers carry the stages' progress; of the engine's own lines on them only
# these add nothing to it (a failed state is logged at ERROR and stays).
ENGINE_CHATTER = ("Finished in state Completed",)
RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")


def project_root(start: Path | None = None) -> Path:
    """The nearest directory at or above `start` (default: cwd) holding params.yaml."""
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / "params.yaml").is_file():
            return candidate
    return here


# `dvc exp run --temp` and the queue run each experiment in a copy of the project under
# .dvc/tmp/exps/; its runs, registry versions and Prefect home belong to the project itself.
EXPERIMENT_COPY = (".dvc", "tmp", "exps")


def state_root(root: Path) -> Path:
    """The project that keeps the local state (MLflow store, Prefect home) for `root`:
    `root` itself, or the project above it when `root` is a DVC experiment's copy."""
    parts = root.parts
    for at in range(len(parts) - len(EXPERIMENT_COPY), 0, -1):
        if parts[at : at + len(EXPERIMENT_COPY)] == EXPERIMENT_COPY:
            return Path(*parts[:at])
    return root


def local_defaults(root: Path) -> dict[str, str]:
    """Absolute local locations, so DVC experiment temp dirs do not scatter state."""
    root = state_root(root)
    local = {
        "PREFECT_HOME": str(root / ".prefect"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
        "QPR_MLFLOW_ARTIFACTS": (root / "mlruns").as_uri(),
    }
    if not os.environ.get("PREFECT_API_URL"):
        # Runs go to a temporary API server over this home's database; their "View at"
        # links then point at `qpr ui`, which serves that database, not at the dead server.
        local["PREFECT_UI_URL"] = f"http://{UI_HOST}:{PREFECT_UI_PORT}"
    return local


def log_level() -> str | None:
    """The level QPR_LOG_LEVEL names (upper case), or None: quiet (also for a name that
    is not a level, rather than a stack trace from every framework's logging setup)."""
    level = os.environ.get(LOG_LEVEL_VARIABLE, "").strip().upper()
    return level if level in LEVELS else None


def logging_defaults(level: str | None) -> dict[str, str]:
    """The frameworks' logging variables for `level` (None: quiet, the default)."""
    if level is None:
        return {
            # The "prefect" logger carries the temporary server's banner; the run loggers
            # under it carry the stages' progress, which stays at INFO.
            "PREFECT_LOGGING_LEVEL": "WARNING",
            "PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL": "INFO",
            "PREFECT_LOGGING_LOGGERS_PREFECT_TASK_RUNS_LEVEL": "INFO",
            "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",
            "MLFLOW_LOGGING_LEVEL": "WARNING",
            # A bar redrawn into a log is one long line (the register stage downloads).
            "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        }
    return {
        "PREFECT_LOGGING_LEVEL": level,
        "PREFECT_SERVER_LOGGING_LEVEL": level if level == "DEBUG" else "WARNING",
        "MLFLOW_LOGGING_LEVEL": level,
    }


def set_log_level(level: str) -> None:
    """Ask for `level` here and in every process started from here (`qpr --verbose`):
    it overrides the quiet defaults that `apply()` may already have set."""
    if level.upper() not in LEVELS:
        raise ValueError(f"log level must be one of {LEVELS}, got {level!r}")
    os.environ[LOG_LEVEL_VARIABLE] = level.upper()
    for key in logging_defaults(None):
        os.environ.pop(key, None)
    os.environ.update(logging_defaults(level.upper()))


class _Drop(logging.Filter):
    """Drops a logger's records below `below`; with `prefixes`, only those that start so."""

    def __init__(self, below: int, prefixes: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.below = below
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= self.below:
            return True
        return bool(self.prefixes) and not str(record.msg).startswith(self.prefixes)


def quiet_loggers() -> None:
    """Hold the chatty libraries to QPR_LOG_LEVEL (default WARNING) and, when quiet, drop
    Prefect's "Finished in state Completed()". Filters, not levels: those libraries set
    their own level when imported, which may be after this runs."""
    level = log_level()
    below = getattr(logging, level or "WARNING")
    wanted = {name: _Drop(below) for name in CHATTY_LOGGERS}
    for name in RUN_LOGGERS:
        wanted[name] = _Drop(logging.WARNING, ENGINE_CHATTER) if level is None else None
    for name, new in wanted.items():
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, _Drop)]:
            logger.removeFilter(old)
        if new is not None:
            logger.addFilter(new)


def apply(root: Path | None = None) -> dict[str, str]:
    """Set every default that is not already set; return the values now in force."""
    root = project_root(root)
    wanted = {**QUIET_DEFAULTS, **local_defaults(root), **logging_defaults(log_level())}
    for key, value in wanted.items():
        os.environ.setdefault(key, value)
    return {key: os.environ[key] for key in wanted}
