"""Metric-learning losses: forward(anchors [N, D], positives [N, D]) -> scalar.

Row i of `positives` is the paraphrase of row i of `anchors`; every other row is an
in-batch negative. One class per module, the formula and reference in its docstring.

A loss with the class attribute `needs_labels = True` (the margin-softmax ones) is a
classifier over the training clusters instead: forward(anchors, positives, labels) with
labels int [N] the dense class index (0..C-1) of each pair's cluster, and it must be built
with num_classes = C, the number of distinct clusters among the pairs trained on
(qpr.training.pairs.num_training_classes). Its class vectors are parameters of the loss.

A loss with `needs_teacher = True` (SDML with a teacher prior) is called as
forward(anchors, positives, teacher_anchors, teacher_positives), the last two a fixed
pretrained encoder's vectors [N, T] of the same questions.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from qpr.model.losses.amsoftmax import AMSoftmaxLoss
from qpr.model.losses.sdml import SDMLLoss
from qpr.model.losses.simpler_asoftmax import SimplerASoftmaxLoss
from qpr.model.losses.teacher_prior_sdml import TeacherPriorSDMLLoss
from qpr.model.losses.triplet import TripletLoss

LOSSES: dict[str, type[nn.Module]] = {
    "sdml": SDMLLoss,
    "sdml_teacher": TeacherPriorSDMLLoss,
    "triplet": TripletLoss,
    "amsoftmax": AMSoftmaxLoss,
    "simpler_asoftmax": SimplerASoftmaxLoss,
}


def build_loss(name: str, **kwargs: Any) -> nn.Module:
    """build_loss("sdml", smoothing=0.3) / build_loss("triplet", margin=0.5, ...) /
    build_loss("amsoftmax", num_classes=C, dim=D, margin=0.35, scale=30.0)."""
    try:
        cls = LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown loss {name!r}; known: {sorted(LOSSES)}") from None
    return cls(**kwargs)


def needs_labels(loss: nn.Module) -> bool:
    """True for losses called as forward(anchors, positives, labels)."""
    return bool(getattr(loss, "needs_labels", False))


def needs_teacher(loss: nn.Module) -> bool:
    """True for losses called as forward(anchors, positives, teacher_a, teacher_p)."""
    return bool(getattr(loss, "needs_teacher", False))


__all__ = [
    "LOSSES",
    "AMSoftmaxLoss",
    "SDMLLoss",
    "SimplerASoftmaxLoss",
    "TeacherPriorSDMLLoss",
    "TripletLoss",
    "build_loss",
    "needs_labels",
    "needs_teacher",
]
