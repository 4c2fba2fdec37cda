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

Two extensions, both off by default (the paper's loss):
- scale s multiplies every logit, -s·d(a_i, p_j): on L2-normalised vectors d = 2 - 2·cos,
  so s = 10 is the cosine softmax with temperature 0.05 of Sentence-BERT's
  MultipleNegativesRankingLoss (Henderson et al. 2017), here with SDML's smoothing.
- hard negatives: forward(anchors, positives, negatives [M, D]) appends M columns
  -s·d(a_i, n_m) to every row (shared by the whole batch, as in DPR, Karpukhin et al.
  2020); the target keeps 1 - ε on the diagonal and spreads ε over all N + M columns.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

Distance = Literal["squared", "euclidean"]


class SDMLLoss(nn.Module):
    """SDML over in-batch negatives; forward(anchors [N, D], positives [N, D]) -> scalar."""

    takes_negatives = True

    def __init__(
        self, smoothing: float = 0.3, distance: Distance = "squared", scale: float = 1.0
    ) -> None:
        super().__init__()
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
        if not scale > 0.0:
            raise ValueError(f"scale must be > 0, got {scale}")
        if distance not in ("squared", "euclidean"):
            raise ValueError(f"distance must be 'squared' or 'euclidean', got {distance!r}")
        self.smoothing = float(smoothing)
        self.distance = distance
        self.scale = float(scale)

    def logits(self, anchors: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
        """[N, M] matrix of -s·d(a_i, p_j) for anchors [N, D] and candidates [M, D]."""
        return self.scale * self._neg_distances(anchors, positives)

    def _neg_distances(self, anchors: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
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

    def forward(
        self,
        anchors: torch.Tensor,
        positives: torch.Tensor,
        negatives: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if anchors.shape != positives.shape or anchors.ndim != 2:
            raise ValueError(f"expected two [N, D] tensors, got {anchors.shape}, {positives.shape}")
        if negatives is not None and (
            negatives.ndim != 2 or negatives.shape[1] != anchors.shape[1]
        ):
            raise ValueError(f"negatives must be [M, {anchors.shape[1]}], got {negatives.shape}")
        candidates = positives if negatives is None else torch.cat([positives, negatives])
        log_q = F.log_softmax(self.logits(anchors, candidates), dim=1)
        target = torch.full_like(log_q, self.smoothing / log_q.shape[1])
        # Row i's positive is column i (the negatives' columns come after the positives).
        target.diagonal().add_(1.0 - self.smoothing)
        # kl_div uses xlogy, so target zeros (ε = 0) contribute exactly 0.
        return F.kl_div(log_q, target, reduction="batchmean")

    def extra_repr(self) -> str:
        # The scale only when set, so fingerprints of runs from before it still match.
        extra = f", scale={self.scale:g}" if self.scale != 1.0 else ""
        return f"smoothing={self.smoothing}, distance={self.distance!r}{extra}"
