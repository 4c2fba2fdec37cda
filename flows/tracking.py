"""MLflow adapter: one MLflow run per flow run, tagged so any number can be traced back to
the code (git commit), the data (DVC hash) and the stage that produced it.

Stage runs nest under one parent run per pipeline invocation, so MLflow's run list reads
like the pipeline: one row per `dvc repro`, DVC experiment, pipeline flow or retraining
cycle, its stages under it. Which parent a stage run takes, in this order:

1. the run named by `PARENT_RUN_ENV`: set by a caller that opened the parent itself (the
   retraining cycle for the `dvc repro` it starts, the in-process pipeline flow), which
   also closes it;
2. under DVC (`DVC_STAGE` set), the parent of that very dvc process: found by the tag
   `TAG_INVOCATION` (host, pid and start time of the nearest dvc process above this one,
   and the DVC experiment's name), else opened by the first stage that runs. A repro's
   stages run one at a time under one dvc process, so they share it; two repros are two
   processes (another pid, or another start time for a reused pid), so they never share
   one. Each stage leaves the parent's status as its own (FINISHED, or FAILED);
3. otherwise (a stage run by hand, `python -m flows.stage NAME`) no parent.

A parent is named by the DVC experiment when there is one, else "repro <commit>",
"pipeline <commit>" or "retrain <run>"; it carries the params and the headline numbers.
"""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import mlflow
import yaml
from mlflow.entities import Metric, Param
from mlflow.exceptions import MlflowException
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


Scrub = Callable[[dict[str, Any]], dict[str, Any]]

# A run id: the stage runs this process and its children start nest under it (rule 1).
PARENT_RUN_ENV = "QPR_MLFLOW_PARENT_RUN_ID"
DVC_STAGE_ENV = "DVC_STAGE"  # DVC sets it for every stage command it runs
DVC_EXPERIMENT_ENV = "DVC_EXP_NAME"  # `dvc exp run` names its experiment here
PARENT_STAGE = "pipeline"  # a parent run's qpr.stage
TAG_PIPELINE = "qpr.pipeline"  # what a parent groups: repro, experiment, pipeline
TAG_INVOCATION = "qpr.invocation"  # the dvc process a parent belongs to (rule 2)
TAG_EXPERIMENT = "qpr.dvc_experiment"
_PARENT_TAG = "mlflow.parentRunId"  # MLflow's own: how the UI nests a run


