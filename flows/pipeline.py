"""The whole pipeline as one Prefect flow: cluster → train → export → index → evaluate →
register.

Each stage is a subflow with its own MLflow run. `dvc repro` is the way to rerun only
what changed; this flow reruns everything (what a scheduled retraining does)."""

from __future__ import annotations

from prefect import flow

from flows.cluster import cluster_flow
from flows.common import main
from flows.evaluate import evaluate_flow
from flows.export import export_flow
from flows.index import index_flow
from flows.register import register_flow
from flows.train import train_flow

STAGES = (cluster_flow, train_flow, export_flow, index_flow, evaluate_flow, register_flow)


@flow(name="pipeline", log_prints=True)
def pipeline_flow(params: str | None = None) -> dict:
    """Run every stage in order; a failing gate stops the line."""
    return {stage.name: stage(params=params) for stage in STAGES}


if __name__ == "__main__":
    main(pipeline_flow)
