"""Triplet loss with in-batch negatives (Schroff et al. 2015; Bonadiman et al. 2019 eq. 1).

    loss = 1/N · Σ_i max(0, d(a_i, p_i) - d(a_i, n_i) + α)

d is "squared" (SSD, ||·||², eq. 1 and FaceNet) or "euclidean" (EUC, ||·||, PyTorch's
TripletMarginLoss); the paper reports SSD clearly better (its Tables 3-5), so it is the
default here. The negative n_i is another pair's positive p_j, j != i:

- "random": j uniform over the other N - 1 rows (the paper's TL (Rand));
- "hard":   j = argmin_{j != i} d(a_i, p_j), the closest non-matching positive (TL (Hard),
  Manmatha et al. 2017; the paper shows it suffers most from false negatives).

Every j != i counts as non-matching, which holds when batches come from the
ClusterDisjointBatchSampler. Random negatives are drawn from the loss's own
torch.Generator (seeded by `seed`); its state is part of state_dict(), so a resumed run
draws the same negatives as an uninterrupted one. No global RNG is touched.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

Distance = Literal["squared", "euclidean"]
Negatives = Literal["random", "hard"]


class TripletLoss(nn.Module):
    """forward(anchors [N, D], positives [N, D]) -> scalar; negatives mined in the batch."""

    def __init__(
        self,
        margin: float = 0.5,
        distance: Distance = "squared",
        negatives: Negatives = "random",
        seed: int = 0,
    ) -> None:
        super().__init__()
        if distance not in ("squared", "euclidean"):
            raise ValueError(f"distance must be 'squared' or 'euclidean', got {distance!r}")
        if negatives not in ("random", "hard"):
            raise ValueError(f"negatives must be 'random' or 'hard', got {negatives!r}")
        self.margin = float(margin)
        self.distance = distance
        self.negatives = negatives
        self.seed = int(seed)
        self._generator = torch.Generator(device="cpu")
        self._generator.manual_seed(self.seed)

    def pair_distance(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Row-wise d(x_i, y_i) -> [N], computed from the difference (exact, differentiable)."""
        sq = (x - y).pow(2).sum(dim=1)
        if self.distance == "squared":
            return sq
        # sqrt'(0) is infinite: clamp so identical vectors do not produce NaN gradients.
        return sq.clamp_min(1e-12).sqrt()

    def negative_indices(self, anchors: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
        """LongTensor[N]: for row i, the index j != i of the positive used as its negative."""
        n = anchors.shape[0]
        if self.negatives == "random":
            # i + U{1..N-1} mod N is uniform over the other rows, never i itself.
            shift = torch.randint(1, n, (n,), generator=self._generator)
            return ((torch.arange(n) + shift) % n).to(anchors.device)
        with torch.no_grad():
            # Squared distances rank the same as euclidean ones; the expansion is one matmul.
            sq = (
                (anchors * anchors).sum(dim=1, keepdim=True)
                - 2.0 * anchors @ positives.T
                + (positives * positives).sum(dim=1)[None, :]
            )
            sq.fill_diagonal_(float("inf"))
            return sq.argmin(dim=1)

    def forward(self, anchors: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
        if anchors.shape != positives.shape or anchors.ndim != 2:
            raise ValueError(f"expected two [N, D] tensors, got {anchors.shape}, {positives.shape}")
        if anchors.shape[0] < 2:
            # No other row to serve as a negative; keep the graph so backward() still works.
            return anchors.sum() * 0.0
        negatives = positives[self.negative_indices(anchors, positives)]
        d_pos = self.pair_distance(anchors, positives)
        d_neg = self.pair_distance(anchors, negatives)
        return torch.relu(d_pos - d_neg + self.margin).mean()

    # The generator state travels with state_dict() (checkpoints, resume).
    def get_extra_state(self) -> dict[str, Any]:
        return {"seed": self.seed, "generator": self._generator.get_state()}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.seed = int(state["seed"])
        self._generator.set_state(state["generator"])

    def extra_repr(self) -> str:
        return (
            f"margin={self.margin}, distance={self.distance!r}, "
            f"negatives={self.negatives!r}, seed={self.seed}"
        )
