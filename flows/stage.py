"""One way to run a pipeline stage: a Prefect flow around the stage function of
`qpr.pipeline`, inside the stage's MLflow run. Each DVC stage's command is

    python -m flows.stage NAME [--params params.yaml]

The stage functions take settings and paths and return metrics; here they only get a
Prefect logger, their MLflow run, their metrics file and their artifacts.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlflow
from prefect import Flow, flow, task
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from flows import tracking
from flows.lifetime import flow_program
from qpr.artifacts import RERANK_DIR, STUDENT_DIR
from qpr.config import Settings, flatten, load_settings
from qpr.environment import math_summary, project_root
from qpr.errors import QPRError
from qpr.io import split_timings, write_json_atomic
from qpr.paths import ProjectPaths
from qpr.quality.gate import GateFailed

Log = Callable[[str], None]

# Errors a user can act on: shown as one clear message, not a stack trace.
EXPECTED_ERRORS = (QPRError, FileNotFoundError)


def settings_and_paths(params: str | Path | None = None) -> tuple[Settings, ProjectPaths]:
    """Settings from `params` (default: the project's params.yaml); stage outputs go beside
    the params file, so a run on a params file elsewhere never touches this project."""
    params_path = Path(params).resolve() if params else project_root() / "params.yaml"
    return load_settings(params_path), ProjectPaths(params_path.parent)


def _cluster(settings: Settings, paths: ProjectPaths, log: Log) -> Mapping[str, Any]:
    from flows.engine import mapper
    from qpr.pipeline.cluster import run_cluster

    result = run_cluster(
        settings,
        out_dir=paths.cluster_dir,
        report_dir=paths.gate_reports("cluster"),
        work_dir=paths.cluster_cache_dir,
        plot_path=paths.plots_dir / "cluster" / "coherence.png",
        engine=mapper(settings.engine, log=log),
        log=log,
    )
    return result.metrics


def _train(settings: Settings, paths: ProjectPaths, log: Log) -> Mapping[str, Any]:
    from qpr.pipeline.handoff import load_trained_encoder
    from qpr.pipeline.train import run_train

    def on_epoch(record: dict) -> None:
        tracking.log_epoch(record)
        log(
            f"epoch {int(record['epoch'])}: loss {record['train_loss']:.4f}, "
            f"val AUC {record['val_auc']:.4f}, val MRR {record['val_mrr']:.4f}, "
            f"{record['pairs_per_s']:.0f} pairs/s"
        )

    # A bar redrawn into a log file is noise; per-epoch log lines carry the same figures.
    result = run_train(settings, paths, on_epoch=on_epoch, progress=sys.stderr.isatty(), log=log)
    if mlflow.active_run() is not None:
        tracking.log_pytorch_model(load_trained_encoder(paths.encoder_checkpoint)[0])
    return result.metrics


def _export(settings: Settings, paths: ProjectPaths, log: Log) -> Mapping[str, Any]:
    from qpr.pipeline.export import run_export

    return run_export(settings, paths, log=log)


def _index(settings: Settings, paths: ProjectPaths, log: Log) -> Mapping[str, Any]:
    from flows.engine import mapper
    from qpr.pipeline.index import run_index

    return run_index(settings, paths, engine=mapper(settings.engine, log=log), log=log)


def _student(settings: Settings, paths: ProjectPaths, log: Log) -> Mapping[str, Any]:
    from qpr.pipeline.student import run_student

    return run_student(settings, paths, log=log)


def _rerank(settings: Settings, paths: ProjectPaths, log: Log) -> Mapping[str, Any]:
    from qpr.pipeline.rerank import run_rerank

    return run_rerank(settings, paths, log=log)


def _evaluate(settings: Settings, paths: ProjectPaths, log: Log) -> Mapping[str, Any]:
    from qpr.pipeline.evaluate import run_evaluate

    return run_evaluate(settings, paths, log=log)


def _register(settings: Settings, paths: ProjectPaths, log: Log) -> Mapping[str, Any]:
    import os

    from qpr.pipeline.register import DVC_EXPERIMENT_ENV, RETRAIN_RUN_ENV, run_register

    experiment = settings.mlflow.experiment
    result = run_register(
        settings,
        paths,
        provenance=lambda metrics: tracking.evaluate_provenance(experiment, metrics),
        log=log,
        # Inside a retraining cycle: register and decide only; the cycle promotes after
        # its commit point.
        cycle_run=os.environ.get(RETRAIN_RUN_ENV) or None,
        # `dvc exp run` names its experiment here: an experiment never moves the champion.
        experiment=os.environ.get(DVC_EXPERIMENT_ENV) or None,
    )
    mlflow.set_tags(
        {
            "qpr.registered_model": result["name"],
            "qpr.registered_version": str(result["version"]),
            "qpr.promoted": str(bool(result["promoted"])).lower(),
        }
    )
    return result


# What `dvc exp show` and `dvc metrics diff` print (dvc.yaml declares only these files as
# metrics): a handful of columns. The paper's P@N is trec_eval's success@N. Wall-clock
# figures (train minutes, query ms) are not among them: see split_timings.
# Each maps a column to the stage metric's dotted key.
TRAIN_HEADLINE = {"train_epochs": "epochs", "best_epoch": "best_epoch"}
EVALUATE_HEADLINE = {
    "test_p1": "success_1",
    "test_p10": "success_10",
    "test_mrr": "recip_rank",
    "val_mrr": "val.recip_rank",
}


@dataclass(frozen=True)
class Stage:
    """A pipeline stage as Prefect and MLflow see it."""

    name: str
    work: Callable[[Settings, ProjectPaths, Log], Mapping[str, Any]]
    description: str
    # Also written whole (timings included) to this file, outside DVC (evaluate: metrics.json).
    full_metrics: Callable[[ProjectPaths], Path] | None = None
    artifacts: Callable[[ProjectPaths], Mapping[str, Path]] = field(default=lambda _: {})
    headline: Mapping[str, str] = field(default_factory=dict)  # metrics/headline/NAME.json


STAGES: dict[str, Stage] = {
    stage.name: stage
    for stage in (
        Stage(
            "cluster",
            _cluster,
            "Cluster the questions of the configured data source into paraphrase clusters, "
            "split them 80:10:10 by cluster and generate positive pairs, behind quality gates.",
            artifacts=lambda p: {"plots": p.plots_dir / "cluster", "cluster": p.cluster_dir},
        ),
        Stage(
            "train",
            _train,
            "Train the question encoder on the training pairs; early stopping on validation; "
            "resumes from the last checkpoint after a kill.",
            artifacts=lambda p: {"plots": p.plots_dir / "train", "model": p.vocab},
            headline=TRAIN_HEADLINE,
        ),
        Stage(
            "export",
            _export,
            "Export the trained encoder to ONNX (dynamic batch and length) and check that "
            "ONNX Runtime gives the same vectors as torch, padding or not.",
            artifacts=lambda p: {"model": p.encoder_onnx},
        ),
        Stage(
            "index",
            _index,
            "Encode every index question and build the FAISS index (and BM25) from params.",
        ),
        Stage(
            "student",
            _student,
            "With student.enabled: train a query-only encoder into the index's vector space "
            "and export it; queries then go through it (an asymmetric bundle).",
            artifacts=lambda p: {"model": p.models_dir / STUDENT_DIR},
        ),
        Stage(
            "rerank",
            _rerank,
            "With rerank.enabled: train a cross-encoder on the training pairs with BM25 hard "
            "negatives and export it; the service re-ranks its top hits with it.",
            artifacts=lambda p: {"model": p.models_dir / RERANK_DIR},
        ),
        Stage(
            "evaluate",
            _evaluate,
            "Query the index with every test question (itself excluded), score with trec_eval "
            "measures, compare with the baselines, choose the no-answer threshold on val.",
            full_metrics=lambda p: p.evaluation_metrics,
            artifacts=lambda p: {
                "trec": p.evaluation_dir,
                "plots": p.plots_dir / "evaluate",
                "model": p.search_config,
            },
            headline=EVALUATE_HEADLINE,
        ),
        Stage(
            "register",
            _register,
            "Register the evaluated bundle; re-score the champion on the same validation "
            "queries and promote the new one only if it is better by registry.margin (inside "
            "a retraining cycle, after the cycle commits).",
        ),
    )
}


def _numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Nested metrics → flat numeric ones for MLflow ("baselines.bm25.success_1")."""
    return {
        name: float(value)
        for name, value in flatten(metrics).items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }


def write_metrics(path: Path, metrics: Mapping[str, Any]) -> Path:
    """The stage's metrics as JSON, written by the stage itself (dvc metrics reads it)."""
    return write_json_atomic(path, dict(metrics))


def headline_numbers(metrics: Mapping[str, Any], columns: Mapping[str, str]) -> dict:
    """The headline columns found in `metrics` (a missing one is left out, not invented)."""
    numbers = {}
    for column, key in columns.items():
        value: Any = metrics
        for part in key.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            numbers[column] = value
    return numbers


def write_headline(paths: ProjectPaths, stage: Stage, metrics: Mapping[str, Any]) -> Path | None:
    """metrics/headline/NAME.json: the stage's few numbers that DVC compares across
    experiments; its full metrics file stays as it is (a cached output beside it)."""
    if not stage.headline:
        return None
    path = paths.stage_metrics(stage.name).parent / "headline" / f"{stage.name}.json"
    return write_metrics(path, headline_numbers(metrics, stage.headline))


@task(name="run-stage", cache_policy=NO_CACHE)
def _stage_task(name: str, settings: Settings, paths: ProjectPaths) -> dict[str, Any]:
    log = get_run_logger().info
    log(math_summary())  # pinned by flows/__init__.py, or native (QPR_NATIVE_MATH)
    return dict(STAGES[name].work(settings, paths, log))


def run_stage(name: str, params: str | Path | None = None) -> dict[str, Any]:
    """Run stage `name` inside its MLflow run; write and log its metrics and artifacts
    (the headline numbers also on the pipeline's parent run, `flows.tracking`).

    A failed gate still logs the gate reports, and the run is marked FAILED."""
    stage = STAGES[name]
    settings, paths = settings_and_paths(params)
    gate_reports = paths.gate_reports(name)
    with tracking.stage_run(name, settings, root=paths.root):
        try:
            metrics = _stage_task(name, settings, paths)
        except GateFailed:
            tracking.log_artifacts({"gates": gate_reports})
            raise
        stable, timings = split_timings(metrics)
        target = write_metrics(paths.stage_metrics(name), stable)
        write_metrics(paths.stage_timings(name), timings)
        if stage.full_metrics:
            write_metrics(stage.full_metrics(paths), metrics)
        write_headline(paths, stage, stable)
        tracking.log_metrics(_numbers(metrics))
        tracking.log_parent_metrics(headline_numbers(stable, stage.headline))
        tracking.log_artifacts({"gates": gate_reports, "metrics": target, **stage.artifacts(paths)})
    return metrics


def stage_flow(name: str) -> Flow:
    """The Prefect flow of stage `name` (a flow named after the stage)."""
    stage = STAGES[name]

    def run(params: str | None = None) -> dict[str, Any]:
        return run_stage(name, params)

    run.__doc__ = stage.description
    return flow(name=name, log_prints=True, description=stage.description)(run)


class QuietExpectedErrors(logging.Filter):
    """Drops Prefect's records of an error a person can act on: the traceback it logs for
    the failed task and flow, and their final "Finished in state Failed(...)" lines, which
    repeat the message. `run_cli` prints it once; any other error keeps its traceback."""

    # The loggers Prefect's task and flow engines log a failed run to.
    LOGGERS = ("prefect.task_runs", "prefect.flow_runs")

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        err = record.exc_info[1] if record.exc_info else None
        if isinstance(err, EXPECTED_ERRORS):
            self.seen.add(type(err).__name__)
            return False
        message = record.getMessage()
        failed = message.startswith("Finished in state Failed")
        return not (failed and any(f"{name}:" in message for name in self.seen))


def run_cli(work: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Run a flow from the command line: an error a person can act on is one line on
    stderr and exit 1, not a stack trace."""
    quiet = QuietExpectedErrors()
    loggers = [logging.getLogger(name) for name in QuietExpectedErrors.LOGGERS]
    for logger in loggers:
        logger.addFilter(quiet)
    try:
        return work(*args, **kwargs)
    except EXPECTED_ERRORS as err:
        print(f"\nERROR: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    finally:
        for logger in loggers:
            logger.removeFilter(quiet)


def main(argv: list[str] | None = None) -> None:
    """`python -m flows.stage NAME`: what a DVC stage runs; exit 1 with the reason, 143
    on SIGTERM (flows.lifetime: its temporary Prefect API server never outlives it)."""
    parser = argparse.ArgumentParser(prog="python -m flows.stage", description=__doc__)
    parser.add_argument("stage", choices=list(STAGES))
    parser.add_argument("--params", default=None, help="parameter file (default: params.yaml)")
    args = parser.parse_args(argv)
    with flow_program():
        run_cli(stage_flow(args.stage), params=args.params)


if __name__ == "__main__":
    main()
