"""A stand-in of a sentence encoder over word pieces, for tests of the word-piece table
(`qpr.model.static.token_vectors`) and of what is built from it."""

from __future__ import annotations

import torch


class PieceTeacher(torch.nn.Module):
    """Mean of a fixed table of 30 pieces over the sequence: pieces in, one 4-d vector
    out."""

    output_dim = 4

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(30, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table(ids).mean(dim=1)
