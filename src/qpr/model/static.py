"""A static query encoder: one vector per word piece, averaged, projected.

    word-piece ids [B, L] (0 = [PAD]) → embedding [B, L, E] → mean over the real pieces
    → linear [B, D] → optional L2 normalisation

Why: a query is encoded in microseconds, with no attention and no convolution, so a
student of a transformer costs what the CNN costs. Model2Vec (Tulkens & van Dongen 2024)
and sentence-transformers' StaticEmbedding distil such tables from a sentence
transformer; `token_vectors` starts the table the same way (each word piece encoded
alone by the teacher), and training then aligns whole questions
(`qpr.model.losses.alignment`). The mean of unnormalised vectors lets frequent, weak
pieces carry small norms, the weighting Model2Vec bakes into its vectors.

Padding invariance is exact: padded positions are masked out of the sum and the count.
An all-padding row maps to the projection's bias.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

PAD_ID = 0


class StaticEncoder(nn.Module):
    """φ: LongTensor[B, L] of word-piece ids (0 = padding) → FloatTensor[B, output_dim].

    Args:
        vocab_size: ids the table holds (the tokenizer's size).
        embedding_dim: E, the width of a word piece's vector.
        output_dim: D, the width of the question vector (the document encoder's).
        normalize: L2-normalise the output (the document vectors are unit vectors).
    """

    name = "static"

    def __init__(
        self,
        vocab_size: int,
        *,
        embedding_dim: int = 384,
        output_dim: int = 384,
        normalize: bool = True,
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=PAD_ID)
        self.projection = nn.Linear(embedding_dim, output_dim)
        self.output_dim = int(output_dim)
        self._config: dict[str, Any] = {
            "vocab_size": int(vocab_size),
            "embedding_dim": int(embedding_dim),
            "output_dim": int(output_dim),
            "normalize": bool(normalize),
        }
        if embedding_dim == output_dim:
            # Starts as the identity: the table's own space is the teacher's (token_vectors).
            nn.init.eye_(self.projection.weight)
            nn.init.zeros_(self.projection.bias)

    def config(self) -> dict[str, Any]:
        """Constructor kwargs: ``StaticEncoder(**config)`` rebuilds the architecture."""
        return dict(self._config)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        mask = (token_ids != PAD_ID).unsqueeze(-1)  # [B, L, 1]
        vectors = self.embedding(token_ids) * mask
        counts = mask.sum(dim=1).clamp(min=1).to(vectors.dtype)
        out = self.projection(vectors.sum(dim=1) / counts)
        if self._config["normalize"]:
            out = F.normalize(out, p=2.0, dim=1)
        return out


@torch.no_grad()
def token_vectors(teacher: nn.Module, vocab_size: int, *, cls_id: int, sep_id: int) -> torch.Tensor:
    """float32 [vocab_size, D]: each word piece encoded alone by `teacher` as
    [CLS] piece [SEP] (Model2Vec's distillation, without its PCA); row 0 ([PAD]) zero.

    teacher: an encoder of word-piece ids, e.g. `qpr.model.transformer.TransformerEncoder`.
    """
    teacher.eval()
    out = torch.zeros(vocab_size, int(teacher.output_dim))
    ids = torch.arange(1, vocab_size)
    for start in range(0, ids.numel(), 1024):
        piece = ids[start : start + 1024]
        batch = torch.stack(
            [torch.full_like(piece, cls_id), piece, torch.full_like(piece, sep_id)], dim=1
        )
        out[piece] = teacher(batch).float()
    return out
