"""Prefect flow for the index stage: every question encoded with ONNX Runtime → FAISS."""

from __future__ import annotations

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from flows.common import main, run_stage, settings_and_paths
from qpr.stages.index import run_index


@task(name="build-index", cache_policy=NO_CACHE)
def index_task(settings, paths) -> dict:
    return run_index(settings, paths, log=get_run_logger().info)


@flow(name="index", log_prints=True)
def index_flow(params: str | None = None) -> dict:
    """Encode every index question and build the FAISS index from params (IVF as in the
    paper, fewer lists on a small corpus; GPU when FAISS sees one)."""
    settings, paths = settings_and_paths(params)
    return run_stage("index", settings, paths, lambda: index_task(settings, paths))


if __name__ == "__main__":
    main(index_flow)
