"""The train stage: vocabulary + encoder + loss, trained on the cluster stage's pairs.

Writes models/vocab.json and models/encoder.pt (the best epoch's weights, the encoder's
configuration and max_len), the training history (CSV + PNG) and metrics. Checkpoints live
in artifacts/train/checkpoints, outside DVC's outputs, so a killed run resumes where it
stopped when the stage is run again with the same settings and data.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from qpr.config import Settings, SettingsError
from qpr.data.splits import training_pairs_frame
from qpr.paths import ProjectPaths
from qpr.pipeline.handoff import read_cluster_outputs
from qpr.quality.checks import Check, require
from qpr.quality.gate import gate
from qpr.quality.suites import training_pair_expectations
from qpr.text.vocab import Vocabulary

if TYPE_CHECKING:
    from qpr.text.wordpiece import WordPieceTokenizer


# How far a pretrained encoder's validation metric other than the one that picked the epoch
# may fall in fine-tuning: all-MiniLM-L6-v2 already scores AUC 0.99999 on Quora's
# validation pairs, where a drop of 1e-5 is one pair ranked differently, not a regression.
PRETRAINED_SLACK = 1e-3
# Questions encoded between two progress lines while mining (a transformer on 2 cores
# takes minutes for Quora's 111k training and unclustered questions).
MINING_CHUNK = 8192
# Without a progress bar (a log file, a Prefect run), a line this often inside an epoch: a
# transformer's epoch on 2 cores can run for an hour between two epoch lines.
PROGRESS_EVERY_S = 60.0


def progress_line(record: dict[str, Any]) -> str:
    """One in-epoch log line from train_encoder's on_progress record."""
    line = (
        f"epoch {record['epoch']}: {record['batches']:,} / {record['planned_batches']:,} "
        f"batches, loss {record['train_loss']:.4f}, {record['pairs_per_s']:.0f} pairs/s"
    )
    if record.get("budget_left_s") is not None:
        line += f", {record['budget_left_s']:,.0f} s of the budget left"
    return line


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


def encoder_max_len(settings: Settings) -> int:
    """Tokens per question the encoder trains and runs with: text.max_len (CNN) or
    model.transformer.max_len (word pieces, [CLS] and [SEP] included)."""
    if settings.model.encoder == "transformer":
        return settings.model.transformer.max_len
    return settings.text.max_len


def build_tokenizer(settings: Settings) -> WordPieceTokenizer:
    """The packaged word-piece tokenizer of model.encoder = transformer (no vocabulary is
    built: the pretrained embeddings fix the ids)."""
    from qpr.text.wordpiece import WordPieceTokenizer

    transformer = settings.model.transformer
    return WordPieceTokenizer.from_package(transformer.package, max_len=transformer.max_len)


def build_encoder_and_loss(settings: Settings, vocab_size: int, *, num_classes: int | None = None):
    """The encoder and loss that params.yaml describes (seeded: same initial weights).

    num_classes: the distinct clusters of the pairs trained on
    (qpr.training.loop.num_training_classes), needed by a classifying loss (amsoftmax); without it
    such a loss is not built and None stands in its place (for callers that only want the
    encoder)."""
    from qpr.model import build_encoder
    from qpr.training.loop import seed_everything

    seed_everything(settings.seed)
    model = settings.model
    if model.encoder == "transformer":
        encoder = build_encoder(
            "transformer",
            package=model.transformer.package,
            projection_dim=model.transformer.projection_dim,
            normalize=model.normalize,
        )
        if vocab_size != encoder.vocab_size:
            raise SettingsError(
                f"model.encoder: transformer has {encoder.vocab_size:,} word-piece ids but the "
                f"tokenizer has {vocab_size:,}: models/vocab.json is not its tokenizer"
            )
    else:
        encoder = build_encoder(
            model.encoder,
            vocab_size=vocab_size,
            embedding_dim=model.embedding_dim,
            windows=tuple(model.windows),
            channels=model.channels,
            output_dim=model.output_dim,
            dropout=model.dropout,
            normalize=model.normalize,
        )
    loss = build_training_loss(settings, num_classes=num_classes, dim=int(encoder.output_dim))
    return encoder, loss


