"""train_student on arrays: a tiny CNN student moves its query vectors toward a fixed
teacher's, and mined negatives never leave their rules."""

from __future__ import annotations

import numpy as np
import torch

from qpr.model.cnn import CNNEncoder
from qpr.model.losses.alignment import QueryAlignmentLoss
from qpr.training.distill import StudentConfig, StudentData, pick_negatives, train_student


def _data(rows: int = 240, vocab: int = 60, dim: int = 8) -> StudentData:
    """Questions of 3-6 word pieces; the teacher: a fixed random table, summed and
    normalised; clusters of 4 questions sharing their first two pieces."""
    rng = np.random.default_rng(0)
    clusters = np.repeat(np.arange(rows // 4), 4)
    tokens = np.zeros((rows, 8), np.int64)
    heads = rng.integers(1, vocab, size=(rows // 4, 2))
    for r in range(rows):
        n = rng.integers(1, 5)
        tokens[r, :2] = heads[clusters[r]]
        tokens[r, 2 : 2 + n] = rng.integers(1, vocab, size=n)
    table = rng.normal(size=(vocab, dim)).astype(np.float32)
    table[0] = 0
    documents = table[tokens].sum(axis=1)
    documents /= np.linalg.norm(documents, axis=1, keepdims=True)
    train = np.arange(rows) < rows * 0.8
    pairs = np.array([[r, r + 1] for r in range(0, int(rows * 0.8), 2)], np.int64)
    return StudentData(
        tokens=tokens,
        documents=documents.astype(np.float32),
        pairs=pairs,
        negatives=np.empty((len(pairs), 0), np.int64),
        align_rows=np.arange(rows),
        val_rows=np.flatnonzero(~train),
        cluster_ids=clusters.astype(np.int64),
    )


def test_a_tiny_student_moves_toward_the_teacher() -> None:
    """Aligned on the training rows only, its vectors of held-out rows move too."""
    torch.manual_seed(0)
    data = _data()
    data = StudentData(**{**data.__dict__, "align_rows": np.arange(192)})
    student = CNNEncoder(
        60, embedding_dim=16, windows=(1,), channels=32, output_dim=8, normalize=True
    )
    config = StudentConfig(batch_size=32, lr=1e-2, max_epochs=6, patience=6, threads=1)
    loss = QueryAlignmentLoss(align_weight=1.0, contrastive_weight=0.0)
    result = train_student(student, loss, data, config, log=lambda _: None)
    cosines = [r["val_cosine"] for r in result.history]
    assert max(cosines) > result.initial["val_cosine"] + 0.15
    assert [r["epoch"] for r in result.history] == list(range(1, len(result.history) + 1))


def test_the_student_keeps_its_best_epoch() -> None:
    torch.manual_seed(0)
    data = _data()
    student = CNNEncoder(
        60, embedding_dim=16, windows=(1,), channels=32, output_dim=8, normalize=True
    )
    config = StudentConfig(batch_size=32, lr=1e-2, max_epochs=3, patience=3, threads=1)
    result = train_student(student, QueryAlignmentLoss(), data, config, log=lambda _: None)
    from qpr.training.distill import validate

    assert validate(student, data)["val_mrr"] == result.best["val_mrr"]


def test_negatives_skip_self_cluster_and_forbidden_rows() -> None:
    cluster_ids = np.array([0, 0, 1, 1, 2, 2, -1, 3], np.int64)
    allowed = np.array([True, True, True, True, False, False, True, True])
    neighbours = np.array([[0, 1, 4, 2, 6, 3, 7, -1]], np.int64)
    out = pick_negatives(
        neighbours, np.array([0]), cluster_ids, allowed, count=2, skip=0, window=2, seed=0
    )
    assert sorted(out[0].tolist()) == [2, 6]  # 1: same cluster, 4: not allowed
    skipped = pick_negatives(
        neighbours, np.array([0]), cluster_ids, allowed, count=1, skip=2, window=1, seed=0
    )
    assert skipped[0].tolist() == [3]


def test_too_few_neighbours_fall_back_to_allowed_rows() -> None:
    cluster_ids = np.array([0, 0, 1, 2], np.int64)
    allowed = np.array([True, True, True, False])
    out = pick_negatives(
        np.array([[1, -1]]), np.array([0]), cluster_ids, allowed, count=1, skip=0, window=5, seed=0
    )
    assert out[0].tolist() == [2]
