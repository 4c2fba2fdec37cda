"""The train stage: vocabulary + encoder + loss, trained on the cluster stage's pairs.

Writes models/vocab.json and models/encoder.pt (the best epoch's weights, the encoder's
configuration and max_len), the training history (CSV + PNG) and metrics. Checkpoints live
in artifacts/train/checkpoints, outside DVC's outputs, so a killed run resumes where it
stopped when the stage is run again with the same settings and data. The training itself
is qpr.training's; this module reads, gates, builds one TrainConfig, calls it and writes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from qpr.config import Settings
from qpr.data.splits import training_pairs_frame
from qpr.io import VectorCache, is_timing, write_atomic
from qpr.paths import ProjectPaths
from qpr.pipeline.handoff import read_cluster_outputs
from qpr.quality.checks import Check, require
from qpr.quality.gate import gate
from qpr.quality.suites import training_pair_expectations
from qpr.training.build import build_encoder_and_loss, build_tokenizer
from qpr.training.train_config import TrainConfig

if TYPE_CHECKING:
    from torch import nn

    from qpr.text.vocab import Vocabulary
    from qpr.text.wordpiece import WordPieceTokenizer
    from qpr.training.loop import TrainResult
    from qpr.training.pairs import TrainData

    Tokenizer = Vocabulary | WordPieceTokenizer

# How far a pretrained encoder's validation metric other than the one that picked the epoch
# may fall in fine-tuning: all-MiniLM-L6-v2 already scores AUC 0.99999 on Quora's
# validation pairs, where a drop of 1e-5 is one pair ranked differently, not a regression.
PRETRAINED_SLACK = 1e-3


def trained_model_checks(
    *,
    final_train_loss: float,
    initial: dict[str, float],
    best: dict[str, float],
    pretrained: bool,
    monitor: str,
) -> list[Check]:
    """The `trained_model` gate: the last training loss is finite, and validation AUC and
    MRR (best epoch) against the untrained encoder's (`initial`, same keys as `best`).

    A randomly initialised encoder must gain on both. A pretrained one starts out good, so
    fine-tuning must only not make it worse: no loss on the `monitor` metric (the one that
    chose the epoch kept), at most PRETRAINED_SLACK on the other.
    """
    checks = [Check("final_train_loss_finite", final_train_loss, "<", 1e30)]
    for metric in ("val_auc", "val_mrr"):
        if not pretrained:
            op, bound = ">", 0.0
        else:
            op, bound = ">=", 0.0 if metric == monitor else -PRETRAINED_SLACK
        checks.append(
            Check(
                f"{metric}_gain_over_untrained",
                best[metric] - initial[metric],
                op,
                bound,
                f"untrained {initial[metric]:.5f}, trained {best[metric]:.5f}",
            )
        )
    return checks


def plot_history(history: pd.DataFrame, initial: dict[str, float], path: Path) -> Path:
    """Loss and validation AUC / MRR per epoch, the untrained encoder as epoch 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (loss_ax, val_ax) = plt.subplots(1, 2, figsize=(10, 3.8))
    loss_ax.plot(history["epoch"], history["train_loss"], marker="o")
    loss_ax.set_xlabel("epoch")
    loss_ax.set_ylabel("training loss")
    loss_ax.set_title("Training loss")
    epochs = [0, *history["epoch"]]
    for key, label in (("val_auc", "ROC AUC"), ("val_mrr", "MRR")):
        val_ax.plot(epochs, [initial[key], *history[key]], marker="o", label=label)
    val_ax.set_xlabel("epoch (0 = untrained)")
    val_ax.set_title("Validation")
    val_ax.set_ylim(0, 1.02)
    val_ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


_HISTORY_COLUMNS = ["epoch", "train_loss", "val_auc", "val_mrr", "pairs_per_s", "train_seconds"]


@dataclass(frozen=True)
class TrainStageResult:
    metrics: dict[str, float | int]
    history: pd.DataFrame
    files: dict[str, Path]


