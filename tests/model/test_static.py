"""The static query encoder: padding invariance, ONNX parity, the teacher's table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from qpr.model.onnx import export_onnx, parity_check
from qpr.model.static import StaticEncoder, token_vectors


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


class _Teacher(torch.nn.Module):
    """Mean of a fixed table over the sequence: a stand-in of a sentence encoder."""

    output_dim = 4

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(30, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table(ids).mean(dim=1)


def test_token_vectors_encode_each_piece_alone() -> None:
    torch.manual_seed(0)
    teacher = _Teacher()
    table = token_vectors(teacher, 30, cls_id=1, sep_id=2)
    assert table.shape == (30, 4) and torch.all(table[0] == 0)
    expected = teacher(torch.tensor([[1, 17, 2]]))[0]
    torch.testing.assert_close(table[17], expected)
