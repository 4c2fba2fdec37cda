"""Smoothed Deep Metric Learning loss (Bonadiman, Kumar, Mittal 2019, section 3.1).

For a batch of N positive pairs (a_i, p_i), every other positive p_j (j != i) is a negative
for a_i (the batched form of the paper's Figure 1, O(2N) encoder passes instead of O(N²)):

    logits_ij = -d(a_i, p_j),      d = ||a_i - p_j||²  (eq. 2; "euclidean": ||a_i - p_j||)
    q_ij      = softmax_j(logits_ij)
    t_ij      = (1 - ε)·[i = j] + ε/N           (eq. 3, label smoothing, Szegedy et al. 2016)
    loss      = 1/N · Σ_i KL(t_i ‖ q_i) = 1/N · Σ_ij t_ij · (log t_ij - log q_ij)

The diagonal target is 1 - ε + ε/N: with ε = 0.3 and N = 3 that is 0.8 / 0.1 / 0.1, the
numbers in the paper's Figure 1. KL and cross-entropy differ by the target's entropy, a
constant, so they have the same gradients (paper footnote 2); ε = 0 is plain cross-entropy
with the diagonal as labels. The mean over rows is KLDivLoss(reduction="batchmean").

Two pairs of one cluster in a batch would be a false negative by construction; the
ClusterDisjointBatchSampler prevents that, the smoothing softens what remains (label noise).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

Distance = Literal["squared", "euclidean"]


class SDMLLoss(nn.Module):
    """SDML over in-batch negatives; forward(anchors [N, D], positives [N, D]) -> scalar."""

    def __init__(self, smoothing: float = 0.3, distance: Distance = "squared") -> None:
        super().__init__()
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
        if distance not in ("squared", "euclidean"):
            raise ValueError(f"distance must be 'squared' or 'euclidean', got {distance!r}")
        self.smoothing = float(smoothing)
        self.distance = distance

    def logits(self, anchors: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
        """[N, N] matrix of -d(a_i, p_j)."""
        if self.distance == "squared":
            # -||a_i||² - ||p_j||² + 2 a_i·p_j; the -||a_i||² term is the same for a whole
            # row and cancels in the row softmax, so it is left out: one matmul, and no
            # cancellation error from subtracting two large norms.
            return 2.0 * anchors @ positives.T - (positives * positives).sum(dim=1)[None, :]
        sq = (
            (anchors * anchors).sum(dim=1, keepdim=True)
            - 2.0 * anchors @ positives.T
            + (positives * positives).sum(dim=1)[None, :]
        )
        # The expansion can dip below 0 by rounding, and sqrt'(0) is infinite: clamp.
        return -sq.clamp_min(1e-12).sqrt()

    def forward(self, anchors: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
        if anchors.shape != positives.shape or anchors.ndim != 2:
            raise ValueError(f"expected two [N, D] tensors, got {anchors.shape}, {positives.shape}")
        n = anchors.shape[0]
        log_q = F.log_softmax(self.logits(anchors, positives), dim=1)
        target = torch.full_like(log_q, self.smoothing / n)
        target.diagonal().add_(1.0 - self.smoothing)
        # kl_div uses xlogy, so target zeros (ε = 0) contribute exactly 0.
        return F.kl_div(log_q, target, reduction="batchmean")

    def extra_repr(self) -> str:
        return f"smoothing={self.smoothing}, distance={self.distance!r}"
