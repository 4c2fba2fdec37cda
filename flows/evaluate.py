"""Prefect flow for the evaluate stage: TREC measures for the model and the baselines."""

from __future__ import annotations

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from flows.common import main, run_stage, settings_and_paths
from qpr.stages.evaluate import run_evaluate


@task(name="evaluate", cache_policy=NO_CACHE)
def evaluate_task(settings, paths) -> dict:
    return run_evaluate(settings, paths, log=get_run_logger().info)


@flow(name="evaluate", log_prints=True)
def evaluate_flow(params: str | None = None) -> dict:
    """Query the index with every test question (itself excluded), score with trec_eval
    measures, compare with the baselines, choose the no-answer threshold on validation."""
    settings, paths = settings_and_paths(params)
    return run_stage(
        "evaluate",
        settings,
        paths,
        lambda: evaluate_task(settings, paths),
        metrics_file=paths.root / "metrics.json",
        artifacts={
            "trec": paths.evaluation_dir,
            "plots": paths.plots_dir / "evaluate",
            "model": paths.threshold,
        },
    )


if __name__ == "__main__":
    main(evaluate_flow)
