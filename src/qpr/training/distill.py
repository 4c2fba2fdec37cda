"""Training a query student into a fixed document space (`qpr.model.losses.alignment`).

Everything is an array over index rows: `tokens[r]` is row r's question as padded word-piece
ids, `documents[r]` its vector from the document encoder (what the index holds). A step
takes a batch of training pairs (query row, paraphrase row, mined negative rows) and a
batch of rows to align, encodes the queries and the aligned rows with the student in one
call, and scores them against the documents' fixed vectors. Validation searches every
document exactly with a seeded sample of validation questions (MRR@10, a paraphrase =
same cluster). The best epoch's weights are kept; a time budget and patience stop early.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from qpr.model.losses.alignment import QueryAlignmentLoss
from qpr.training.embed import embed_token_ids


@dataclass(frozen=True)
class StudentConfig:
    batch_size: int = 256
    lr: float = 2e-3
    max_epochs: int = 10
    patience: int = 2
    time_budget_s: float | None = None
    seed: int = 13
    threads: int = 2
    progress_every_s: float = 30.0


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


@dataclass
class StudentResult:
    best_epoch: int
    initial: dict[str, float]
    best: dict[str, float]
    history: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0


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


def train_student(
    student: nn.Module,
    loss_fn: QueryAlignmentLoss,
    data: StudentData,
    config: StudentConfig,
    *,
    log: Callable[[str], None] = print,
) -> StudentResult:
    """Train `student` in place; it ends holding the best epoch's weights."""
    torch.manual_seed(config.seed)
    torch.set_num_threads(config.threads)
    rng = np.random.default_rng(config.seed)
    documents = torch.from_numpy(np.ascontiguousarray(data.documents, dtype=np.float32))
    optimizer = torch.optim.Adam(student.parameters(), lr=config.lr)
    initial = validate(student, data)
    result = StudentResult(0, initial, dict(initial))
    best_state = copy.deepcopy(student.state_dict())
    log(f"before training: val MRR {initial['val_mrr']:.4f}, cos {initial['val_cosine']:.3f}")
    started, bad = time.perf_counter(), 0
    batch = config.batch_size
    # An epoch is a pass over the training pairs (or, with none, over the aligned rows).
    steps = -(-(len(data.pairs) or len(data.align_rows)) // batch)
    for epoch in range(1, config.max_epochs + 1):
        student.train()
        pair_order = rng.permutation(len(data.pairs))
        align_order = rng.permutation(data.align_rows)
        loss_sum, seen, t0, last_line = 0.0, 0, time.perf_counter(), time.perf_counter()
        for step in range(steps):
            pick = pair_order[step * batch : (step + 1) * batch]
            anchors, positives = data.pairs[pick, 0], data.pairs[pick, 1]
            aligned = np.take(align_order, np.arange(step * batch, (step + 1) * batch), mode="wrap")
            rows = np.concatenate([anchors, aligned])
            vectors = student(_trimmed(data.tokens[rows]))
            doc_rows = np.concatenate([positives, data.negatives[pick].reshape(-1)])
            loss = loss_fn(
                vectors,
                documents[rows],
                vectors[: len(anchors)],
                documents[doc_rows],
                torch.arange(len(anchors)),
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(rows)
            seen += len(rows)
            now = time.perf_counter()
            if now - last_line > config.progress_every_s:
                log(f"epoch {epoch}: step {step + 1}/{steps}, loss {loss_sum / seen:.4f}")
                last_line = now
            if config.time_budget_s and now - started > config.time_budget_s:
                break
        metrics = validate(student, data)
        record = {
            "epoch": epoch,
            "train_loss": loss_sum / max(seen, 1),
            **metrics,
            "train_seconds": time.perf_counter() - t0,
            "questions_per_s": seen / max(time.perf_counter() - t0, 1e-9),
        }
        result.history.append(record)
        log(
            f"epoch {epoch}: loss {record['train_loss']:.4f}, val MRR {metrics['val_mrr']:.4f}, "
            f"cos {metrics['val_cosine']:.3f}, {record['questions_per_s']:.0f} questions/s"
        )
        if metrics["val_mrr"] > result.best["val_mrr"] or result.best_epoch == 0:
            result.best_epoch, result.best, bad = epoch, dict(metrics), 0
            best_state = copy.deepcopy(student.state_dict())
        else:
            bad += 1
        spent = config.time_budget_s and time.perf_counter() - started > config.time_budget_s
        if bad >= config.patience or spent:
            break
    student.load_state_dict(best_state)
    student.eval()
    result.seconds = time.perf_counter() - started
    return result
