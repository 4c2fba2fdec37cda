"""qpr.training.embed.embed_with_progress: the one-call vectors, chunk by chunk, reported."""

from __future__ import annotations

import numpy as np
import torch

from qpr.training.embed import embed_token_ids, embed_with_progress


class _MeanOfEmbeddings(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(12, 3, padding_idx=0)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = (ids != 0).unsqueeze(-1).float()
        return (self.table(ids) * mask).sum(1) / mask.sum(1).clamp(min=1.0)


def test_chunks_report_progress_and_match_one_call() -> None:
    torch.manual_seed(0)
    encoder = _MeanOfEmbeddings()
    ids = np.array([[1, 2, 0], [3, 0, 0], [4, 5, 6], [7, 8, 0], [9, 0, 0]], dtype=np.int64)
    lengths = np.array([2, 1, 3, 2, 1], dtype=np.int64)
    reports: list[tuple[int, int]] = []
    vectors = embed_with_progress(
        encoder,
        ids,
        lengths,
        chunk=2,
        report=lambda done, total, rate: reports.append((done, total)),
        batch_size=2,
    )
    assert reports == [(2, 5), (4, 5), (5, 5)]
    assert vectors.dtype == np.float32 and vectors.shape == (5, 3)
    expected = embed_token_ids(encoder, ids, lengths, batch_size=8).numpy()
    np.testing.assert_allclose(vectors, expected, rtol=0, atol=1e-6)
    # Row 2 by hand: the mean of its three embeddings.
    by_hand = encoder.table.weight[[4, 5, 6]].mean(0).detach().numpy()
    np.testing.assert_allclose(vectors[2], by_hand, atol=1e-6)
    assert encoder.training  # embed_token_ids restores the mode it found


def test_pinned_torch_math_runs_without_onednn_or_nnpack(monkeypatch) -> None:
    """Where the process pinned its math, convolutions must not reach oneDNN or NNPACK
    (they pick their code by the CPU); the switches are put back after the block."""
    from qpr import environment
    from qpr.training.embed import torch_math

    before = torch.get_num_threads()
    with torch_math(1):
        assert torch.backends.mkldnn.enabled  # not pinned: this process's own math
        assert torch.get_num_threads() == 1
    for key, value in environment.PINNED_MATH.items():
        monkeypatch.setenv(key, value)
    with torch_math(1):
        assert not torch.backends.mkldnn.enabled and not torch._C._get_nnpack_enabled()
    assert torch.backends.mkldnn.enabled and torch._C._get_nnpack_enabled()
    assert torch.get_num_threads() == before
