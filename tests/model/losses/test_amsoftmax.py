"""AM-Softmax and simpler-a-softmax against hand-computed values (Wang et al. 2018; Su 2018)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from qpr.config import SettingsError, settings_from_dict
from qpr.model.losses import (
    AMSoftmaxLoss,
    SimplerASoftmaxLoss,
    build_loss,
    needs_labels,
)
from qpr.training.build import build_training_loss


def _loss(cls=AMSoftmaxLoss, *, num_classes: int = 2, dim: int = 2, **kwargs) -> AMSoftmaxLoss:
    loss = cls(num_classes, dim, **kwargs)
    with torch.no_grad():
        # Not unit rows on purpose: the loss must normalise the class vectors itself.
        loss.weight.copy_(torch.tensor([[2.0, 0.0], [0.0, 5.0]]))
    return loss


def _random(n: int = 6, dim: int = 5, classes: int = 4, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    anchors = torch.randn(n, dim, generator=gen)
    positives = torch.randn(n, dim, generator=gen)
    labels = torch.randint(0, classes, (n,), generator=gen)
    return anchors, positives, labels


def test_hand_computed_two_classes_in_2d() -> None:
    # W rows (2, 0) and (0, 5) normalise to (1, 0) and (0, 1); s = 10, m = 0.2, label 0.
    # anchor (3, 4) → (0.6, 0.8): cos = [0.6, 0.8]
    #   logits = [10·(0.6 − 0.2), 10·0.8] = [4, 8]
    #   CE = −4 + ln(e⁴ + e⁸) = ln(1 + e⁴) = ln(55.598150) = 4.018150
    # positive (4, 3) → (0.8, 0.6): cos = [0.8, 0.6]
    #   logits = [10·(0.8 − 0.2), 10·0.6] = [6, 6]
    #   CE = ln 2 = 0.693147
    # mean over the two examples = (4.018150 + 0.693147) / 2 = 2.355648
    expected = (math.log(1 + math.exp(4)) + math.log(2)) / 2
    assert expected == pytest.approx(2.355648, abs=1e-6)

    loss = _loss(margin=0.2, scale=10.0)
    anchors, positives = torch.tensor([[3.0, 4.0]]), torch.tensor([[4.0, 3.0]])
    value = loss(anchors, positives, torch.tensor([0]))
    assert value.item() == pytest.approx(expected, abs=1e-5)
    logits = loss.logits(torch.cat([anchors, positives]), torch.tensor([0, 0]))
    assert torch.allclose(logits, torch.tensor([[4.0, 8.0], [6.0, 6.0]]), atol=1e-5)


def test_zero_margin_is_normalised_softmax_cross_entropy() -> None:
    anchors, positives, labels = _random()
    loss = AMSoftmaxLoss(num_classes=4, dim=5, margin=0.0, scale=30.0)
    examples = torch.cat([anchors, positives])
    cos = F.normalize(examples, dim=1) @ F.normalize(loss.weight, dim=1).T
    expected = F.cross_entropy(30.0 * cos, torch.cat([labels, labels]))
    assert loss(anchors, positives, labels).item() == pytest.approx(expected.item(), abs=1e-5)


def test_only_the_target_logit_is_reduced() -> None:
    anchors, positives, labels = _random()
    torch.manual_seed(3)
    with_margin = AMSoftmaxLoss(num_classes=4, dim=5, margin=0.35, scale=30.0)
    without = AMSoftmaxLoss(num_classes=4, dim=5, margin=0.0, scale=30.0)
    without.load_state_dict(with_margin.state_dict())
    diff = with_margin.logits(anchors, labels) - without.logits(anchors, labels)
    expected = torch.zeros(6, 4)
    expected[torch.arange(6), labels] = -30.0 * 0.35
    assert torch.allclose(diff, expected, atol=1e-5)
    # The margin can only make the loss larger.
    assert with_margin(anchors, positives, labels) > without(anchors, positives, labels)


def test_gradients_reach_class_vectors_and_embeddings() -> None:
    anchors, positives, labels = _random()
    anchors.requires_grad_(True)
    loss = AMSoftmaxLoss(num_classes=4, dim=5)
    loss(anchors, positives, labels).backward()
    assert loss.weight.grad is not None and torch.isfinite(loss.weight.grad).all()
    # Every class vector is in every softmax denominator, so every row gets a gradient.
    assert (loss.weight.grad.abs().sum(dim=1) > 0).all()
    assert anchors.grad is not None and (anchors.grad.abs().sum(dim=1) > 0).all()
    assert [name for name, _ in loss.named_parameters()] == ["weight"]


def test_embedding_scale_does_not_matter() -> None:
    anchors, positives, labels = _random()
    loss = AMSoftmaxLoss(num_classes=4, dim=5)
    a = loss(anchors, positives, labels)
    b = loss(7.0 * anchors, 0.1 * positives, labels)
    assert a.item() == pytest.approx(b.item(), rel=1e-5)


def test_bad_inputs_are_refused() -> None:
    loss = AMSoftmaxLoss(num_classes=3, dim=2)
    x = torch.ones(2, 2)
    with pytest.raises(ValueError, match="labels must be in"):
        loss(x, x, torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="labels shape"):
        loss(x, x, torch.tensor([0]))
    with pytest.raises(ValueError, match="dim"):
        loss(torch.ones(2, 4), torch.ones(2, 4), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="num_classes"):
        AMSoftmaxLoss(num_classes=1, dim=2)


def test_registered_and_called_with_labels() -> None:
    loss = build_loss("amsoftmax", num_classes=7, dim=3, margin=0.3, scale=20.0)
    assert isinstance(loss, AMSoftmaxLoss) and needs_labels(loss)
    assert (loss.num_classes, loss.dim, loss.margin, loss.scale) == (7, 3, 0.3, 20.0)
    assert loss.weight.shape == (7, 3)
    assert "num_classes=7" in loss.extra_repr()
    assert not needs_labels(build_loss("sdml"))
    assert isinstance(build_loss("simpler_asoftmax", num_classes=3, dim=2), SimplerASoftmaxLoss)


# -- simpler-a-softmax ---------------------------------------------------------------------


def test_simpler_asoftmax_target_is_min_of_cos_m_theta_and_cos_theta() -> None:
    loss = SimplerASoftmaxLoss(num_classes=2, dim=2, margin=2)
    # m = 2: cos 2θ = 2c² − 1. c = 0.6 → −0.28 (< 0.6: taken); c = 0.8 → 0.28.
    # θ = 170°: cos θ = −0.984808, cos 340° = 0.939693 > cos θ, so ψ = cos θ.
    c170 = math.cos(math.radians(170))
    got = loss.target_cosine(torch.tensor([0.6, 0.8, c170], dtype=torch.float64))
    assert got.tolist() == pytest.approx([-0.28, 0.28, c170], abs=1e-12)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5])
def test_simpler_asoftmax_chebyshev_matches_cos_m_theta(m: int) -> None:
    theta = torch.linspace(0.0, math.pi, 181, dtype=torch.float64)
    got = SimplerASoftmaxLoss(2, 2, margin=m).target_cosine(torch.cos(theta))
    assert torch.allclose(got, torch.minimum(torch.cos(m * theta), torch.cos(theta)), atol=1e-9)


def test_simpler_asoftmax_with_m_1_is_plain_normalised_softmax() -> None:
    anchors, positives, labels = _random()
    torch.manual_seed(5)
    simpler = SimplerASoftmaxLoss(num_classes=4, dim=5, margin=1)
    plain = AMSoftmaxLoss(num_classes=4, dim=5, margin=0.0)
    plain.load_state_dict(simpler.state_dict())
    a, b = simpler(anchors, positives, labels), plain(anchors, positives, labels)
    assert a.item() == pytest.approx(b.item(), abs=1e-6)
    with pytest.raises(ValueError, match="positive integer"):
        SimplerASoftmaxLoss(2, 2, margin=0.35)


# -- settings ------------------------------------------------------------------------------


def test_stage_builds_amsoftmax_only_on_normalised_embeddings() -> None:
    raw = {"train": {"loss": "amsoftmax", "am_margin": 0.25, "am_scale": 16.0}}
    with pytest.raises(SettingsError, match=r"model\.normalize: true"):
        build_training_loss(settings_from_dict(raw), num_classes=10, dim=8)
    settings = settings_from_dict({**raw, "model": {"normalize": True}})
    loss = build_training_loss(settings, num_classes=10, dim=8)
    assert isinstance(loss, AMSoftmaxLoss)
    assert (loss.num_classes, loss.dim, loss.margin, loss.scale) == (10, 8, 0.25, 16.0)
    # Callers that want only the encoder (no training clusters at hand) get no loss.
    assert build_training_loss(settings, num_classes=None, dim=8) is None


# -- sampled classes (Partial FC) ----------------------------------------------------------


def test_sampled_classes_keep_the_batch_classes_and_draw_distinct_others() -> None:
    loss = AMSoftmaxLoss(num_classes=50, dim=5, sampled_classes=10)
    labels = torch.tensor([7, 3, 7, 40])
    torch.manual_seed(0)
    classes, positions = loss.sample_classes(labels)
    assert classes.shape == (10,)
    assert classes[:3].tolist() == [3, 7, 40]  # the batch's classes, sorted, come first
    assert len(set(classes.tolist())) == 10  # no class twice
    assert classes.min() >= 0 and classes.max() < 50
    assert torch.equal(classes[positions], labels)  # labels point at their own class


def test_sampled_classes_at_least_all_classes_is_the_full_loss() -> None:
    anchors, positives, labels = _random()
    torch.manual_seed(1)
    full = AMSoftmaxLoss(num_classes=4, dim=5)
    sampled = AMSoftmaxLoss(num_classes=4, dim=5, sampled_classes=4)
    sampled.load_state_dict(full.state_dict())
    assert sampled(anchors, positives, labels).item() == pytest.approx(
        full(anchors, positives, labels).item(), abs=1e-6
    )


def test_sampled_loss_is_the_softmax_over_the_drawn_classes_only() -> None:
    # By hand: the loss over S drawn classes equals the full formula restricted to
    # those columns, with the labels re-indexed into them.
    anchors, positives, labels = _random(classes=3)
    torch.manual_seed(2)
    loss = AMSoftmaxLoss(num_classes=40, dim=5, margin=0.35, scale=30.0, sampled_classes=8)
    torch.manual_seed(5)
    value = loss(anchors, positives, labels)
    torch.manual_seed(5)
    classes, positions = loss.sample_classes(torch.cat([labels, labels]))
    examples = torch.cat([anchors, positives])
    cos = F.normalize(examples, dim=1) @ F.normalize(loss.weight[classes], dim=1).T
    rows = torch.arange(cos.shape[0])
    logits = 30.0 * cos
    logits[rows, positions] = 30.0 * (cos[rows, positions] - 0.35)
    assert value.item() == pytest.approx(F.cross_entropy(logits, positions).item(), abs=1e-5)
    # Fewer negatives in the denominator: never above the loss over every class.
    assert value.item() <= loss.eval()(anchors, positives, labels).item() + 1e-6


def test_sampled_classes_update_only_the_drawn_class_vectors() -> None:
    anchors, positives, labels = _random(classes=3)
    loss = AMSoftmaxLoss(num_classes=40, dim=5, sampled_classes=8)
    torch.manual_seed(4)
    loss(anchors, positives, labels).backward()
    touched = (loss.weight.grad.abs().sum(dim=1) > 0).nonzero().squeeze(1)
    assert touched.numel() == 8
    assert set(labels.tolist()) <= set(touched.tolist())


def test_eval_mode_scores_every_class() -> None:
    anchors, positives, labels = _random()
    torch.manual_seed(6)
    full = AMSoftmaxLoss(num_classes=30, dim=5)
    sampled = AMSoftmaxLoss(num_classes=30, dim=5, sampled_classes=5).eval()
    sampled.load_state_dict(full.state_dict())
    assert sampled(anchors, positives, labels).item() == pytest.approx(
        full(anchors, positives, labels).item(), abs=1e-6
    )


def test_sampled_classes_below_two_is_refused() -> None:
    with pytest.raises(ValueError, match="sampled_classes"):
        AMSoftmaxLoss(num_classes=30, dim=5, sampled_classes=1)


def test_train_am_sampled_classes_reaches_the_loss() -> None:
    settings = settings_from_dict(
        {
            "model": {"normalize": True},
            "train": {"loss": "amsoftmax", "am_sampled_classes": 64},
        }
    )
    loss = build_training_loss(settings, num_classes=1000, dim=8)
    assert loss.sampled_classes == 64
