"""Additive-margin softmax (Wang, Cheng, Liu, Liu 2018, "Additive Margin Softmax for Face
Verification", IEEE Signal Processing Letters 25(7); applied to sentence similarity in
Su 2018, "Sentence similarity model based on GRU and AM-Softmax").

Training is a classification over the C training clusters (one class per paraphrase
cluster); only the encoder is kept. With z = x / ||x|| (the example) and w_j = W_j / ||W_j||
(the learned vector of class j, W a [C, D] parameter of the loss):

    cos θ_j = <z, w_j>
    logit_j = s · (cos θ_j − m·[j = y])
    loss    = mean over examples of CE(logit, y)
            = −log( e^{s(cos θ_y − m)} / (e^{s(cos θ_y − m)} + Σ_{j≠y} e^{s cos θ_j}) )

The margin m makes "closer to its own class vector than to any other" too weak a win: an
example must beat every other class by m in cosine, which pulls paraphrases together and
pushes clusters apart more than plain softmax (the paper: s = 30, m = 0.35). s only lets
the probabilities approach 0 and 1 on cosines in [−1, 1].

Labels are sparse class indices: the margin is subtracted at the target index only
(index_put on the [n, C] logits), never through a one-hot of C columns. Both sides of
each pair are examples of its class: forward(anchors, positives, labels) scores 2N rows.
The batch does not need in-batch negatives (every class vector is one), so two pairs of
one cluster in a batch do no harm here. The geometry learned is angular: serve it with
L2-normalised embeddings (model.normalize), where L2 distance ranks like cosine.

Sampled classes (Partial FC: An et al. 2022, "Killing Two Birds with One Stone: Efficient
and Robust Training of Face Recognition CNNs by Partial FC", CVPR): the [2N, C] logits cost
three [2N, D] x [D, C] products per step, which dominates training once C reaches tens of
thousands. With `sampled_classes` = S < C, each training step scores only S classes: every
class of the batch plus S − (classes in the batch) others drawn uniformly without
replacement, and the softmax runs over those S. The margin and the target are unchanged;
the negatives are a random subset. Draws use torch's default generator, like dropout, so
a seeded, resumed training draws the same classes. In eval mode every class is scored.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class AMSoftmaxLoss(nn.Module):
    """forward(anchors [N, D], positives [N, D], labels int [N]) -> scalar; W [C, D] is
    the loss's own parameter (optimised with the encoder)."""

    needs_labels = True

    def __init__(
        self,
        num_classes: int,
        dim: int,
        margin: float = 0.35,
        scale: float = 30.0,
        sampled_classes: int | None = None,
    ) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {num_classes}")
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        if margin < 0.0:
            raise ValueError(f"margin must be >= 0, got {margin}")
        if scale <= 0.0:
            raise ValueError(f"scale must be > 0, got {scale}")
        if sampled_classes is not None and sampled_classes < 2:
            raise ValueError(f"sampled_classes must be >= 2 or None, got {sampled_classes}")
        self.num_classes = int(num_classes)
        self.dim = int(dim)
        self.margin = float(margin)
        self.scale = float(scale)
        self.sampled_classes = None if sampled_classes is None else int(sampled_classes)
        # Rows of norm ≈ 1, so Adam's step (about lr per coordinate) turns each class
        # vector by a small angle, neither frozen nor jumping.
        self.weight = nn.Parameter(torch.randn(self.num_classes, self.dim) / math.sqrt(self.dim))

    def cosines(
        self, embeddings: torch.Tensor, classes: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[n, C] cos θ_j between each normalised example and each normalised class vector;
        [n, S] against only the class vectors of `classes` (int [S]) when given."""
        weight = self.weight if classes is None else self.weight[classes]
        return F.normalize(embeddings, dim=1) @ F.normalize(weight, dim=1).T

    def sample_classes(self, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(classes int [S], labels as positions in `classes`): the batch's classes first
        (sorted), then uniformly drawn others up to S = sampled_classes (or all classes
        when S >= C or sampling is off)."""
        present = torch.unique(labels)  # sorted
        positions = torch.searchsorted(present, labels)
        wanted = self.sampled_classes
        if wanted is None or wanted >= self.num_classes:
            return torch.arange(self.num_classes, device=labels.device), labels
        absent = torch.ones(self.num_classes, dtype=torch.bool, device=labels.device)
        absent[present] = False
        others = absent.nonzero().squeeze(1)
        draw = max(wanted - present.numel(), 0)
        picked = others[torch.randperm(others.numel(), device=labels.device)[:draw]]
        return torch.cat([present, picked]), positions

    def target_cosine(self, cos_target: torch.Tensor) -> torch.Tensor:
        """ψ(θ_y): what replaces cos θ_y at the target index; here cos θ_y − m."""
        return cos_target - self.margin

    def logits(
        self,
        embeddings: torch.Tensor,
        labels: torch.Tensor,
        classes: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[n, C] s · cos θ_j, with ψ(θ_y) in place of cos θ_y at each row's label; over
        only `classes` when given (then labels are positions in `classes`)."""
        cos = self.cosines(embeddings, classes)
        rows = torch.arange(cos.shape[0], device=cos.device)
        target = self.target_cosine(cos[rows, labels])
        # In place on the scaled copy: nothing saved for backward refers to it, and with
        # C ~ 10⁵ classes another [n, C] copy would cost hundreds of MB.
        return (self.scale * cos).index_put_((rows, labels), self.scale * target)

    def forward(
        self, anchors: torch.Tensor, positives: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        if anchors.shape != positives.shape or anchors.ndim != 2:
            raise ValueError(f"expected two [N, D] tensors, got {anchors.shape}, {positives.shape}")
        if anchors.shape[1] != self.dim:
            raise ValueError(f"embeddings have dim {anchors.shape[1]}, the loss expects {self.dim}")
        labels = labels.to(device=anchors.device, dtype=torch.long)
        if labels.shape != (anchors.shape[0],):
            raise ValueError(f"labels shape {tuple(labels.shape)} != ({anchors.shape[0]},)")
        if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= self.num_classes):
            raise ValueError(
                f"labels must be in [0, {self.num_classes}), got [{int(labels.min())}, "
                f"{int(labels.max())}]"
            )
        examples = torch.cat([anchors, positives])
        both = torch.cat([labels, labels])
        # S >= C would score every class anyway, through a gathered copy of W.
        sampling = self.sampled_classes is not None and self.sampled_classes < self.num_classes
        if self.training and sampling:
            classes, both = self.sample_classes(both)
            return F.cross_entropy(self.logits(examples, both, classes), both)
        return F.cross_entropy(self.logits(examples, both), both)

    def extra_repr(self) -> str:
        return (
            f"num_classes={self.num_classes}, dim={self.dim}, "
            f"margin={self.margin}, scale={self.scale}, sampled_classes={self.sampled_classes}"
        )