def build_training_loss(settings: Settings, *, num_classes: int | None, dim: int):
    """The loss of train.loss; None for amsoftmax without num_classes (see above).

    Raises SettingsError for amsoftmax without model.normalize."""
    from qpr.model.losses import build_loss

    train = settings.train
    if train.loss == "sdml" and train.prior == "teacher":
        return build_loss(
            "sdml_teacher", smoothing=train.smoothing, temperature=train.teacher.temperature
        )
    if train.loss == "sdml":
        return build_loss("sdml", smoothing=train.smoothing, scale=train.scale)
    if train.loss == "triplet":
        return build_loss(
            "triplet",
            margin=train.margin,
            distance=train.distance,
            negatives=train.negatives,
            seed=settings.seed,
        )
    if train.loss == "amsoftmax":
        # AM-Softmax shapes angles only; the index ranks by L2 distance, which agrees with
        # cosine only on unit vectors. Failing beats silently serving a mismatched geometry
        # or changing the encoder behind the user's back.
        if not settings.model.normalize:
            raise SettingsError(
                "train.loss: amsoftmax trains cosine similarities, but the index ranks by L2 "
                "distance, which ranks like cosine only on unit vectors: set "
                "model.normalize: true (e.g. dvc exp run -S model.normalize=true)"
            )
        if num_classes is None:
            return None
        return build_loss(
            "amsoftmax",
            num_classes=num_classes,
            dim=dim,
            margin=train.am_margin,
            scale=train.am_scale,
            sampled_classes=train.am_sampled_classes,
        )
    raise SettingsError(f"train.loss: unknown loss {train.loss!r}")


def training_teacher_vectors(
    settings: Settings,
    paths: ProjectPaths,
    train_pairs: pd.DataFrame,
    *,
    log: Callable[[str], None] = print,
) -> tuple[np.ndarray, np.ndarray]:
    """train.prior = teacher: the teacher's vectors of both questions of every training
    pair, each distinct question encoded once and cached in artifacts/train/teacher.

    Raises SettingsError when the teacher's package (the optional `transformer`
    dependencies) is not installed."""
    import importlib.util

    from qpr.training.teacher import pair_teacher_vectors, teacher_vectors

    teacher = settings.train.teacher
    for module in (teacher.package, "transformers"):
        if importlib.util.find_spec(module) is None:
            raise SettingsError(
                f"train.prior: teacher needs the package {module!r}, which is not installed: "
                "pip install '.[transformer]' (or train.prior: uniform)"
            )

    def encode(texts: list[str]) -> np.ndarray:
        return teacher_vectors(
            texts,
            package=teacher.package,
            max_len=teacher.max_len,
            cache_dir=paths.train_dir / "teacher",
            threads=settings.train.threads,
            log=log,
        )

    return pair_teacher_vectors(
        train_pairs["q1_text"].tolist(), train_pairs["q2_text"].tolist(), encode
    )


def negative_texts(
    pool: pd.DataFrame,
    vectors: np.ndarray,
    anchor_ids: np.ndarray,
    *,
    skip: int,
    window: int,
    seed: int,
    device: str = "cpu",
) -> list[str]:
    """One mined negative per anchor question (qpr.training.negatives): pool holds the questions a
    negative may be (question_id, text, cluster_id; the anchors among them), vectors their
    embeddings row for row, anchor_ids the anchors' question ids."""
    from qpr.training.negatives import mine_hard_negatives

    row_of = pd.Series(np.arange(len(pool)), index=pool["question_id"].to_numpy())
    rows = mine_hard_negatives(
        vectors,
        row_of[np.asarray(anchor_ids)].to_numpy(),
        pool["cluster_id"].to_numpy(),
        skip=skip,
        window=window,
        seed=seed,
        device=device,
        batch_size=1024 if device == "cuda" else 256,
    )
    return pool["text"].to_numpy()[rows].tolist()


def pool_vectors_file(
    cache_dir: Path, encoder, vocab_checksum: str, max_len: int, texts: list[str]
) -> Path:
    """Where the pool's vectors by this encoder are cached: keyed by the encoder's weights,
    the tokenizer (its checksum), max_len and the texts in order. Nothing is tokenised to
    find the file."""
    from qpr.training.teacher import texts_digest

    h = hashlib.sha256()
    for name, tensor in encoder.state_dict().items():
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    h.update(f"\x1f{vocab_checksum}\x1f{max_len}\x1f{texts_digest(texts)}".encode())
    return cache_dir / f"pool-{h.hexdigest()[:20]}.npy"


