"""QueryAlignmentLoss: each term as its formula says, and what it rewards."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from qpr.model.losses.alignment import QueryAlignmentLoss


def test_alignment_term_is_one_minus_cosine() -> None:
    student = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    targets = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    loss = QueryAlignmentLoss(1.0, 0.0)
    empty = torch.empty(0, 2)
    value = loss(student, targets, empty, empty, torch.empty(0, dtype=torch.long))
    assert value.item() == pytest.approx(0.5)  # (0 + 1) / 2


def test_contrastive_term_is_cross_entropy_over_cosines() -> None:
    torch.manual_seed(0)
    anchors, documents = torch.randn(3, 4), torch.randn(5, 4)
    positive = torch.tensor([0, 1, 2])
    loss = QueryAlignmentLoss(0.0, 1.0, temperature=0.1)
    expected = F.cross_entropy(
        F.normalize(anchors, dim=1) @ F.normalize(documents, dim=1).T / 0.1, positive
    )
    value = loss(anchors, anchors, anchors, documents, positive)
    torch.testing.assert_close(value, expected)


def test_loss_is_lower_when_queries_sit_on_their_documents() -> None:
    torch.manual_seed(0)
    documents = F.normalize(torch.randn(4, 8), dim=1)
    loss = QueryAlignmentLoss()
    positive = torch.arange(4)
    aligned = loss(documents, documents, documents, documents, positive)
    shuffled = documents.roll(1, dims=0)
    assert aligned < loss(shuffled, documents, shuffled, documents, positive)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="weights"):
        QueryAlignmentLoss(0.0, 0.0)
    with pytest.raises(ValueError, match="temperature"):
        QueryAlignmentLoss(temperature=0.0)