def run_train(
    settings: Settings,
    paths: ProjectPaths,
    *,
    on_epoch: Callable[[dict[str, Any]], None] | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> TrainStageResult:
    """The whole stage. Raises GateFailed when the pairs or the trained model fail a gate."""
    from qpr.training.checkpoint import TrainingStateError
    from qpr.training.encoder_step import train_encoder
    from qpr.training.loop import progress_line
    from qpr.training.pairs import num_training_classes

    questions, pairs = read_cluster_outputs(paths)
    train_pairs = training_pairs_frame(questions, pairs)
    report_dir = paths.gate_reports("train")
    gate(
        "training_pairs",
        {"pairs": train_pairs},
        {"pairs": training_pair_expectations(min_pairs=2)},
        report_dir,
    )
    config = TrainConfig.from_settings(settings, progress=progress)
    vocab = _tokenizer(settings, config, questions, train_pairs, log)
    train = settings.train
    num_classes = num_training_classes(
        train_pairs["cluster_id"].to_numpy(), max_pairs=train.max_pairs, seed=settings.seed
    )
    if train.max_pairs is not None and train.max_pairs < len(train_pairs):
        log(
            f"training on a seeded subset of {train.max_pairs:,} of {len(train_pairs):,} pairs "
            f"({num_classes:,} clusters)"
        )
    encoder, loss = build_encoder_and_loss(settings, vocab.size, num_classes=num_classes)
    if config.device == "cuda":
        import torch

        log(f"training on the GPU: {torch.cuda.get_device_name(0)}")
    data = _train_data(settings, config, paths, questions, train_pairs, encoder, vocab, log)
    train_run = partial(
        train_encoder,
        data=data,
        vocab=vocab,
        out_dir=paths.train_dir,
        on_epoch=on_epoch,
        on_progress=None if progress else (lambda record: log(progress_line(record))),
    )
    try:
        result = train_run(config, encoder=encoder, loss=loss)
    except TrainingStateError as err:
        log(f"not resuming: {err}; training from scratch")
        encoder, loss = build_encoder_and_loss(settings, vocab.size, num_classes=num_classes)
        result = train_run(dataclasses.replace(config, resume=False), encoder=encoder, loss=loss)
    if result.resumed_from_epoch is not None:
        log(f"resumed from the checkpoint of epoch {result.resumed_from_epoch}")
    if result.stopped_by_budget:
        # Loud on purpose: where the cut fell depends on this machine's speed and load.
        log(
            f"WARNING: stopped by train.time_budget_s={train.time_budget_s:g} after epoch "
            f"{result.last_epoch}"
            + (" (cut short)" if result.history[-1].get("cut_by_budget") else "")
            + ", not by its epochs or validation: the same command may give another model "
            "(stopped_by_budget in metrics/train.json)"
        )

    # train.max_epochs 0 keeps the encoder as built: an empty history, nothing trained.
    history = (
        pd.DataFrame(result.history) if result.history else pd.DataFrame(columns=_HISTORY_COLUMNS)
    )
    require(
        "trained_model",
        trained_model_checks(
            final_train_loss=float(history["train_loss"].iloc[-1]) if len(history) else 0.0,
            initial=result.initial,
            best=result.best,
            pretrained=settings.model.encoder == "transformer",
            monitor=train.monitor,
        ),
        report_dir,
    )
    files = _write_outputs(paths, vocab, result, history, config.max_len)
    metrics = _metrics(result, history, len(train_pairs), vocab, encoder)
    log(
        f"best epoch {result.best_epoch} of {result.last_epoch} (by {train.monitor}): val AUC "
        f"{result.initial['val_auc']:.3f} → {result.best['val_auc']:.3f}, val MRR "
        f"{result.initial['val_mrr']:.3f} → {result.best['val_mrr']:.3f}; "
        f"{metrics['pairs_per_s']:.0f} pairs/s"
    )
    return TrainStageResult(metrics=metrics, history=history, files=files)


def _metrics(
    result: TrainResult, history: pd.DataFrame, available: int, vocab: Tokenizer, encoder: nn.Module
) -> dict[str, float | int]:
    """metrics/train.json: the best epoch's validation figures against the untrained
    encoder's, what was trained on, and how fast."""
    return {
        "best_epoch": result.best_epoch,
        "epochs": result.last_epoch,
        "stopped_early": int(result.stopped_early),
        "val_auc": result.best["val_auc"],
        "val_mrr": result.best["val_mrr"],
        "untrained_val_auc": result.initial["val_auc"],
        "untrained_val_mrr": result.initial["val_mrr"],
        "stopped_by_budget": int(result.stopped_by_budget),
        "train_pairs": result.counts["train_pairs"],
        "train_pairs_available": available,
        "train_clusters": result.counts["train_classes"],
        "vocab_words": vocab.num_words,
        "vocab_size": vocab.size,
        "pairs_per_s": float(np.median(history["pairs_per_s"])) if len(history) else 0.0,
        "train_seconds": float(history["train_seconds"].sum()),
        "parameters": int(sum(p.numel() for p in encoder.parameters())),
    }


def _tokenizer(
    settings: Settings,
    config: TrainConfig,
    questions: pd.DataFrame,
    train_pairs: pd.DataFrame,
    log: Callable[[str], None],
) -> Tokenizer:
    """The run's tokenizer (qpr.training.build), with a line saying what it is."""
    train_texts = questions.loc[questions["split"] == "train", "text"].tolist()
    vocab = build_tokenizer(settings, train_texts)
    if settings.model.encoder == "transformer":
        log(
            f"tokenizer: word pieces of {vocab.source} ({vocab.size:,} ids), max_len "
            f"{config.max_len}; {len(train_pairs):,} training pairs"
        )
        if config.lr > 1e-4:
            log(
                f"note: train.lr={config.lr:g} suits the CNN trained from scratch; a "
                "pretrained transformer is usually fine-tuned at 1e-5 to 5e-5 (-S train.lr=3e-5)"
            )
    else:
        log(
            f"vocabulary: {vocab.num_words:,} words + {settings.text.hash_bins:,} hash bins from "
            f"{len(train_texts):,} training questions; {len(train_pairs):,} training pairs"
        )
    return vocab


def _train_data(
    settings: Settings,
    config: TrainConfig,
    paths: ProjectPaths,
    questions: pd.DataFrame,
    train_pairs: pd.DataFrame,
    encoder: nn.Module,
    vocab: Tokenizer,
    log: Callable[[str], None],
) -> TrainData:
    """The training pairs, the validation questions, and the teacher vectors or mined
    negatives when params.yaml asks for them (each cached under artifacts/train)."""
    from qpr.training.negatives import MiningConfig, mined_negative_texts
    from qpr.training.pairs import TrainData
    from qpr.training.teacher import training_teacher_vectors
    from qpr.training.validation import ValidationSet

    val_questions = questions[questions["split"] == "val"]
    val = ValidationSet(
        texts=val_questions["text"].tolist(),
        cluster_ids=val_questions["cluster_id"].to_numpy(),
        seed=settings.seed,
    )
    train = settings.train
    teacher = negatives = None
    if train.loss == "sdml" and train.prior == "teacher":
        teacher = training_teacher_vectors(
            train.teacher,
            train_pairs,
            cache_dir=paths.train_dir / "teacher",
            threads=train.threads,
            log=log,
        )
    if train.hard_negatives.mine:
        negatives = mined_negative_texts(
            config,
            MiningConfig.from_settings(settings, device=config.device),
            questions,
            train_pairs,
            encoder,
            vocab,
            cache=VectorCache(paths.train_dir / "negatives", keep_one=True),
            log=log,
        )
    return TrainData.from_frame(train_pairs, val, teacher_vectors=teacher, hard_negatives=negatives)


def _write_outputs(
    paths: ProjectPaths, vocab: Tokenizer, result: TrainResult, history: pd.DataFrame, max_len: int
) -> dict[str, Path]:
    """models/vocab.json, models/encoder.pt (the best epoch), the history CSV and plot."""
    import torch

    paths.models_dir.mkdir(parents=True, exist_ok=True)
    vocab.save(paths.vocab)
    best = torch.load(result.best_checkpoint, map_location="cpu", weights_only=True)
    encoder_file = {
        "encoder": best["encoder"],
        "model": best["model"],
        "max_len": max_len,
        "vocab_sha256": vocab.checksum,
        "epoch": result.best_epoch,
        "metrics": best["metrics"],
    }
    write_atomic(paths.encoder_checkpoint, partial(torch.save, encoder_file))
    history_csv = paths.plots_dir / "train" / "history.csv"
    history_csv.parent.mkdir(parents=True, exist_ok=True)
    # Without its wall-clock columns (in MLflow and metrics/timings/): DVC hashes this file.
    history.drop(columns=[c for c in history.columns if is_timing(c)]).to_csv(
        history_csv, index=False
    )
    curves = plot_history(history, result.initial, paths.plots_dir / "train" / "curves.png")
    return {
        "vocab": paths.vocab,
        "encoder": paths.encoder_checkpoint,
        "history": history_csv,
        "curves": curves,
    }
