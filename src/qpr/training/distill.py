"""The query student's family of the one loop: a student trained into a fixed document space.

Everything is an array over index rows: `tokens[r]` is row r's question as padded word-piece
ids, `documents[r]` its vector from the document encoder (what the index holds). A step
takes a batch of training pairs (query row, paraphrase row, mined negative rows) and a
batch of rows to align, encodes the queries and the aligned rows with the student in one
call, and scores them against the documents' fixed vectors
(`qpr.model.losses.alignment`). Validation searches every document exactly with a seeded
sample of validation questions (MRR@10, a paraphrase = same cluster).

With `noisy` tokens (each row's question with seeded typos, `qpr.text.noise`), each
query of a step is read as typed or as typo'd, a coin flip from the batch generator:
the student learns to put a misspelt question where the document encoder put the clean
one. The documents stay clean: the index holds what was typed in the logs.

`train_student` runs it through qpr.training.loop.fit: epochs, early stopping on the
validation MRR (patience), the best epoch's weights kept, checkpoints every epoch. The
batch order comes from one numpy Generator seeded once and drawn epoch after epoch; its
state is the family's state in last.pt, so a resumed run draws the same batches.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import nn

from qpr.io import digest
from qpr.model.losses.alignment import QueryAlignmentLoss
from qpr.training.embed import embed_token_ids
from qpr.training.loop import (
    EpochCallback,
    LoopConfig,
    ProgressCallback,
    TrainResult,
    fingerprint_field,
    fit,
)

if TYPE_CHECKING:
    from qpr.config import Settings


@dataclass(frozen=True)
class StudentConfig(LoopConfig):
    """The student's run (params.yaml `student`): batch size, lr and seed make the run;
    epochs and patience stop it (early stopping on the validation MRR), and a time budget
    only as a safety stop that is recorded."""

    MONITORS: ClassVar[tuple[str, ...]] = ("val_mrr", "val_cosine")

    seed: int = fingerprint_field(13)
    batch_size: int = fingerprint_field(256)
    lr: float = fingerprint_field(5e-4)
    # How the static student's table started (qpr.model.static.sif_table): another start
    # is another run, never resumed. 0.0 here, the teacher's vectors as they are: params
    # set it through `StudentSettings.sif_start`.
    sif: float = fingerprint_field(0.0)
    max_epochs: int = 10
    patience: int = 2
    monitor: str = "val_mrr"
    # The start (the SIF table for a static student) is kept unless an epoch ranks better.
    keep_start: bool | None = fingerprint_field(True)
    threads: int | None = 2
    # A safety stop (qpr.training.loop): a cut run says so (TrainResult.stopped_by_budget).
    time_budget_s: float | None = fingerprint_field(None)

    @classmethod
    def from_settings(cls, settings: Settings, *, progress: bool = False) -> StudentConfig:
        """student.* and the seed of params.yaml."""
        student = settings.student
        return cls(
            seed=settings.seed,
            batch_size=student.batch_size,
            lr=student.lr,
            sif=student.sif_start,
            max_epochs=student.max_epochs,
            patience=student.patience,
            threads=student.threads,
            time_budget_s=student.time_budget_s,
            progress=progress,
        )


@dataclass(frozen=True)
class StudentData:
    """tokens int64 [N, L] (0 = padding); documents float32 [N, D]; pairs int64 [P, 2]
    (query row, paraphrase row); negatives int64 [P, n]; align_rows int64 rows aligned
    without labels; val_rows int64 validation query rows; cluster_ids int64 [N] (-1: none)."""

    tokens: np.ndarray
    documents: np.ndarray
    pairs: np.ndarray
    negatives: np.ndarray
    align_rows: np.ndarray
    val_rows: np.ndarray
    cluster_ids: np.ndarray
    noisy: np.ndarray | None = None

    def digest(self) -> str:
        arrays = [self.tokens, self.documents, self.pairs, self.negatives]
        arrays += [self.align_rows, self.val_rows, self.cluster_ids]
        # Without noise the digest is what it was, so older checkpoints still resume.
        return digest(*arrays, *([] if self.noisy is None else [self.noisy]))


def pick_negatives(
    neighbours: np.ndarray,
    query_rows: np.ndarray,
    cluster_ids: np.ndarray,
    allowed: np.ndarray,
    *,
    count: int,
    skip: int,
    window: int,
    seed: int,
) -> np.ndarray:
    """int64 [P, count]: for each query row, `count` rows drawn (seeded, without
    replacement) among its nearest documents ranked skip+1 .. skip+window, after leaving
    out itself, its cluster and rows not `allowed` (bool [N]: e.g. val / test questions).
    neighbours: int64 [P, K] rows nearest first (-1 = none). A query with too few
    candidates gets random allowed rows outside its cluster instead."""
    rng = np.random.default_rng(seed)
    pool = np.flatnonzero(allowed)
    out = np.empty((len(query_rows), count), np.int64)
    for i, (row, near) in enumerate(zip(query_rows, neighbours, strict=True)):
        cluster = cluster_ids[row]
        ok = (near >= 0) & (near != row)
        near = near[ok]
        near = near[allowed[near] & ((cluster_ids[near] != cluster) | (cluster < 0))]
        near = near[skip : skip + window]
        while near.size < count:
            extra = pool[rng.integers(pool.size)]
            if extra != row and (cluster < 0 or cluster_ids[extra] != cluster):
                near = np.append(near, extra)
        out[i] = rng.choice(near, size=count, replace=False)
    return out


def _trimmed(tokens: np.ndarray) -> torch.Tensor:
    """The batch's ids cut to its longest question (padding costs time, not values)."""
    width = max(int((tokens != 0).sum(axis=1).max()), 1)
    return torch.from_numpy(np.ascontiguousarray(tokens[:, :width]))


