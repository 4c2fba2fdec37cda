"""What every stage flow shares: settings and paths, the MLflow run around a stage, its
metrics file, and a clean exit for a DVC stage command."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from flows import tracking
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


def _numbers(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Nested metrics → flat numeric ones for MLflow ("baselines.bm25.success_1")."""
    flat: dict[str, float] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_numbers(value, name + "."))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            flat[name] = float(value)
    return flat


def write_metrics(path: Path, metrics: Mapping[str, Any]) -> Path:
    """The stage's metrics as JSON, written by the stage itself (dvc metrics reads it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(metrics), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def run_stage(
    stage: str,
    settings: Settings,
    paths: ProjectPaths,
    work: Callable[[], Mapping[str, Any]],
    *,
    metrics_file: Path | None = None,
    artifacts: Mapping[str, Path] = (),
) -> dict[str, Any]:
    """Run `work` inside the stage's MLflow run; write and log its metrics and artifacts.

    A failed gate still logs the gate reports, and the run is marked FAILED."""
    gate_reports = paths.gate_reports(stage)
    with tracking.stage_run(stage, settings, root=paths.root):
        try:
            metrics = dict(work())
        except GateFailed:
            tracking.log_artifacts({"gates": gate_reports})
            raise
        target = write_metrics(metrics_file or paths.stage_metrics(stage), metrics)
        tracking.log_metrics(_numbers(metrics))
        tracking.log_artifacts({"gates": gate_reports, "metrics": target, **dict(artifacts)})
    return metrics


# Errors a user can act on: shown as one clear message, not a stack trace.
EXPECTED_ERRORS = (GateFailed, DataFormatError, SettingsError, FileNotFoundError)


def main(flow: Callable[..., Any], **kwargs: Any) -> None:
    """Run a flow as a script (what a DVC stage command does); exit 1 with the reason."""
    try:
        flow(**kwargs)
    except EXPECTED_ERRORS as err:
        print(f"\nERROR: {err}", file=sys.stderr)
        raise SystemExit(1) from None
