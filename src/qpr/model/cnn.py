"""The paper's convolutional question encoder φ (Bonadiman et al. 2019, section 2.1.1).

    token ids [B, L] → embedding [B, L, e_dim] → Conv1d per window (same padding) → tanh
    → max over the real tokens → concat [B, c_dim] → dropout → linear [B, n]
    → optional L2 normalisation (``normalize``; not in the paper)

Channels: `channels` is the paper's c_dim, the TOTAL width of the pooled feature vector h.
With several windows it is split across them (the first `channels % len(windows)` windows
get one extra), so changing the window set does not change h's size or the projection.

Padding invariance: a question's vector must not depend on how much padding its batch had
(the index encodes in length-sorted batches, the service one question at a time). Two
things make that exact: padded positions are zeroed after the embedding (so the conv sees
the same zeros that its own same-padding adds) and they are excluded from the max. The
exclusion fills them with -1, tanh's lower bound, instead of -inf: max(real, -1) == max(real)
exactly, an all-padding row yields a finite vector (the projection of -1s), and ONNX gets no
infinities.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

# The masked-max fill value: tanh(x) >= -1, so it never beats a real position.
_TANH_MIN = -1.0


class CNNEncoder(nn.Module):
    """φ: LongTensor[B, L] of token ids (0 = padding) → FloatTensor[B, output_dim]."""

    name = "cnn"

    def __init__(
        self,
        vocab_size: int,
        *,
        embedding_dim: int = 300,
        windows: Sequence[int] = (5,),
        channels: int = 300,
        output_dim: int = 300,
        dropout: float = 0.0,
        normalize: bool = False,
    ) -> None:
        super().__init__()
        windows = tuple(int(w) for w in windows)
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2 (padding + one word), got {vocab_size}")
        if not windows or any(w < 1 for w in windows):
            raise ValueError(f"windows must be a non-empty sequence of sizes >= 1, got {windows}")
        if channels < len(windows):
            raise ValueError(f"channels={channels} < number of windows {len(windows)}")
        self._config: dict[str, Any] = {
            "vocab_size": int(vocab_size),
            "embedding_dim": int(embedding_dim),
            "windows": list(windows),
            "channels": int(channels),
            "output_dim": int(output_dim),
            "dropout": float(dropout),
            "normalize": bool(normalize),
        }
        self.output_dim = int(output_dim)
        # Random init as in the paper; row 0 starts at zero and gets no gradient.
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=0)
        per_window = [channels // len(windows)] * len(windows)
        for i in range(channels % len(windows)):
            per_window[i] += 1
        # "Same" padding keeps one output per token, so the mask lines up with the feature
        # map: w // 2 zeros on each side; an even window then yields L + 1 outputs and
        # forward drops the first (PyTorch's padding="same" alignment, without the
        # per-call input copy it makes for even kernels).
        self.convs = nn.ModuleList(
            nn.Conv1d(embedding_dim, c, kernel_size=w, padding=w // 2)
            for w, c in zip(windows, per_window, strict=True)
        )
        self.dropout = nn.Dropout(dropout)
        self.projection = nn.Linear(channels, output_dim)

    def config(self) -> dict[str, Any]:
        """Constructor kwargs (JSON-friendly), saved with checkpoints: CNNEncoder(**config)."""
        return dict(self._config, windows=list(self._config["windows"]))

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        mask = token_ids != 0  # [B, L] bool, True on real tokens
        x = self.embedding(token_ids) * mask.unsqueeze(-1).to(self.embedding.weight.dtype)
        x = x.transpose(1, 2)  # [B, e_dim, L]: Conv1d wants channels first
        keep = mask.unsqueeze(1)  # [B, 1, L]
        pooled = []
        for conv in self.convs:
            h = conv(x) if conv.kernel_size[0] % 2 else conv(x)[:, :, 1:]
            pooled.append(torch.tanh(h).masked_fill(~keep, _TANH_MIN).amax(dim=2))
        h = pooled[0] if len(pooled) == 1 else torch.cat(pooled, dim=1)  # [B, c_dim]
        out = self.projection(self.dropout(h))
        if self._config["normalize"]:
            out = F.normalize(out, p=2.0, dim=1)
        return out