def encode_rows(student: nn.Module, tokens: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """float32 [len(rows), D] student vectors of `rows` (`qpr.training.embed`)."""
    ids = tokens[rows]
    with torch.no_grad():
        return embed_token_ids(student, ids, (ids != 0).sum(axis=1)).numpy()


def validate(student: nn.Module, data: StudentData, k: int = 10) -> dict[str, float]:
    """{"val_mrr": MRR@k of the validation rows searching every document exactly (itself
    excluded), "val_cosine": mean cos(student(q), document(q))}."""
    queries = encode_rows(student, data.tokens, data.val_rows)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True).clip(1e-12)
    documents = data.documents / np.linalg.norm(data.documents, axis=1, keepdims=True).clip(1e-12)
    cosine = float(np.mean(np.sum(queries * documents[data.val_rows], axis=1)))
    reciprocal = []
    for s in range(0, len(queries), 512):
        scores = queries[s : s + 512] @ documents.T
        rows = data.val_rows[s : s + 512]
        scores[np.arange(len(rows)), rows] = -np.inf
        top = np.argpartition(-scores, k, axis=1)[:, :k]
        order = np.take_along_axis(scores, top, axis=1).argsort(axis=1)[:, ::-1]
        top = np.take_along_axis(top, order, axis=1)
        hit = data.cluster_ids[top] == data.cluster_ids[rows][:, None]
        first = np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, np.inf)
        reciprocal.append(1.0 / first)
    return {"val_mrr": float(np.concatenate(reciprocal).mean()), "val_cosine": cosine}


class StudentStep:
    """The student family (qpr.training.loop.Family): Adam over the student's weights; an
    epoch is a pass over the training pairs (or, with none, over the aligned rows)."""

    unit = "questions"
    scheduler = None

    def __init__(
        self, student: nn.Module, loss: QueryAlignmentLoss, data: StudentData, config: StudentConfig
    ) -> None:
        self.model, self.loss, self.data, self.config = student, loss, data, config
        self.rng = np.random.default_rng(config.seed)
        self.documents = torch.from_numpy(np.ascontiguousarray(data.documents, dtype=np.float32))
        self.optimizer = torch.optim.Adam(student.parameters(), lr=config.lr)
        self.counts = {"train_pairs": len(data.pairs), "aligned_questions": len(data.align_rows)}

    def fingerprint(self) -> dict[str, Any]:
        return {
            "loss": f"{type(self.loss).__name__}({self.loss.extra_repr()})",
            "data": self.data.digest(),
        }

    def batches(self, epoch: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
        """(pair indices, aligned rows, which queries are typo'd) per step, from this
        epoch's two permutations (and, with noisy tokens, one coin flip a query)."""
        data, batch = self.data, self.config.batch_size
        pair_order = self.rng.permutation(len(data.pairs))
        align_order = self.rng.permutation(data.align_rows)
        steps = -(-(len(data.pairs) or len(data.align_rows)) // batch)
        out = []
        for step in range(steps):
            pick = pair_order[step * batch : (step + 1) * batch]
            aligned = np.take(align_order, np.arange(step * batch, (step + 1) * batch), mode="wrap")
            # Drawn only with noise, so a run without it draws the batches it always drew.
            flips = None if data.noisy is None else self.rng.random(len(pick) + len(aligned)) < 0.5
            out.append((pick, aligned, flips))
        return out

    def batch_loss(
        self, batch: tuple[np.ndarray, np.ndarray, np.ndarray | None]
    ) -> tuple[torch.Tensor, int]:
        pick, aligned, flips = batch
        data, documents = self.data, self.documents
        anchors, positives = data.pairs[pick, 0], data.pairs[pick, 1]
        rows = np.concatenate([anchors, aligned])
        tokens = data.tokens[rows]
        if flips is not None:
            tokens = np.where(flips[:, None], data.noisy[rows], tokens)
        vectors = self.model(_trimmed(tokens))
        doc_rows = np.concatenate([positives, data.negatives[pick].reshape(-1)])
        loss = self.loss(
            vectors,
            documents[rows],
            vectors[: len(anchors)],
            documents[doc_rows],
            torch.arange(len(anchors)),
        )
        return loss, len(rows)

    def evaluate(self) -> dict[str, float]:
        return validate(self.model, self.data)

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]

    def best_extras(self) -> dict[str, Any]:
        return {}


def train_student(
    student: nn.Module,
    loss: QueryAlignmentLoss,
    data: StudentData,
    config: StudentConfig,
    *,
    out_dir: str | os.PathLike[str],
    on_epoch: EpochCallback | None = None,
    on_progress: ProgressCallback | None = None,
) -> TrainResult:
    """Train `student` in place (qpr.training.loop.fit, checkpoints in out_dir); it ends
    holding the best epoch's weights, in eval mode."""
    step = StudentStep(student, loss, data, config)
    return fit(step, config, out_dir, on_epoch=on_epoch, on_progress=on_progress)
