"""Prefect flow for the cluster stage: raw data → gated clusters, splits and pairs."""

from __future__ import annotations

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from flows.common import main, run_stage, settings_and_paths
from qpr.stages.cluster import run_cluster


@task(name="cluster-and-split", cache_policy=NO_CACHE)
def cluster_task(settings, paths) -> dict:
    result = run_cluster(
        settings,
        out_dir=paths.cluster_dir,
        report_dir=paths.gate_reports("cluster"),
        plot_path=paths.plots_dir / "cluster" / "coherence.png",
        log=get_run_logger().info,
    )
    return result.metrics


@flow(name="cluster", log_prints=True)
def cluster_flow(params: str | None = None) -> dict:
    """Cluster the questions of the configured data source into paraphrase clusters,
    split them 80:10:10 by cluster and generate positive pairs, behind quality gates."""
    settings, paths = settings_and_paths(params)
    return run_stage(
        "cluster",
        settings,
        paths,
        lambda: cluster_task(settings, paths),
        artifacts={"plots": paths.plots_dir / "cluster", "cluster": paths.cluster_dir},
    )


if __name__ == "__main__":
    main(cluster_flow)
