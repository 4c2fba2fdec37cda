"""A static query encoder: one vector per word piece, averaged, projected.

    word-piece ids [B, L] (0 = [PAD]) → embedding [B, L, E] → mean over the real pieces
    → linear [B, D] → optional L2 normalisation

Why: a query is encoded in microseconds, with no attention and no convolution, so a
student of a transformer costs what the CNN costs. Model2Vec (Tulkens & van Dongen 2024)
and sentence-transformers' StaticEmbedding distil such tables from a sentence
transformer; `token_vectors` starts the table the same way (each word piece encoded
alone by the teacher), and training then aligns whole questions
(`qpr.model.losses.alignment`).

A pooled teacher gives every piece a unit vector, all near one common direction (what
[CLS] and [SEP] add to each). Their plain mean hardly tells questions apart: on the
embedded logs its validation MRR was 0.11 before any training. `sif_table` removes
the common direction and scales each piece by a / (a + its frequency), the smooth inverse
frequency of Arora et al. (2017), which Model2Vec approximates by its PCA and Zipf
weights. So started, the same mean scored 0.92 before any training.

Padding invariance is exact: padded positions are masked out of the sum and the count.
An all-padding row maps to the projection's bias.
"""

from __future__ import annotations

from typing import Any

import numpy as np
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


def sif_table(table: torch.Tensor, counts: np.ndarray, a: float) -> torch.Tensor:
    """float32 [V, D]: `table` (`token_vectors`) centred on its pieces' mean, each row then
    scaled by a / (a + p), p its piece's share of `counts`; row 0 ([PAD]) stays zero.

    counts: int [V], how often each piece occurs in the questions the student may read
    (never validation or test ones). A piece never seen gets weight 1: it is rare.
    """
    if counts.shape != (table.shape[0],):
        raise ValueError(f"counts must have shape ({table.shape[0]},), got {counts.shape}")
    if a <= 0:
        raise ValueError(f"a must be > 0, got {a}")
    # float64 in numpy: a sum down axis 0 adds row after row, whatever the SIMD width, so
    # the table has the same bits on any x86-64 CPU.
    out = table.detach().cpu().numpy().astype(np.float64)
    out[1:] -= out[1:].mean(axis=0)
    seen = counts.astype(np.float64)
    seen[0] = 0.0
    out *= (a / (a + seen / max(seen.sum(), 1.0)))[:, None]
    out[0] = 0.0
    return torch.from_numpy(out.astype(np.float32))