def _record(
    stage: str,
    settings: Settings,
    root: Path,
    extra_params: Mapping[str, Any],
    scrub: Scrub | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tags, params) of a run: the stage, the code, the data and every setting."""
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
    return tags, params


@contextmanager
def stage_run(
    stage: str,
    settings: Settings,
    *,
    root: Path | None = None,
    extra_params: Mapping[str, Any] = (),
    scrub: Scrub | None = None,
    run_name: str | None = None,
) -> Iterator[mlflow.ActiveRun]:
    """Open an MLflow run for one stage, with params, and tags, nested under its
    pipeline's parent run (the module's rules); a failure marks it FAILED. `scrub`
    rewrites the params and the tags first (the retrain flow masks credentials);
    `run_name` (default: the stage) is what the run list shows."""
    root = (root or Path.cwd()).resolve()
    experiment_id = _ensure_experiment(settings.mlflow.experiment)
    tags, params = _record(stage, settings, root, extra_params, scrub)
    parent, owned = _given_parent()
    if parent is None:
        parent = _dvc_parent(experiment_id, tags, params)
        owned = parent is not None
    try:
        with mlflow.start_run(
            experiment_id=experiment_id,
            run_name=run_name or stage,
            tags=tags,
            parent_run_id=parent,
        ) as run:
            mlflow.log_params(params)
            yield run
    except BaseException:
        if owned:
            _leave_parent(parent, "FAILED")
        raise
    if owned:
        _leave_parent(parent, "FINISHED")


@contextmanager
def parent_run(
    kind: str,
    name: str,
    settings: Settings,
    *,
    root: Path | None = None,
    scrub: Scrub | None = None,
) -> Iterator[str]:
    """A parent run for a pipeline run in this process (rule 1): every stage run started
    inside, here or in a child process, nests under it. Yields its id; FINISHED at the
    end, FAILED when the body raises."""
    root = (root or Path.cwd()).resolve()
    experiment_id = _ensure_experiment(settings.mlflow.experiment)
    tags, params = _record(PARENT_STAGE, settings, root, {}, scrub)
    run_id = _open_parent(experiment_id, name, {**tags, TAG_PIPELINE: kind}, params)
    try:
        with children_of(run_id):
            yield run_id
    except BaseException:
        MlflowClient().set_terminated(run_id, "FAILED")
        raise
    MlflowClient().set_terminated(run_id, "FINISHED")


@contextmanager
def children_of(run_id: str) -> Iterator[None]:
    """Stage runs started meanwhile, here or in a child process (which inherits the
    environment), nest under `run_id`; the environment is restored after."""
    before = os.environ.get(PARENT_RUN_ENV)
    os.environ[PARENT_RUN_ENV] = run_id
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(PARENT_RUN_ENV, None)
        else:
            os.environ[PARENT_RUN_ENV] = before


def _given_parent() -> tuple[str | None, bool]:
    """(the caller's parent run, False: its caller closes it), or (None, False) when
    none is given or it cannot be used (gone, deleted): the stage then runs on its own."""
    run_id = os.environ.get(PARENT_RUN_ENV, "").strip()
    if not run_id:
        return None, False
    try:
        usable = MlflowClient().get_run(run_id).info.lifecycle_stage == "active"
    except MlflowException:
        usable = False
    if not usable:
        print(
            f"MLflow parent run {run_id} ({PARENT_RUN_ENV}) not found: not nested", file=sys.stderr
        )
    return (run_id if usable else None), False


def dvc_invocation() -> str | None:
    """Who "one dvc command" is, for a stage process it started: "host:pid:start" of the
    nearest dvc process above this one, and the DVC experiment's name; None when no dvc
    process started this one (DVC_STAGE unset, or none found among the ancestors)."""
    if not os.environ.get(DVC_STAGE_ENV):
        return None
    try:
        import psutil  # a dependency of DVC itself
    except ImportError:
        return None
    try:
        ancestors = psutil.Process().parents()
    except psutil.Error:
        return None
    for process in ancestors:
        with suppress(psutil.Error):
            if _is_dvc(process.cmdline()):
                started = f"{process.create_time():.3f}"
                experiment = os.environ.get(DVC_EXPERIMENT_ENV, "")
                return f"{socket.gethostname()}:{process.pid}:{started}:{experiment}"
    return None


def _is_dvc(cmdline: list[str]) -> bool:
    """`dvc ...`, `python .../bin/dvc ...` (a console script) or `python -m dvc ...`."""
    names = {arg.replace("\\", "/").rsplit("/", 1)[-1].lower() for arg in cmdline[:2]}
    return bool({"dvc", "dvc.exe"} & names) or cmdline[1:3] == ["-m", "dvc"]


def _dvc_parent(
    experiment_id: str, tags: Mapping[str, Any], params: Mapping[str, Any]
) -> str | None:
    """The parent run of this dvc command (rule 2): found by its tag, else opened; marked
    RUNNING again while this stage runs."""
    key = dvc_invocation()
    if key is None:
        return None
    client = MlflowClient()
    found = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`{TAG_INVOCATION}` = '{_quote(key)}'",
        max_results=1,
    )
    if found:
        client.update_run(found[0].info.run_id, status="RUNNING")
        return found[0].info.run_id
    experiment = os.environ.get(DVC_EXPERIMENT_ENV)
    commit = str(tags.get("mlflow.source.git.commit", "unknown"))
    name = experiment or f"repro {commit[:7]}"
    parent_tags = {
        **{k: v for k, v in tags.items() if k not in ("qpr.stage", "prefect.flow_run_id")},
        "qpr.stage": PARENT_STAGE,
        TAG_PIPELINE: "experiment" if experiment else "repro",
        TAG_INVOCATION: key,
        **({TAG_EXPERIMENT: experiment} if experiment else {}),
    }
    return _open_parent(experiment_id, name, parent_tags, params)


def _open_parent(
    experiment_id: str, name: str, tags: Mapping[str, Any], params: Mapping[str, Any]
) -> str:
    client = MlflowClient()
    tags = {k: v for k, v in tags.items() if k != "prefect.flow_run_id"}
    run = client.create_run(experiment_id, tags={**tags, "qpr.stage": PARENT_STAGE}, run_name=name)
    items = [Param(key, str(value)) for key, value in params.items()]
    for start in range(0, len(items), 100):  # MLflow takes at most 100 params a call
        client.log_batch(run.info.run_id, params=items[start : start + 100])
    return run.info.run_id


def _leave_parent(run_id: str, status: str) -> None:
    """The stage's outcome as its parent's status (the last stage's is the repro's)."""
    try:
        MlflowClient().set_terminated(run_id, status)
    except MlflowException as exc:  # never fail a stage for its parent's status
        print(f"MLflow parent run {run_id}: status not set ({exc})", file=sys.stderr)


def log_parent_metrics(metrics: Mapping[str, float | int]) -> None:
    """Numbers of the active stage run on its parent too (the headline columns), so the
    run list compares repros and experiments by their parents' rows."""
    active = mlflow.active_run()
    parent = active.data.tags.get(_PARENT_TAG) if active is not None else None
    if not parent or not metrics:
        return
    now = int(time.time() * 1000)
    items = [Metric(key, float(value), now, 0) for key, value in metrics.items()]
    MlflowClient().log_batch(parent, metrics=items)


def _quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")


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
