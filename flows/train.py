"""Prefect flow for the train stage: SDML (or triplet) training of the CNN encoder."""

from __future__ import annotations

import sys

import mlflow
from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from flows.common import main, run_stage, settings_and_paths
from qpr.stages.train import run_train


def _log_epoch(record: dict) -> None:
    step = int(record["epoch"])
    # "epoch/..." keeps the learning curves apart from the stage's final (best) metrics.
    mlflow.log_metrics(
        {
            f"epoch/{k}": float(v)
            for k, v in record.items()
            if k != "epoch" and isinstance(v, int | float)
        },
        step=step,
    )
    get_run_logger().info(
        "epoch %d: loss %.4f, val AUC %.4f, val MRR %.4f, %.0f pairs/s",
        step,
        record["train_loss"],
        record["val_auc"],
        record["val_mrr"],
        record["pairs_per_s"],
    )


@task(name="train-encoder", cache_policy=NO_CACHE)
def train_task(settings, paths) -> dict:
    # A bar redrawn into a log file is noise; per-epoch log lines carry the same figures.
    result = run_train(
        settings,
        paths,
        on_epoch=_log_epoch,
        progress=sys.stderr.isatty(),
        log=get_run_logger().info,
    )
    if mlflow.active_run() is not None:
        _log_pytorch_model(paths)
    return result.metrics


def _log_pytorch_model(paths) -> None:
    """The trained encoder in MLflow's pytorch flavour (pickle format: no fixed shapes)."""
    import mlflow.pytorch

    from qpr.stages.train import load_trained_encoder

    encoder, _ = load_trained_encoder(paths.encoder_checkpoint)
    requirements = ["torch==2.13.0"]
    if getattr(encoder, "name", None) == "transformer":
        # The pickled BertModel needs transformers to unpickle; the weights travel with it.
        import importlib.metadata

        requirements.append(f"transformers=={importlib.metadata.version('transformers')}")
    mlflow.pytorch.log_model(
        encoder,
        name="encoder",
        serialization_format="pickle",
        pip_requirements=requirements,
    )


@flow(name="train", log_prints=True)
def train_flow(params: str | None = None) -> dict:
    """Train the question encoder on the training pairs; early stopping on validation AUC;
    resumes from the last checkpoint after a kill."""
    settings, paths = settings_and_paths(params)
    return run_stage(
        "train",
        settings,
        paths,
        lambda: train_task(settings, paths),
        artifacts={"plots": paths.plots_dir / "train", "model": paths.vocab},
    )


if __name__ == "__main__":
    main(train_flow)
