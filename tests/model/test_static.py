"""The static query encoder: padding invariance, ONNX parity, the teacher's table and its
SIF start."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from qpr.model.onnx import export_onnx, parity_check
from qpr.model.static import StaticEncoder, sif_table, token_vectors
from tests.model.piece_teacher import PieceTeacher


def test_padding_changes_nothing() -> None:
    torch.manual_seed(0)
    encoder = StaticEncoder(50, embedding_dim=8, output_dim=6).eval()
    short = torch.tensor([[5, 7, 9]])
    padded = torch.tensor([[5, 7, 9, 0, 0, 0, 0]])
    torch.testing.assert_close(encoder(short), encoder(padded), rtol=0, atol=1e-7)


def test_output_is_the_projected_mean_of_the_pieces() -> None:
    torch.manual_seed(0)
    encoder = StaticEncoder(20, embedding_dim=4, output_dim=3, normalize=False).eval()
    ids = torch.tensor([[3, 4, 0]])
    table = encoder.embedding.weight.detach()
    expected = encoder.projection(table[[3, 4]].mean(dim=0, keepdim=True))
    torch.testing.assert_close(encoder(ids), expected)


def test_equal_widths_start_as_the_identity() -> None:
    encoder = StaticEncoder(10, embedding_dim=5, output_dim=5, normalize=False).eval()
    ids = torch.tensor([[2]])
    torch.testing.assert_close(encoder(ids), encoder.embedding.weight[2:3])


def test_onnx_gives_torchs_vectors(tmp_path: Path) -> None:
    torch.manual_seed(1)
    encoder = StaticEncoder(100, embedding_dim=16, output_dim=16)
    path = export_onnx(encoder, tmp_path / "static.onnx")
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 100, size=(8, 12)), np.array([[3, 4, 0, 0], [0, 0, 0, 0]])]
    assert parity_check(encoder, path, batches)["max_abs_diff"] < 1e-5


def test_token_vectors_encode_each_piece_alone() -> None:
    torch.manual_seed(0)
    teacher = PieceTeacher()
    table = token_vectors(teacher, 30, cls_id=1, sep_id=2)
    assert table.shape == (30, 4) and torch.all(table[0] == 0)
    expected = teacher(torch.tensor([[1, 17, 2]]))[0]
    torch.testing.assert_close(table[17], expected)


def _pooled_table(rng: np.random.Generator, pieces: int, dim: int) -> torch.Tensor:
    """Unit vectors near one shared direction, as a pooled teacher gives its pieces."""
    common = np.zeros(dim)
    common[0] = 3.0
    rows = common + rng.normal(size=(pieces, dim))
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    rows[0] = 0.0
    return torch.from_numpy(rows.astype(np.float32))


def _cos(table: torch.Tensor, a: list[int], b: list[int]) -> float:
    encoder = StaticEncoder(table.shape[0], embedding_dim=table.shape[1], output_dim=table.shape[1])
    encoder.embedding.weight.data.copy_(table)
    with torch.no_grad():
        x, y = encoder(torch.tensor([a])), encoder(torch.tensor([b]))
    return float((x * y).sum())


def test_the_sif_start_tells_questions_apart_by_their_rare_pieces() -> None:
    """Pieces 1-3 are in every question ("what", "is", "the"); 4-9 are rare. Two questions
    that share only the common pieces look alike to the plain mean of a pooled teacher's
    vectors; from the SIF table they look far less alike than two that share a rare one."""
    table = _pooled_table(np.random.default_rng(0), 10, 16)
    counts = np.array([500, 100, 100, 100, 1, 1, 1, 1, 1, 1])
    sif = sif_table(table, counts, 1e-3)
    shared_common = ([1, 2, 3, 4], [1, 2, 3, 5])
    shared_rare = ([1, 2, 3, 4], [1, 2, 6, 4])
    assert _cos(table, *shared_common) > 0.8  # the common direction dominates
    assert _cos(sif, *shared_common) < 0.5 < _cos(sif, *shared_rare)
    # The common direction is removed; a frequent piece weighs less than a rare one.
    assert sif[4].norm() > 10 * sif[1].norm()
    assert torch.all(sif[0] == 0) and sif.dtype == torch.float32


def test_the_sif_table_refuses_counts_of_another_vocabulary() -> None:
    with pytest.raises(ValueError, match="counts must have shape"):
        sif_table(torch.zeros(10, 4), np.ones(9, np.int64), 1e-3)
