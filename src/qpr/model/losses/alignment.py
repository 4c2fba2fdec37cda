"""Query-encoder distillation: a student encodes queries into a fixed document space.

The documents keep the teacher's vectors d(·), computed once by the index stage. A query
student s(·) is trained on two terms:

    align       = 1/N · Σ_i (1 - cos(s(q_i), d(q_i)))         every question, no labels
    contrastive = 1/M · Σ_j -log softmax_k(cos(s(a_j), d_k) / τ)[k = p_j]
                  over the documents k of the batch: the positives of every pair and
                  the mined hard negatives (InfoNCE, van den Oord et al. 2018)
    loss        = w_align · align + w_con · contrastive

Alignment alone is embedding-alignment distillation (Wang & Lyu 2023, "Query Encoder
Distillation via Embedding Alignment"; Kim et al. 2023, "EmbedDistill"): a question lands
where the teacher put it, so a paraphrase indexed by the teacher is found where the
teacher would find it. The contrastive term spends the student's small capacity on the
distinctions retrieval needs: the paraphrase over the nearest non-paraphrases.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class QueryAlignmentLoss(nn.Module):
    """forward(student [N, D], targets [N, D], anchors [M, D], documents [K, D],
    positive [M] int64) -> scalar.

    student / targets: the student's and the teacher's vectors of the same N questions.
    anchors: the student's vectors of M training queries; documents: teacher vectors of
    the batch's documents; positive[j]: the row of documents holding a_j's paraphrase.
    Vectors need not be unit length: cosines are taken here.
    """

    def __init__(
        self, align_weight: float = 1.0, contrastive_weight: float = 1.0, temperature: float = 0.05
    ) -> None:
        super().__init__()
        if align_weight < 0 or contrastive_weight < 0 or align_weight + contrastive_weight == 0:
            raise ValueError(
                f"weights must be >= 0 and not both 0, got {align_weight}, {contrastive_weight}"
            )
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.align_weight = float(align_weight)
        self.contrastive_weight = float(contrastive_weight)
        self.temperature = float(temperature)

    def extra_repr(self) -> str:
        return (
            f"align_weight={self.align_weight}, contrastive_weight={self.contrastive_weight}, "
            f"temperature={self.temperature}"
        )

    def forward(
        self,
        student: torch.Tensor,
        targets: torch.Tensor,
        anchors: torch.Tensor,
        documents: torch.Tensor,
        positive: torch.Tensor,
    ) -> torch.Tensor:
        loss = student.new_zeros(())
        if self.align_weight:
            cosine = F.cosine_similarity(student, targets, dim=1)
            loss = loss + self.align_weight * (1.0 - cosine).mean()
        if self.contrastive_weight and anchors.shape[0]:
            logits = F.normalize(anchors, dim=1) @ F.normalize(documents, dim=1).T
            loss = loss + self.contrastive_weight * F.cross_entropy(
                logits / self.temperature, positive
            )
        return loss
