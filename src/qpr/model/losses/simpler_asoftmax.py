"""simpler-a-softmax (Su 2018, "Sentence similarity model based on GRU and AM-Softmax"):
AM-Softmax with the target cosine tightened multiplicatively in the angle instead of
additively in the cosine,

    ψ(θ_y)  = min(cos mθ_y, cos θ_y),     m a positive integer
    logit_j = s · cos θ_j  (j ≠ y),    logit_y = s · ψ(θ_y)

a simpler stand-in for the piecewise ψ of L-Softmax / A-Softmax (Liu et al. 2016, 2017),
which use cos mθ and need the piecewise form because cos mθ < cos θ fails for large θ;
the min does that job here. cos mθ is the Chebyshev polynomial T_m(cos θ)
(T_0 = 1, T_1 = c, T_{k+1} = 2c·T_k − T_{k−1}): no arccos, whose derivative is infinite
at cos θ = ±1. The article leaves m open; the default 4 is A-Softmax's (SphereFace).
Everything else (normalisation, sparse labels, both sides of a pair as examples) is
AMSoftmaxLoss's.
"""

from __future__ import annotations

import torch

from qpr.model.losses.amsoftmax import AMSoftmaxLoss


class SimplerASoftmaxLoss(AMSoftmaxLoss):
    """AMSoftmaxLoss with ψ(θ) = min(cos mθ, cos θ); `margin` is the integer m."""

    def __init__(
        self,
        num_classes: int,
        dim: int,
        margin: int = 4,
        scale: float = 30.0,
        sampled_classes: int | None = None,
    ) -> None:
        if int(margin) != margin or margin < 1:
            raise ValueError(f"margin must be a positive integer (cos mθ), got {margin}")
        super().__init__(
            num_classes, dim, margin=float(margin), scale=scale, sampled_classes=sampled_classes
        )

    def target_cosine(self, cos_target: torch.Tensor) -> torch.Tensor:
        previous, current = torch.ones_like(cos_target), cos_target
        for _ in range(int(self.margin) - 1):
            previous, current = current, 2.0 * cos_target * current - previous
        return torch.minimum(current, cos_target)

    def extra_repr(self) -> str:
        return (
            f"num_classes={self.num_classes}, dim={self.dim}, "
            f"margin={int(self.margin)}, scale={self.scale}, "
            f"sampled_classes={self.sampled_classes}"
        )
