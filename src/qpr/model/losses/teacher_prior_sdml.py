"""SDML with a teacher prior: the smoothing mass follows a stronger encoder's similarities.

The paper (Bonadiman, Kumar, Mittal 2019) closes by proposing priors other than the uniform
one for the smoothed target. Here the prior of row i is a teacher's softmax over the same
in-batch candidates (the teacher: a pretrained sentence encoder, its vectors computed once
before training and never updated):

    logits_ij = -d(a_i, p_j)                        student, as in SDMLLoss
    q_ij      = softmax_j(logits_ij)
    π_ij      = softmax_j(cos(t(a_i), t(p_j)) / τ)  teacher prior, temperature τ
    t_ij      = (1 - ε)·[i = j] + ε·π_ij
    loss      = 1/N · Σ_i KL(t_i ‖ q_i)

τ → ∞ makes π uniform (1/N) and the loss SDML itself; ε = 1 is pure in-batch distillation
(the student copies the teacher's ranking of the batch, as in Hinton et al. 2015); ε = 0 is
cross-entropy. The teacher spends its mass on the negatives it finds close (the near-
duplicates a uniform prior cannot tell from random questions), so the student learns which
negatives are hard without being told they are positives.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from qpr.model.losses.sdml import Distance, SDMLLoss


class TeacherPriorSDMLLoss(nn.Module):
    """forward(anchors [N, D], positives [N, D], teacher_anchors [N, T], teacher_positives
    [N, T]) -> scalar. The teacher vectors need not be unit length (cosine is taken here)."""

    needs_teacher = True

    def __init__(
        self, smoothing: float = 0.5, temperature: float = 0.05, distance: Distance = "squared"
    ) -> None:
        super().__init__()
        if not 0.0 <= smoothing <= 1.0:
            raise ValueError(f"smoothing must be in [0, 1], got {smoothing}")
        if not temperature > 0.0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        # SDMLLoss checks `distance` and owns the student logits: one definition of both.
        self._student = SDMLLoss(smoothing=0.0, distance=distance)
        self.smoothing = float(smoothing)
        self.temperature = float(temperature)
        self.distance = distance

    def prior(self, teacher_anchors: torch.Tensor, teacher_positives: torch.Tensor) -> torch.Tensor:
        """[N, N] row-stochastic π from the teacher's cosine similarities."""
        a = F.normalize(teacher_anchors.float(), dim=1)
        p = F.normalize(teacher_positives.float(), dim=1)
        return F.softmax(a @ p.T / self.temperature, dim=1)

    def forward(
        self,
        anchors: torch.Tensor,
        positives: torch.Tensor,
        teacher_anchors: torch.Tensor,
        teacher_positives: torch.Tensor,
    ) -> torch.Tensor:
        if anchors.shape != positives.shape or anchors.ndim != 2:
            raise ValueError(f"expected two [N, D] tensors, got {anchors.shape}, {positives.shape}")
        n = anchors.shape[0]
        if (
            teacher_anchors.shape != teacher_positives.shape
            or teacher_anchors.ndim != 2
            or teacher_anchors.shape[0] != n
        ):
            raise ValueError(
                f"expected two [{n}, T] teacher tensors, got {tuple(teacher_anchors.shape)}, "
                f"{tuple(teacher_positives.shape)}"
            )
        log_q = F.log_softmax(self._student.logits(anchors, positives), dim=1)
        with torch.no_grad():
            target = self.smoothing * self.prior(teacher_anchors, teacher_positives)
            target.diagonal().add_(1.0 - self.smoothing)
        return F.kl_div(log_q, target.to(log_q.dtype), reduction="batchmean")

    def extra_repr(self) -> str:
        return (
            f"smoothing={self.smoothing}, temperature={self.temperature}, "
            f"distance={self.distance!r}"
        )
