"""MLflow adapter: one MLflow run per flow run, tagged so any number can be traced back to
the code (git commit), the data (DVC hash) and the stage that produced it."""

from __future__ import annotations

import math
import os
import subprocess
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlflow
import yaml
from mlflow.tracking import MlflowClient

from qpr.config import Settings
from qpr.io import digest
from qpr.version import __version__


def git_commit(root: Path) -> tuple[str, bool]:
    """(commit, dirty) of the work tree; ("unknown", False) outside a git checkout."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown", False
    return commit, bool(status.strip())


def data_hash(settings: Settings, root: Path) -> str:
    """The DVC hash of the data when data.dvc tracks it, else a content hash of the file(s)."""
    data_path = Path(settings.data.path)
    dvc_file = root / "data.dvc"
    inside_tracked = not data_path.is_absolute() and data_path.parts[:1] == ("data",)
    if inside_tracked and dvc_file.is_file():
        outs = yaml.safe_load(dvc_file.read_text(encoding="utf-8")).get("outs", [])
        if outs and "md5" in outs[0]:
            return f"dvc:{outs[0]['md5']}"
    files = [data_path] if data_path.is_file() else sorted(data_path.rglob("*"))
    parts = [part for file in files if file.is_file() for part in (file.name, file)]
    return f"sha256:{digest(*parts)}"


def _ensure_experiment(name: str) -> str:
    client = MlflowClient()
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    artifacts = os.environ.get("QPR_MLFLOW_ARTIFACTS")
    local = mlflow.get_tracking_uri().startswith("sqlite:")
    return client.create_experiment(name, artifact_location=artifacts if local else None)


def _flow_run_id() -> str | None:
    try:
        from prefect.runtime import flow_run

        return flow_run.id
    except Exception:  # outside a flow run, or Prefect not configured
        return None


@contextmanager
def stage_run(
    stage: str,
    settings: Settings,
    *,
    root: Path | None = None,
    extra_params: Mapping[str, Any] = (),
    scrub: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> Iterator[mlflow.ActiveRun]:
    """Open an MLflow run for one stage, with params, and tags; a failure marks it FAILED.
    `scrub` rewrites the params and the tags first (the retrain flow masks credentials)."""
    root = (root or Path.cwd()).resolve()
    experiment_id = _ensure_experiment(settings.mlflow.experiment)
    commit, dirty = git_commit(root)
    tags = {
        "qpr.stage": stage,
        "qpr.version": __version__,
        "qpr.data_source": settings.data.source,
        "qpr.data_hash": data_hash(settings, root),
        "mlflow.source.git.commit": commit,
        "git.dirty": str(dirty).lower(),
    }
    flow_run_id = _flow_run_id()
    if flow_run_id:
        tags["prefect.flow_run_id"] = str(flow_run_id)
    params = {**settings.flat(), **dict(extra_params)}
    if scrub is not None:
        params, tags = scrub(params), scrub(tags)
    with mlflow.start_run(experiment_id=experiment_id, run_name=stage, tags=tags) as run:
        mlflow.log_params(params)
        yield run


def log_metrics(metrics: Mapping[str, float | int], step: int | None = None) -> None:
    mlflow.log_metrics({k: float(v) for k, v in metrics.items()}, step=step)


def log_artifacts(paths: Mapping[str, Path]) -> None:
    """Log files or directories under the given artifact sub-paths; missing paths are skipped."""
    for artifact_path, path in paths.items():
        path = Path(path)
        if path.is_dir():
            mlflow.log_artifacts(str(path), artifact_path=artifact_path)
        elif path.is_file():
            mlflow.log_artifact(str(path), artifact_path=artifact_path)


def find_evaluate_run(experiment: str, metrics: Mapping[str, Any]) -> mlflow.entities.Run | None:
    """The finished evaluate run that logged these very metrics (newest first), if any.

    Matching on the measures rather than taking the newest run keeps a stale or a
    concurrent evaluate run from lending its commit and data hash to this model.
    """
    wanted = {
        key: value
        for key, value in (
            ("success_1", metrics.get("success_1")),
            ("recip_rank", metrics.get("recip_rank")),
            ("val.success_1", (metrics.get("val") or {}).get("success_1")),
        )
        if isinstance(value, int | float)
    }
    try:
        runs = mlflow.search_runs(
            experiment_names=[experiment],
            filter_string="tags.`qpr.stage` = 'evaluate' and attributes.status = 'FINISHED'",
            order_by=["attributes.start_time DESC"],
            max_results=20,
            output_format="list",
        )
    except mlflow.exceptions.MlflowException:
        return None
    for run in runs:
        logged = run.data.metrics
        if wanted and all(
            key in logged and math.isclose(logged[key], value, rel_tol=0, abs_tol=1e-9)
            for key, value in wanted.items()
        ):
            return run
    return None


def evaluate_provenance(experiment: str, metrics: Mapping[str, Any]) -> dict[str, str]:
    """Registry tags from the evaluate run that produced `metrics`: its id, commit and data
    hash (empty when no such run is found)."""
    from qpr.ops import registry

    evaluated = find_evaluate_run(experiment, metrics)
    if evaluated is None:
        return {}
    run_tags = evaluated.data.tags
    tags = {"qpr.evaluate_run_id": evaluated.info.run_id}
    for source, target in (
        ("mlflow.source.git.commit", registry.TAG_GIT_COMMIT),
        ("qpr.data_hash", registry.TAG_DATA_HASH),
    ):
        if source in run_tags:
            tags[target] = run_tags[source]
    return tags


def log_epoch(record: Mapping[str, Any]) -> None:
    """One training epoch's figures as MLflow metrics at step = epoch; "epoch/..." keeps
    the learning curves apart from the stage's final (best) metrics."""
    step = int(record["epoch"])
    mlflow.log_metrics(
        {
            f"epoch/{k}": float(v)
            for k, v in record.items()
            if k != "epoch" and isinstance(v, int | float)
        },
        step=step,
    )


def log_pytorch_model(encoder: Any) -> None:
    """The trained encoder in MLflow's pytorch flavour (pickle format: no fixed shapes)."""
    import importlib.metadata

    import mlflow.pytorch

    requirements = [f"torch=={importlib.metadata.version('torch').split('+')[0]}"]
    if getattr(encoder, "name", None) == "transformer":
        # The pickled BertModel needs transformers to unpickle; the weights travel with it.
        requirements.append(f"transformers=={importlib.metadata.version('transformers')}")
    mlflow.pytorch.log_model(
        encoder, name="encoder", serialization_format="pickle", pip_requirements=requirements
    )