def mined_negative_texts(
    settings: Settings,
    questions: pd.DataFrame,
    train_pairs: pd.DataFrame,
    encoder,
    vocab,
    *,
    max_len: int,
    device: str,
    cache_dir: Path | None = None,
    log: Callable[[str], None] = print,
) -> list[str]:
    """train.hard_negatives.mine: one question per training pair, close to the pair's first
    question by the encoder as it starts, of another cluster, from the training and
    unclustered questions only (never a validation or test one).

    cache_dir: the pool's vectors are read from there when this encoder (the same weights)
    encoded the same token ids before, e.g. a killed run started again or a run with
    another budget or learning rate; else they are written there, replacing the previous
    file (MiniLM's vectors of Quora's pool take 170 MB)."""
    from qpr.training.loop import (
        atomic_numpy_save,
        embed_with_progress,
        select_training_pairs,
        torch_threads,
    )

    mining = settings.train.hard_negatives
    pool = questions[questions["split"].isin(["train", "none"])].reset_index(drop=True)
    ranks = f"ranks {mining.skip + 1}-{mining.skip + mining.window}"
    texts = pool["text"].tolist()
    cached = (
        None
        if cache_dir is None
        else pool_vectors_file(cache_dir, encoder, vocab.checksum, max_len, texts)
    )
    vectors = np.load(cached) if cached is not None and cached.is_file() else None
    if vectors is not None and vectors.shape[0] == len(pool):
        log(f"mining hard negatives ({ranks}): vectors of {len(pool):,} questions from {cached}")
    else:
        log(
            f"mining hard negatives: encoding {len(pool):,} training and unclustered "
            f"questions with the encoder as it starts ({ranks})"
        )

        def report(done: int, total: int, rate: float) -> None:
            log(
                f"mining: encoded {done:,} / {total:,} questions ({rate:,.0f}/s, "
                f"{(total - done) / rate:,.0f} s left)"
            )

        token_ids, lengths = vocab.encode_batch(texts, max_len=max_len)
        with torch_threads(settings.train.threads):
            vectors = embed_with_progress(
                encoder.to(device),
                token_ids,
                lengths,
                chunk=MINING_CHUNK,
                report=report,
                device=device,
            )
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            atomic_numpy_save(vectors, cached)
            for stale in cached.parent.glob("pool-*.npy"):
                if stale != cached:
                    stale.unlink()
    # Only the pairs train.max_pairs keeps (train_encoder takes the same seeded subset);
    # the others get an empty text that no batch reads.
    chosen = select_training_pairs(len(train_pairs), settings.train.max_pairs, settings.seed)
    negatives = np.full(len(train_pairs), "", dtype=object)
    negatives[chosen] = negative_texts(
        pool,
        vectors,
        train_pairs["q1_id"].to_numpy()[chosen],
        skip=mining.skip,
        window=mining.window,
        seed=settings.seed,
        device=device,
    )
    return negatives.tolist()


@dataclass(frozen=True)
class TrainStageResult:
    metrics: dict[str, float | int]
    history: pd.DataFrame
    files: dict[str, Path]


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


