"""train_student on arrays: a tiny CNN student moves its query vectors toward a fixed
teacher's through the one loop (best epoch kept, resumable, stopped by epochs and
validation), and mined negatives never leave their rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from qpr.config import settings_from_dict
from qpr.model.cnn import CNNEncoder
from qpr.model.losses.alignment import QueryAlignmentLoss
from qpr.training.checkpoint import TrainingStateError, load_checkpoint
from qpr.training.distill import StudentConfig, StudentData, pick_negatives, train_student
from tests.training.kills import Killed, kill_after


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


def _student() -> CNNEncoder:
    torch.manual_seed(0)
    return CNNEncoder(60, embedding_dim=16, windows=(1,), channels=32, output_dim=8, normalize=True)


def _config(**knobs: Any) -> StudentConfig:
    return StudentConfig(**{"batch_size": 32, "lr": 1e-2, "threads": 1, "progress": False, **knobs})


def test_a_tiny_student_moves_toward_the_teacher(tmp_path: Path) -> None:
    """Aligned on the training rows only, its vectors of held-out rows move too."""
    data = _data()
    data = StudentData(**{**data.__dict__, "align_rows": np.arange(192)})
    loss = QueryAlignmentLoss(align_weight=1.0, contrastive_weight=0.0)
    config = _config(max_epochs=6, patience=6)
    result = train_student(_student(), loss, data, config, out_dir=tmp_path)
    cosines = [r["val_cosine"] for r in result.history]
    assert max(cosines) > result.initial["val_cosine"] + 0.15
    assert [r["epoch"] for r in result.history] == list(range(1, len(result.history) + 1))
    assert result.counts == {"train_pairs": 96, "aligned_questions": 192}


def test_the_student_keeps_its_best_epoch(tmp_path: Path) -> None:
    from qpr.training.distill import validate

    data, student = _data(), _student()
    config = _config(max_epochs=3, patience=3)
    result = train_student(student, QueryAlignmentLoss(), data, config, out_dir=tmp_path)
    assert validate(student, data)["val_mrr"] == result.best["val_mrr"]
    mrrs = [r["val_mrr"] for r in result.history]
    assert result.best["val_mrr"] == max(mrrs) == mrrs[result.best_epoch - 1]
    assert not student.training
    assert load_checkpoint(result.best_checkpoint)["epoch"] == result.best_epoch


def test_a_killed_student_resumes_to_the_same_weights(tmp_path: Path) -> None:
    """Its batch order comes from one generator drawn epoch after epoch: last.pt holds it."""
    data, loss = _data(), QueryAlignmentLoss()
    config = _config(max_epochs=4, patience=10)
    straight = _student()
    train_student(straight, loss, data, config, out_dir=tmp_path / "straight")

    with pytest.raises(Killed):
        train_student(
            _student(),
            loss,
            data,
            config,
            out_dir=tmp_path / "resumed",
            on_epoch=kill_after(2),
        )
    resumed = _student()
    result = train_student(resumed, loss, data, config, out_dir=tmp_path / "resumed")
    assert result.resumed_from_epoch == 2 and len(result.history) == 4
    weights = zip(straight.state_dict().values(), resumed.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in weights)
    # Other data is another run: refused, not continued.
    other = StudentData(**{**data.__dict__, "val_rows": data.val_rows[:10]})
    with pytest.raises(TrainingStateError, match="data"):
        train_student(_student(), loss, other, config, out_dir=tmp_path / "resumed")


def test_patience_stops_the_student(tmp_path: Path) -> None:
    """A learning rate that overshoots: no better validation MRR after the first epochs."""
    config = _config(lr=3.0, max_epochs=30, patience=1)
    result = train_student(_student(), QueryAlignmentLoss(), _data(), config, out_dir=tmp_path)
    assert result.stopped_early and result.last_epoch == result.best_epoch + 1 < 30


def test_the_config_comes_from_the_settings() -> None:
    settings = settings_from_dict({"seed": 5, "student": {"max_epochs": 4, "patience": 3}})
    config = StudentConfig.from_settings(settings)
    assert (config.seed, config.max_epochs, config.patience, config.monitor) == (5, 4, 3, "val_mrr")
    assert config.batch_size == settings.student.batch_size and config.lr == settings.student.lr
    assert config.time_budget_s is None  # no budget unless asked for
    budgeted = settings_from_dict({"student": {"time_budget_s": 900}})
    assert StudentConfig.from_settings(budgeted).time_budget_s == 900
    # The SIF start is the static student's alone: another kind starts from the teacher's
    # vectors as they are, and its fingerprint says so.
    assert config.sif == settings.student.sif == 1e-3
    cnn = settings_from_dict({"student": {"kind": "cnn", "sif": 0.01}})
    assert cnn.student.sif_start == 0.0 and StudentConfig.from_settings(cnn).sif == 0.0


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
