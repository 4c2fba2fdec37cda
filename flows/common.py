"""What every stage flow shares: settings and paths, metrics files, and a clean exit."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from qpr.config import Settings, SettingsError, load_settings
from qpr.data.loaders import DataFormatError
from qpr.environment import project_root
from qpr.paths import ProjectPaths
from qpr.quality.gate import GateFailed


def settings_and_paths(params: str | Path | None = None) -> tuple[Settings, ProjectPaths]:
    """Settings from `params` (default: the project's params.yaml); stage outputs go beside
    the params file, so a run on a params file elsewhere never touches this project."""
    params_path = Path(params).resolve() if params else project_root() / "params.yaml"
    return load_settings(params_path), ProjectPaths(params_path.parent)


def write_metrics(path: Path, metrics: Mapping[str, Any]) -> Path:
    """The stage's metrics as JSON, written by the stage itself (dvc metrics reads it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(metrics), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


# Errors a user can act on: shown as one clear message, not a stack trace.
EXPECTED_ERRORS = (GateFailed, DataFormatError, SettingsError, FileNotFoundError)


def main(flow: Callable[..., Any], **kwargs: Any) -> None:
    """Run a flow as a script (what a DVC stage command does); exit 1 with the reason."""
    try:
        flow(**kwargs)
    except EXPECTED_ERRORS as err:
        print(f"\nERROR: {err}", file=sys.stderr)
        raise SystemExit(1) from None
