"""Prefect flow for the cluster stage: raw data → gated clusters, splits and pairs."""

from __future__ import annotations

from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from flows import tracking
from flows.common import main, settings_and_paths, write_metrics
from qpr.cluster import run_cluster
from qpr.quality.gate import GateFailed


@task(name="cluster-and-split", cache_policy=NO_CACHE)
def cluster_task(settings, paths):
    logger = get_run_logger()
    return run_cluster(
        settings,
        out_dir=paths.cluster_dir,
        report_dir=paths.gate_reports("cluster"),
        plot_path=paths.plots_dir / "cluster" / "coherence.png",
        log=logger.info,
    )


@flow(name="cluster", log_prints=True)
def cluster_flow(params: str | None = None) -> dict:
    """Cluster the questions of the configured data source into paraphrase clusters,
    split them 80:10:10 by cluster and generate positive pairs, behind quality gates."""
    settings, paths = settings_and_paths(params)
    with tracking.stage_run("cluster", settings, root=paths.root):
        try:
            result = cluster_task(settings, paths)
        except GateFailed:
            tracking.log_artifacts({"gates": paths.gate_reports("cluster")})
            raise
        metrics_file = write_metrics(paths.stage_metrics("cluster"), result.metrics)
        tracking.log_metrics(result.metrics)
        tracking.log_artifacts(
            {
                "gates": result.gate_reports,
                "metrics": metrics_file,
                "plots": paths.plots_dir / "cluster",
                "cluster": Path(result.out_dir),
            }
        )
    return result.metrics


if __name__ == "__main__":
    main(cluster_flow)
