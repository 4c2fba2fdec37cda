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

Packing: in eager mode on the CPU (training and validation), a batch that is mostly padding
is not convolved padded; the questions are laid end to end with just enough zeros between
them that no window sees two (CNNEncoder._pooled_packed). The result is the padded
computation's, to float rounding, at the cost of the real tokens instead of batch ×
longest question. Exported graphs (ONNX, TorchScript tracing) keep the padded form.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

# The masked-max fill value: tanh(x) >= -1, so it never beats a real position.
_TANH_MIN = -1.0
# Sequences a packed batch is laid out in (CNNEncoder._pooled_packed).
_LANES = 16


class CNNEncoder(nn.Module):
    """φ: LongTensor[B, L] of token ids (0 = padding) → FloatTensor[B, output_dim]."""

    name = "cnn"
    # Eager calls on the CPU (training, validation) convolve a mostly padded batch packed
    # end to end (_pays_to_pack); an exported graph keeps the padded form, which has static
    # shapes. Same function, tested equal (values and gradients); a switch, not a
    # constructor argument, so checkpoints and configs do not change.
    packed: bool = True

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
        if self.packed and not _exporting() and _pays_to_pack(token_ids):
            h = self._pooled_packed(token_ids)
        else:
            h = self._pooled_padded(token_ids)
        out = self.projection(self.dropout(h))
        if self._config["normalize"]:
            out = F.normalize(out, p=2.0, dim=1)
        return out

    def _pooled_padded(self, token_ids: torch.Tensor) -> torch.Tensor:
        mask = token_ids != 0  # [B, L] bool, True on real tokens
        x = self.embedding(token_ids) * mask.unsqueeze(-1).to(self.embedding.weight.dtype)
        x = x.transpose(1, 2)  # [B, e_dim, L]: Conv1d wants channels first
        keep = mask.unsqueeze(1)  # [B, 1, L]
        pooled = []
        for conv in self.convs:
            h = conv(x) if conv.kernel_size[0] % 2 else conv(x)[:, :, 1:]
            pooled.append(torch.tanh(h).masked_fill(~keep, _TANH_MIN).amax(dim=2))
        return pooled[0] if len(pooled) == 1 else torch.cat(pooled, dim=1)  # [B, c_dim]

    def _pooled_packed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """The padded computation without its padding: each question's span (up to its
        last real token) laid end to end, `max window // 2` zeros between two, so no window
        reaches from one question into the next. A batch trimmed to its longest question is
        mostly padding (Quora: ~34 columns for ~10 tokens), and the convolution's cost
        follows the columns. The questions go round-robin into `_LANES` sequences (a batch of a few
        long rows, which the convolution's threads share better than one row)."""
        batch, width = token_ids.shape
        mask = token_ids != 0
        positions = torch.arange(width, device=token_ids.device)
        spans = torch.where(mask, positions + 1, 0).amax(dim=1)  # [B]
        # A window of w reaches w // 2 positions past a question's last token (and at most
        # that far before its first): that many zeros keep two questions apart.
        gap = max(conv.kernel_size[0] // 2 for conv in self.convs)
        lanes = min(_LANES, batch)
        # Question b goes to lane b % lanes, after the questions b - lanes, b - 2·lanes, ...
        strides = F.pad(spans + gap, (0, (-batch) % lanes)).view(-1, lanes)
        starts = (torch.cumsum(strides, dim=0) - strides).flatten()[:batch]
        length = max(int(strides.sum(dim=0).max()) - gap, 1)
        lane = torch.arange(batch, device=token_ids.device) % lanes
        offset = lane * length + starts  # [B] where question b begins in the flat layout
        at = offset[:, None] + positions[None, :]  # [B, L]
        in_span = positions[None, :] < spans[:, None]
        ids = token_ids[in_span]
        x = self.embedding(ids) * (ids != 0).unsqueeze(-1).to(self.embedding.weight.dtype)
        flat = x.new_zeros(lanes * length, x.shape[1]).index_copy(0, at[in_span], x)
        packed = flat.view(lanes, length, -1).transpose(1, 2)  # [lanes, e_dim, length]
        rows = torch.nonzero(mask, as_tuple=True)[0]  # [N] question of each real token
        real_at = at[mask]  # [N]
        pooled = []
        for conv in self.convs:
            h = conv(packed) if conv.kernel_size[0] % 2 else conv(packed)[:, :, 1:]
            per_position = torch.tanh(h).transpose(1, 2).reshape(lanes * length, -1)
            values = per_position.index_select(0, real_at)  # [N, c]
            start = values.new_full((batch, values.shape[1]), _TANH_MIN)
            index = rows.unsqueeze(1).expand_as(values)
            pooled.append(start.scatter_reduce(0, index, values, reduce="amax"))
        return pooled[0] if len(pooled) == 1 else torch.cat(pooled, dim=1)  # [B, c_dim]


def _pays_to_pack(token_ids: torch.Tensor) -> bool:
    """Packing saves the padding's share of the convolution but adds gathers and scatters.
    Measured side by side with the paper's CNN: training on Quora's pairs (real tokens ~29 %
    of a batch's columns), 2,465 against 815 pairs/s on 2 CPU cores
    (benchmarks/cnn_packing.py); on 16 CPU threads a step of 512 such pairs 74 against 239
    ms, of 512 pairs without padding 75 against 56 ms; on an H100, padded cuDNN convolutions win
    (5.6–6.4 against 10.3–12.5 ms). So: on the CPU, when under half the columns are real
    tokens."""
    if token_ids.device.type != "cpu" or token_ids.numel() == 0:
        return False
    return int(torch.count_nonzero(token_ids)) < token_ids.numel() // 2


def _exporting() -> bool:
    """True while torch.onnx / torch.jit trace or export the module."""
    return torch.jit.is_tracing() or torch.jit.is_scripting() or torch.onnx.is_in_onnx_export()
