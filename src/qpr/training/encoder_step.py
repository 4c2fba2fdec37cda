"""The encoder family of the one loop: metric learning on paraphrase pairs.

The paper's section 4.2: batches of positive pairs (no cluster twice in a batch,
qpr.training.sampler), a metric-learning loss over in-batch negatives, Adam (lr 1e-3),
early stopping on a validation measure (qpr.training.validation). `train_encoder` builds
the family (EncoderStep) and runs it through qpr.training.loop.fit.

Each epoch's batches and pair orientations come from numpy Generators seeded with (seed,
epoch), so a resumed run draws the same ones; the loss's own generator (the triplet's
negatives) is the family's state in last.pt. The fingerprint holds digests of the data,
the loss and the tokenizer.

Losses that classify (`needs_labels`, e.g. AM-Softmax) get each pair's cluster as a dense
class index 0..C-1 (np.unique order of the cluster ids trained on) and must be built with
num_classes = C = num_training_classes(cluster_ids, max_pairs=..., seed=...).

Losses with a teacher prior (`needs_teacher`, TeacherPriorSDMLLoss) get each batch's
teacher vectors (TrainData.teacher_vectors), swapped with their pair when it is flipped.
They are computed before training (qpr.training.teacher).

Hard negatives (TrainData.hard_negatives, one question per pair, for a loss with
`takes_negatives`: SDML) are encoded with each batch and passed as forward(anchors,
positives, negatives): extra columns of every anchor's softmax. They are mined before
training (qpr.training.negatives).

max_pairs trains on a seeded subset of that many pairs (qpr.training.pairs); the time
budget is the loop's (qpr.training.loop).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from qpr.model.losses import needs_labels, needs_teacher
from qpr.text.vocab import Vocabulary
from qpr.training.embed import torch_math
from qpr.training.loop import EpochCallback, ProgressCallback, TrainResult, fit
from qpr.training.pairs import TrainData
from qpr.training.sampler import ClusterDisjointBatchSampler
from qpr.training.train_config import TrainConfig
from qpr.training.validation import evaluate_token_ids


class EncodedPairs:
    """Every training question encoded once (int32 [P, L] per side, right-padded);
    a batch slices its rows and trims the columns to its own longest question."""

    def __init__(
        self,
        vocab: Vocabulary,
        q1: Sequence[str],
        q2: Sequence[str],
        max_len: int,
        labels: np.ndarray | None = None,
        teacher: tuple[np.ndarray, np.ndarray] | None = None,
        negatives: Sequence[str] | None = None,
    ):
        a_ids, a_len = vocab.encode_batch(q1, max_len=max_len)
        b_ids, b_len = vocab.encode_batch(q2, max_len=max_len)
        width = max(a_ids.shape[1], b_ids.shape[1])
        # One hard negative per pair (None: in-batch negatives only).
        self.negatives = self.negative_len = None
        if negatives is not None:
            n_ids, n_len = vocab.encode_batch(negatives, max_len=max_len)
            self.negatives = torch.from_numpy(n_ids.astype(np.int32))
            self.negative_len = torch.from_numpy(n_len)
        # int32 at rest halves the memory of 2 × P × max_len ids; batches become int64.
        self.side_a = torch.from_numpy(_pad_to(a_ids, width).astype(np.int32))
        self.side_b = torch.from_numpy(_pad_to(b_ids, width).astype(np.int32))
        self.pair_len = torch.from_numpy(np.maximum(a_len, b_len))
        # Dense class index per pair, for losses that classify (None: no such loss).
        self.labels = None if labels is None else torch.from_numpy(np.asarray(labels, np.int64))
        # Teacher vectors per side, for a loss with a teacher prior (None: no such loss).
        self.teacher = None
        if teacher is not None:
            self.teacher = tuple(torch.from_numpy(np.asarray(t, np.float32)) for t in teacher)

    def teacher_batch(
        self, idx: torch.Tensor, flip: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(anchor, positive) teacher vectors, float32 [n, T] each, oriented like batch()."""
        assert self.teacher is not None, "a loss with a teacher prior needs teacher vectors"
        side_a, side_b = self.teacher[0][idx], self.teacher[1][idx]
        swap = flip[idx].unsqueeze(1)
        return torch.where(swap, side_b, side_a), torch.where(swap, side_a, side_b)

    def batch(self, idx: torch.Tensor, flip: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(anchor ids, positive ids), int64 [n, w] each; flip[i] swaps pair i's sides."""
        width = max(1, int(self.pair_len[idx].max()))
        rows_a, rows_b = self.side_a[idx, :width], self.side_b[idx, :width]
        swap = flip[idx].unsqueeze(1)
        anchors = torch.where(swap, rows_b, rows_a).long()
        positives = torch.where(swap, rows_a, rows_b).long()
        return anchors, positives

    def negative_batch(self, idx: torch.Tensor) -> torch.Tensor:
        """The pairs' hard negatives, int64 [n, w] (w: their own longest)."""
        assert self.negatives is not None and self.negative_len is not None
        width = max(1, int(self.negative_len[idx].max()))
        return self.negatives[idx, :width].long()


def _pad_to(token_ids: np.ndarray, width: int) -> np.ndarray:
    return np.pad(token_ids, ((0, 0), (0, width - token_ids.shape[1])))


class EncoderStep:
    """The encoder family (qpr.training.loop.Family): pairs in, a metric-learning loss.

    Built from the config and the data: checks the data against the loss, takes the
    max_pairs subset, encodes it once, moves the model to the device and builds the
    optimizer (fused Adam over the encoder's and the loss's parameters).
    """

    unit = "pairs"
    scheduler = None

    def __init__(
        self,
        config: TrainConfig,
        data: TrainData,
        *,
        encoder: nn.Module,
        loss: nn.Module,
        vocab: Vocabulary,
    ) -> None:
        _check_loss(loss, data)
        self._fingerprint = {
            "loss": f"{type(loss).__name__}({loss.extra_repr()})",
            "vocab": vocab.checksum,
            **data.fingerprint(),
        }
        data = data.subset(config.max_pairs, config.seed)
        _, labels = np.unique(data.cluster_ids, return_inverse=True)
        num_classes = int(labels.max()) + 1
        if needs_labels(loss) and getattr(loss, "num_classes", None) != num_classes:
            raise ValueError(
                f"{type(loss).__name__} has num_classes={getattr(loss, 'num_classes', None)}, "
                f"but the {len(data):,} training pairs hold {num_classes:,} distinct clusters; "
                "build it with num_classes=num_training_classes(cluster_ids, max_pairs=..., "
                "seed=...)"
            )
        self.config, self.model, self.loss = config, encoder, loss
        encoder.to(config.device)
        loss.to(config.device)
        # The fused kernel: at paper size (16.5M parameters, mostly the embedding) the
        # default Adam step took 0.12 s of a 0.6 s batch on one CPU core, fused 0.02 s.
        self.optimizer = torch.optim.Adam(
            [*encoder.parameters(), *loss.parameters()],
            lr=config.lr,
            fused=torch.device(config.device).type in ("cpu", "cuda"),
        )
        self.pairs = EncodedPairs(
            vocab,
            data.q1,
            data.q2,
            config.max_len,
            labels,
            data.teacher_vectors,
            data.hard_negatives,
        )
        self.sampler = ClusterDisjointBatchSampler(
            data.cluster_ids, config.batch_size, seed=config.seed
        )
        self.val = data.val
        self.val_ids, self.val_len = vocab.encode_batch(data.val.texts, max_len=config.max_len)
        self.vocab_checksum = vocab.checksum
        self.flip = torch.zeros(len(data), dtype=torch.bool)
        self.counts = {"train_pairs": len(data), "train_classes": num_classes}

    def fingerprint(self) -> dict[str, Any]:
        return dict(self._fingerprint)

    def batches(self, epoch: int) -> list[np.ndarray]:
        self.sampler.set_epoch(epoch)
        # Pair orientation per epoch: the loss is not symmetric in (anchor, positive).
        rng = np.random.default_rng([self.config.seed, epoch, 1])
        self.flip = torch.from_numpy(rng.random(len(self.flip)) < 0.5)
        return self.sampler.batches()

    def batch_loss(self, batch: np.ndarray) -> tuple[torch.Tensor, int]:
        idx, device, pairs, loss = (
            torch.from_numpy(batch),
            self.config.device,
            self.pairs,
            self.loss,
        )
        anchors, positives = pairs.batch(idx, self.flip)
        n = anchors.shape[0]
        # Both sides in one forward pass: one big conv/matmul instead of two.
        emb = self.model(torch.cat([anchors, positives]).to(device))
        if pairs.negatives is not None:
            negatives = self.model(pairs.negative_batch(idx).to(device))
            return loss(emb[:n], emb[n:], negatives), n
        if needs_labels(loss):
            assert pairs.labels is not None, "a loss that classifies needs labelled pairs"
            return loss(emb[:n], emb[n:], pairs.labels[idx].to(device)), n
        if needs_teacher(loss):
            t_anchors, t_positives = pairs.teacher_batch(idx, self.flip)
            return loss(emb[:n], emb[n:], t_anchors.to(device), t_positives.to(device)), n
        return loss(emb[:n], emb[n:]), n

    def evaluate(self) -> dict[str, float]:
        return evaluate_token_ids(
            self.model,
            self.val_ids,
            self.val_len,
            self.val,
            batch_size=self.config.eval_batch_size,
            device=self.config.device,
        )

    def state_dict(self) -> dict[str, Any]:
        return self.loss.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loss.load_state_dict(state)

    def best_extras(self) -> dict[str, Any]:
        return {"vocab": self.vocab_checksum, "max_len": self.config.max_len}


def _check_loss(loss: nn.Module, data: TrainData) -> None:
    """The per-pair extras the data brings must be the ones the loss takes."""
    if needs_teacher(loss) != (data.teacher_vectors is not None):
        raise ValueError(
            f"{type(loss).__name__} "
            + ("needs teacher_vectors" if needs_teacher(loss) else "takes no teacher_vectors")
        )
    if data.hard_negatives is not None and not getattr(loss, "takes_negatives", False):
        raise ValueError(f"{type(loss).__name__} takes no hard negatives")


def train_encoder(
    config: TrainConfig,
    data: TrainData,
    *,
    encoder: nn.Module,
    loss: nn.Module,
    vocab: Vocabulary,
    out_dir: str | os.PathLike[str],
    on_epoch: EpochCallback | None = None,
    on_progress: ProgressCallback | None = None,
) -> TrainResult:
    """Train `encoder` in place (qpr.training.loop.fit); on return it holds the best
    epoch's weights. The monitor is config.monitor: "val_auc" (ROC AUC of paraphrase vs
    other pairs) or "val_mrr" (the retrieval MRR). A run resumed under another monitor
    picks its best again among the epochs whose weights are still there (best.pt's and
    the last). result.counts: {"train_pairs", "train_classes"} (after max_pairs).
    Seed before building the encoder (seed_everything) for reproducible initial weights.
    """
    with torch_math(config.threads):
        step = EncoderStep(config, data, encoder=encoder, loss=loss, vocab=vocab)
        return fit(step, config, out_dir, on_epoch=on_epoch, on_progress=on_progress)