def run_train(
    settings: Settings,
    paths: ProjectPaths,
    *,
    on_epoch: Callable[[dict[str, Any]], None] | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> TrainStageResult:
    """The whole stage. Raises GateFailed when the pairs or the trained model fail a gate."""
    import torch

    from qpr.training.loop import (
        TrainingStateError,
        ValidationSet,
        num_training_classes,
        resolve_device,
        train_encoder,
    )

    questions, pairs = read_cluster_outputs(paths)
    train_pairs = training_pairs_frame(questions, pairs)
    report_dir = paths.gate_reports("train")
    gate(
        "training_pairs",
        {"pairs": train_pairs},
        {"pairs": training_pair_expectations(min_pairs=2)},
        report_dir,
    )
    train_texts = questions.loc[questions["split"] == "train", "text"].tolist()
    text = settings.text
    max_len = encoder_max_len(settings)
    if settings.model.encoder == "transformer":
        vocab = build_tokenizer(settings)
        log(
            f"tokenizer: word pieces of {vocab.source} ({vocab.size:,} ids), max_len "
            f"{max_len}; {len(train_pairs):,} training pairs"
        )
        if settings.train.lr > 1e-4:
            log(
                f"note: train.lr={settings.train.lr:g} suits the CNN trained from scratch; a "
                "pretrained transformer is usually fine-tuned at 1e-5 to 5e-5 (-S train.lr=3e-5)"
            )
    else:
        vocab = Vocabulary.build(
            train_texts,
            max_words=text.max_words,
            hash_bins=text.hash_bins,
            min_count=text.min_count,
        )
        log(
            f"vocabulary: {vocab.num_words:,} words + {text.hash_bins:,} hash bins from "
            f"{len(train_texts):,} training questions; {len(train_pairs):,} training pairs"
        )
    val_questions = questions[questions["split"] == "val"]
    val = ValidationSet(
        texts=val_questions["text"].tolist(),
        cluster_ids=val_questions["cluster_id"].to_numpy(),
        seed=settings.seed,
    )
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
    device = resolve_device(train.device)
    if device == "cuda":
        log(f"training on the GPU: {torch.cuda.get_device_name(0)}")
    teacher_pairs = None
    if train.loss == "sdml" and train.prior == "teacher":
        teacher_pairs = training_teacher_vectors(settings, paths, train_pairs, log=log)
    negatives = None
    if train.hard_negatives.mine:
        negatives = mined_negative_texts(
            settings,
            questions,
            train_pairs,
            encoder,
            vocab,
            max_len=max_len,
            device=device,
            cache_dir=paths.train_dir / "negatives",
            log=log,
        )
    arguments = dict(
        vocab=vocab,
        train_pairs=(
            train_pairs["q1_text"].tolist(),
            train_pairs["q2_text"].tolist(),
            train_pairs["cluster_id"].to_numpy(),
        ),
        val=val,
        out_dir=paths.train_dir,
        lr=train.lr,
        batch_size=train.batch_size,
        max_epochs=train.max_epochs,
        patience=train.patience,
        monitor=train.monitor,
        max_len=max_len,
        seed=settings.seed,
        on_epoch=on_epoch,
        progress=progress,
        on_progress=None if progress else (lambda record: log(progress_line(record))),
        progress_every_s=PROGRESS_EVERY_S,
        threads=train.threads,
        max_pairs=train.max_pairs,
        time_budget_s=train.time_budget_s,
        teacher_vectors=teacher_pairs,
        hard_negatives=negatives,
        device=device,
    )
    try:
        result = train_encoder(encoder=encoder, loss=loss, resume=True, **arguments)
    except TrainingStateError as err:
        log(f"not resuming: {err}; training from scratch")
        encoder, loss = build_encoder_and_loss(settings, vocab.size, num_classes=num_classes)
        result = train_encoder(encoder=encoder, loss=loss, resume=False, **arguments)
    if result.resumed_from_epoch is not None:
        log(f"resumed from the checkpoint of epoch {result.resumed_from_epoch}")
    if result.stopped_by_budget:
        log(
            f"stopped by train.time_budget_s={train.time_budget_s:g} after epoch "
            f"{result.last_epoch}"
            + (" (cut short)" if result.history[-1].get("cut_by_budget") else "")
        )

    history = pd.DataFrame(result.history)
    require(
        "trained_model",
        trained_model_checks(
            final_train_loss=float(history["train_loss"].iloc[-1]),
            initial=result.initial,
            best={"val_auc": result.best_val_auc, "val_mrr": result.best_val_mrr},
            pretrained=settings.model.encoder == "transformer",
            monitor=train.monitor,
        ),
        report_dir,
    )

    paths.models_dir.mkdir(parents=True, exist_ok=True)
    vocab.save(paths.vocab)
    best = torch.load(result.best_checkpoint, map_location="cpu", weights_only=False)
    tmp = paths.encoder_checkpoint.with_suffix(".pt.tmp")
    torch.save(
        {
            "encoder": best["encoder"],
            "model": best["model"],
            "max_len": max_len,
            "vocab_sha256": vocab.checksum,
            "epoch": result.best_epoch,
            "metrics": best["metrics"],
        },
        tmp,
    )
    tmp.replace(paths.encoder_checkpoint)

    history_csv = paths.plots_dir / "train" / "history.csv"
    history_csv.parent.mkdir(parents=True, exist_ok=True)
    history.to_csv(history_csv, index=False)
    curves = plot_history(history, result.initial, paths.plots_dir / "train" / "curves.png")
    metrics: dict[str, float | int] = {
        "best_epoch": result.best_epoch,
        "epochs": result.last_epoch,
        "stopped_early": int(result.stopped_early),
        "val_auc": result.best_val_auc,
        "val_mrr": result.best_val_mrr,
        "untrained_val_auc": result.initial["val_auc"],
        "untrained_val_mrr": result.initial["val_mrr"],
        "stopped_by_budget": int(result.stopped_by_budget),
        "train_pairs": result.train_pairs,
        "train_pairs_available": len(train_pairs),
        "train_clusters": result.train_classes,
        "vocab_words": vocab.num_words,
        "vocab_size": vocab.size,
        "pairs_per_s": float(np.median(history["pairs_per_s"])),
        "train_seconds": float(history["train_seconds"].sum()),
        "parameters": int(sum(p.numel() for p in encoder.parameters())),
    }
    log(
        f"best epoch {result.best_epoch} of {result.last_epoch} (by {train.monitor}): val AUC "
        f"{result.initial['val_auc']:.3f} → {result.best_val_auc:.3f}, val MRR "
        f"{result.initial['val_mrr']:.3f} → {result.best_val_mrr:.3f}; "
        f"{metrics['pairs_per_s']:.0f} pairs/s"
    )
    files = {
        "vocab": paths.vocab,
        "encoder": paths.encoder_checkpoint,
        "history": history_csv,
        "curves": curves,
    }
    return TrainStageResult(metrics=metrics, history=history, files=files)
