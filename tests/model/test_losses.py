"""SDML and triplet losses against hand-computed values (Bonadiman et al. 2019, sec. 3)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from qpr.model.losses import SDMLLoss, TripletLoss, build_loss

# Three pairs in 2-D whose squared distances are small integers:
#   anchors = positives = (0,0), (1,0), (0,1)
#   ||a_i - p_j||² = [[0, 1, 1],
#                     [1, 0, 2],
#                     [1, 2, 0]]
POINTS = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])


def test_sdml_hand_computed_3x3() -> None:
    # Targets with ε = 0.3, N = 3: diagonal 1 - 0.3 + 0.1 = 0.8, elsewhere 0.1 (Figure 1).
    e1, e2 = math.exp(-1.0), math.exp(-2.0)
    # Row 0: logits [0, -1, -1] → Z0 = 1 + 2e⁻¹ = 1.735759;  log q = [-ln Z0, -1 - ln Z0, ...]
    ln_z0 = math.log(1 + 2 * e1)  # 0.551445
    kl0 = 0.8 * (math.log(0.8) + ln_z0) + 2 * 0.1 * (math.log(0.1) + 1 + ln_z0)
    # = 0.8 · 0.328301 + 0.2 · (-0.751140) = 0.262641 - 0.150228 = 0.112413
    # Row 1: logits [-1, 0, -2] → Z1 = 1 + e⁻¹ + e⁻² = 1.503215; row 2 is its mirror image.
    ln_z1 = math.log(1 + e1 + e2)  # 0.407606
    kl1 = (
        0.8 * (math.log(0.8) + ln_z1)  # 0.8 · 0.184462 = 0.147570
        + 0.1 * (math.log(0.1) + 1 + ln_z1)  # 0.1 · -0.894979 = -0.089498
        + 0.1 * (math.log(0.1) + 2 + ln_z1)  # 0.1 · 0.105021 = 0.010502
    )  # = 0.068574
    expected = (kl0 + 2 * kl1) / 3  # batchmean: (0.112413 + 2 · 0.068574) / 3 = 0.083187
    assert expected == pytest.approx(0.083187, abs=1e-6)

    loss = SDMLLoss(smoothing=0.3)(POINTS, POINTS)
    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_sdml_target_matches_paper_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    # With all logits 0, q = 1/3 everywhere and d loss / d logit_ij = (q_ij - t_ij) / N,
    # so the target the loss uses can be read back from the gradient.
    loss = SDMLLoss(smoothing=0.3)
    logits = torch.zeros(3, 3, requires_grad=True)
    monkeypatch.setattr(loss, "logits", lambda anchors, positives: logits)
    loss(POINTS, POINTS).backward()
    target = 1 / 3 - 3 * logits.grad
    figure_1 = torch.tensor([[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]])
    assert torch.allclose(target, figure_1, atol=1e-6)


def test_sdml_without_smoothing_is_cross_entropy() -> None:
    gen = torch.Generator().manual_seed(0)
    anchors, positives = torch.randn(8, 5, generator=gen), torch.randn(8, 5, generator=gen)
    logits = -(torch.cdist(anchors, positives) ** 2)
    expected = F.cross_entropy(logits, torch.arange(8))
    assert SDMLLoss(smoothing=0.0)(anchors, positives).item() == pytest.approx(
        expected.item(), abs=1e-5
    )


def test_sdml_euclidean_distance_variant() -> None:
    loss = SDMLLoss(smoothing=0.3, distance="euclidean")
    dist = torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, math.sqrt(2)], [1.0, math.sqrt(2), 0.0]])
    target = torch.full((3, 3), 0.1) + 0.7 * torch.eye(3)
    expected = F.kl_div(F.log_softmax(-dist, dim=1), target, reduction="batchmean")
    assert loss(POINTS, POINTS).item() == pytest.approx(expected.item(), abs=1e-5)


def test_sdml_gradients_finite_for_identical_vectors() -> None:
    for distance in ("squared", "euclidean"):
        x = torch.ones(4, 3, requires_grad=True)
        SDMLLoss(distance=distance)(x, x.detach().clone()).backward()
        assert torch.isfinite(x.grad).all()


def test_sdml_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        SDMLLoss(smoothing=1.0)
    with pytest.raises(ValueError):
        SDMLLoss(distance="cosine")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        SDMLLoss()(torch.zeros(3, 2), torch.zeros(2, 2))


# -- triplet ---------------------------------------------------------------------------------

# Two pairs, so the random negative of each row is necessarily the other row's positive.
#   row 0: a=(0,0) p=(1,0) n=(0,1.2):  SSD 1 - 1.44 + 0.5 = 0.06;   EUC 1 - 1.2 + 0.5 = 0.3
#   row 1: a=(0,2) p=(0,1.2) n=(1,0):  SSD 0.64 - 5 + 0.5 < 0 → 0;  EUC 0.8 - √5 + 0.5 < 0 → 0
TRI_ANCHORS = torch.tensor([[0.0, 0.0], [0.0, 2.0]])
TRI_POSITIVES = torch.tensor([[1.0, 0.0], [0.0, 1.2]])


@pytest.mark.parametrize(("distance", "expected"), [("squared", 0.03), ("euclidean", 0.15)])
@pytest.mark.parametrize("negatives", ["random", "hard"])
def test_triplet_hand_example_ssd_vs_euc(distance: str, expected: float, negatives: str) -> None:
    loss = TripletLoss(margin=0.5, distance=distance, negatives=negatives, seed=0)
    assert loss(TRI_ANCHORS, TRI_POSITIVES).item() == pytest.approx(expected, abs=1e-6)


def test_triplet_hard_picks_closest_other_positive() -> None:
    anchors = torch.tensor([[0.0, 0.0], [5.0, 0.0], [10.0, 0.0]])
    positives = torch.tensor([[0.0, 1.0], [9.0, 0.0], [20.0, 0.0]])
    hard = TripletLoss(negatives="hard")
    # a0: p1 at 81, p2 at 400 → 1;  a1: p0 at 26, p2 at 225 → 0;  a2: p0 at 101, p1 at 1 → 1
    assert hard.negative_indices(anchors, positives).tolist() == [1, 0, 1]


def test_triplet_hard_loss_bounds_random_loss() -> None:
    gen = torch.Generator().manual_seed(3)
    anchors, positives = torch.randn(16, 4, generator=gen), torch.randn(16, 4, generator=gen)
    hard = TripletLoss(negatives="hard")(anchors, positives)
    for seed in range(5):
        rand = TripletLoss(negatives="random", seed=seed)(anchors, positives)
        assert hard.item() >= rand.item() - 1e-6  # the closest negative has the largest hinge


def test_triplet_random_negatives_never_self_and_reproducible() -> None:
    anchors = torch.zeros(6, 2)
    first = TripletLoss(seed=11)
    draws = torch.stack([first.negative_indices(anchors, anchors) for _ in range(200)])
    assert not (draws == torch.arange(6)).any()
    assert {int(j) for j in draws[:, 0]} == {1, 2, 3, 4, 5}  # every other row is drawn
    again = TripletLoss(seed=11)
    assert torch.equal(again.negative_indices(anchors, anchors), draws[0])


def test_triplet_generator_state_roundtrips_through_state_dict() -> None:
    anchors = torch.zeros(8, 2)
    loss = TripletLoss(seed=5)
    loss.negative_indices(anchors, anchors)
    saved = loss.state_dict()
    expected = loss.negative_indices(anchors, anchors)
    restored = TripletLoss(seed=999)
    restored.load_state_dict(saved)
    assert torch.equal(restored.negative_indices(anchors, anchors), expected)
    assert restored.seed == 5


def test_single_pair_batches_give_zero_loss_with_gradient() -> None:
    x = torch.ones(1, 3, requires_grad=True)
    for loss in (TripletLoss(), SDMLLoss()):
        value = loss(x, x + 1)
        value.backward()
        assert value.item() == pytest.approx(0.0, abs=1e-7)


def test_build_loss() -> None:
    assert isinstance(build_loss("sdml", smoothing=0.1), SDMLLoss)
    triplet = build_loss("triplet", margin=0.2, distance="euclidean", negatives="hard")
    assert isinstance(triplet, TripletLoss) and triplet.margin == 0.2
    with pytest.raises(ValueError, match="unknown loss"):
        build_loss("contrastive")


def test_sdml_scale_multiplies_the_logits() -> None:
    # Scale s: logits -s·d. With ε = 0 that is cross-entropy over -s·||a_i - p_j||².
    gen = torch.Generator().manual_seed(1)
    anchors, positives = torch.randn(6, 4, generator=gen), torch.randn(6, 4, generator=gen)
    logits = -10.0 * torch.cdist(anchors, positives) ** 2
    expected = F.cross_entropy(logits, torch.arange(6))
    loss = SDMLLoss(smoothing=0.0, scale=10.0)
    assert loss(anchors, positives).item() == pytest.approx(expected.item(), rel=1e-4)
    assert "scale=10" in loss.extra_repr()
    # The paper's loss keeps its old description (checkpoint fingerprints still match).
    assert SDMLLoss().extra_repr() == "smoothing=0.3, distance='squared'"


def test_sdml_hard_negatives_hand_computed() -> None:
    # POINTS as anchors and positives plus one negative n = (1, 1): ||a_i - n||² = 2, 1, 1.
    # Row 0: logits [0, -1, -1, -2]; ε = 0.3 over N + M = 4 columns: target 0.775 on the
    # diagonal, 0.075 elsewhere.
    negatives = torch.tensor([[1.0, 1.0]])
    e1, e2 = math.exp(-1.0), math.exp(-2.0)
    rows = [
        [0.0, -1.0, -1.0, -2.0],
        [-1.0, 0.0, -2.0, -1.0],
        [-1.0, -2.0, 0.0, -1.0],
    ]
    expected = 0.0
    for i, row in enumerate(rows):
        ln_z = math.log(sum(math.exp(v) for v in row))
        for j, logit in enumerate(row):
            t = 0.775 if i == j else 0.075
            expected += t * (math.log(t) - (logit - ln_z))
    expected /= 3
    # Every row holds one 0, two -1 and one -2: ln Z = ln(1 + 2e⁻¹ + e⁻²) = 0.626523, and
    # KL = 0.775·(ln 0.775 + 0.626523) + 0.075·Σ(ln 0.075 - logit + 0.626523) = 0.146172.
    assert math.log(1 + 2 * e1 + e2) == pytest.approx(0.626523, abs=1e-6)
    assert expected == pytest.approx(0.146172, abs=1e-6)
    loss = SDMLLoss(smoothing=0.3)(POINTS, POINTS, negatives)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    # A far-away negative takes no probability: the loss is the in-batch loss with the
    # target spread over one more column.
    far = SDMLLoss(smoothing=0.0)(POINTS, POINTS, torch.tensor([[100.0, 100.0]]))
    assert far.item() == pytest.approx(SDMLLoss(smoothing=0.0)(POINTS, POINTS).item(), abs=1e-6)
    with pytest.raises(ValueError, match="negatives"):
        SDMLLoss()(POINTS, POINTS, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="scale"):
        SDMLLoss(scale=0.0)
