"""Metric-learning losses: forward(anchors [N, D], positives [N, D]) -> scalar.

Row i of `positives` is the paraphrase of row i of `anchors`; every other row is an
in-batch negative. One class per module, the formula and reference in its docstring.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from qpr.model.losses.sdml import SDMLLoss
from qpr.model.losses.triplet import TripletLoss

LOSSES: dict[str, type[nn.Module]] = {"sdml": SDMLLoss, "triplet": TripletLoss}


def build_loss(name: str, **kwargs: Any) -> nn.Module:
    """build_loss("sdml", smoothing=0.3) / build_loss("triplet", margin=0.5, ...)."""
    try:
        cls = LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown loss {name!r}; known: {sorted(LOSSES)}") from None
    return cls(**kwargs)


__all__ = ["LOSSES", "SDMLLoss", "TripletLoss", "build_loss"]
