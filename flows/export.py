"""Prefect flow for the export stage: encoder → ONNX, gated on parity."""

from __future__ import annotations

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from flows.common import main, run_stage, settings_and_paths
from qpr.stages.export import run_export


@task(name="export-onnx", cache_policy=NO_CACHE)
def export_task(settings, paths) -> dict:
    return run_export(settings, paths, log=get_run_logger().info)


@flow(name="export", log_prints=True)
def export_flow(params: str | None = None) -> dict:
    """Export the trained encoder to ONNX (dynamic batch and length) and check that ONNX
    Runtime gives the same vectors as torch, padding or not."""
    settings, paths = settings_and_paths(params)
    return run_stage(
        "export",
        settings,
        paths,
        lambda: export_task(settings, paths),
        artifacts={"model": paths.encoder_onnx},
    )


if __name__ == "__main__":
    main(export_flow)
