"""SDML with a teacher prior against hand-computed values, and its two limits."""

from __future__ import annotations

import math

import pytest
import torch

from qpr.model.losses import SDMLLoss, TeacherPriorSDMLLoss, build_loss, needs_teacher


def test_hand_computed_2x2() -> None:
    # Student, 1-D: anchors 0, 1; positives 0, 2.
    #   d = [[0, 4], [1, 1]] → row 0 logits [0, -4], row 1 [-1, -1]
    anchors = torch.tensor([[0.0], [1.0]])
    positives = torch.tensor([[0.0], [2.0]])
    # Teacher, 2-D: anchors e1, e2; positives e1, e2 → cosines [[1, 0], [0, 1]].
    eye = torch.eye(2)
    # τ = 0.5: π row 0 = softmax([2, 0]) = [e²/(e²+1), 1/(e²+1)] = [0.880797, 0.119203]
    pi_hi = math.exp(2) / (math.exp(2) + 1)
    pi_lo = 1 - pi_hi
    # ε = 0.5: t row 0 = [0.5 + 0.5·0.880797, 0.5·0.119203] = [0.940399, 0.059601]
    t_hi, t_lo = 0.5 + 0.5 * pi_hi, 0.5 * pi_lo
    ln_z0 = math.log(1 + math.exp(-4))  # 0.018150
    kl0 = t_hi * (math.log(t_hi) + ln_z0) + t_lo * (math.log(t_lo) + 4 + ln_z0)
    # = 0.940399 · (-0.061440 + 0.018150) + 0.059601 · (-2.820077 + 4.018150) = 0.030696
    # Row 1: q = [0.5, 0.5], t = [0.059601, 0.940399] (π row 1 mirrors row 0).
    kl1 = t_lo * (math.log(t_lo) - math.log(0.5)) + t_hi * (math.log(t_hi) - math.log(0.5))
    # = 0.059601 · (-2.126930) + 0.940399 · 0.631707 = -0.126767 + 0.594058 = 0.467291
    expected = (kl0 + kl1) / 2
    assert expected == pytest.approx(0.248994, abs=2e-5)

    loss = TeacherPriorSDMLLoss(smoothing=0.5, temperature=0.5)
    assert loss(anchors, positives, eye, eye).item() == pytest.approx(expected, abs=1e-6)


def test_prior_is_the_teachers_softmax_over_cosines() -> None:
    # Teacher vectors need not be unit length: (3, 0) and (0, 0.5) are e1 and e2.
    loss = TeacherPriorSDMLLoss(smoothing=0.5, temperature=1.0)
    prior = loss.prior(torch.tensor([[3.0, 0.0]]), torch.tensor([[1.0, 0.0], [0.0, 0.5]]))
    e = math.exp(1)
    assert prior.tolist()[0] == pytest.approx([e / (e + 1), 1 / (e + 1)], abs=1e-6)


def test_infinite_temperature_is_sdml_with_uniform_smoothing() -> None:
    torch.manual_seed(0)
    a, p = torch.randn(6, 4), torch.randn(6, 4)
    ta, tp = torch.randn(6, 8), torch.randn(6, 8)
    for eps in (0.0, 0.3, 0.7):
        with_prior = TeacherPriorSDMLLoss(smoothing=eps, temperature=1e9)(a, p, ta, tp)
        assert with_prior.item() == pytest.approx(SDMLLoss(smoothing=eps)(a, p).item(), abs=1e-5)


def test_zero_smoothing_ignores_the_teacher() -> None:
    torch.manual_seed(1)
    a, p = torch.randn(5, 3), torch.randn(5, 3)
    loss = TeacherPriorSDMLLoss(smoothing=0.0, temperature=0.05)
    one = loss(a, p, torch.randn(5, 7), torch.randn(5, 7)).item()
    other = loss(a, p, torch.randn(5, 7), torch.randn(5, 7)).item()
    assert one == pytest.approx(other, abs=1e-6)
    assert one == pytest.approx(SDMLLoss(smoothing=0.0)(a, p).item(), abs=1e-6)


def test_gradients_reach_the_student_only() -> None:
    torch.manual_seed(2)
    a = torch.randn(4, 3, requires_grad=True)
    p = torch.randn(4, 3, requires_grad=True)
    ta = torch.randn(4, 5, requires_grad=True)
    tp = torch.randn(4, 5, requires_grad=True)
    TeacherPriorSDMLLoss(smoothing=1.0)(a, p, ta, tp).backward()
    assert a.grad is not None and torch.isfinite(a.grad).all() and a.grad.abs().sum() > 0
    assert ta.grad is None and tp.grad is None


def test_pure_distillation_is_minimal_when_the_student_copies_the_teacher() -> None:
    # ε = 1: the target is the teacher's row softmax. A student whose logits equal the
    # teacher's (cosine/τ) reaches KL = 0; scaled vectors on the unit sphere do that, since
    # -||a - p||² = 2 a·p - 2 for unit vectors (the constant cancels in the softmax).
    torch.manual_seed(3)
    t = torch.nn.functional.normalize(torch.randn(5, 4), dim=1)
    tau = 0.5
    student = t / math.sqrt(2 * tau)  # -||a_i - p_j||² = (2 a·p - 2)/(2τ) = cos/τ - 1/τ
    loss = TeacherPriorSDMLLoss(smoothing=1.0, temperature=tau)
    assert loss(student, student, t, t).item() == pytest.approx(0.0, abs=1e-6)
    assert loss(student * 2, student * 2, t, t).item() > 1e-3


def test_registered_and_marked() -> None:
    loss = build_loss("sdml_teacher", smoothing=0.4, temperature=0.1)
    assert isinstance(loss, TeacherPriorSDMLLoss)
    assert needs_teacher(loss) and not needs_teacher(build_loss("sdml"))
    assert "temperature=0.1" in repr(loss)


@pytest.mark.parametrize(
    "kwargs", [{"smoothing": -0.1}, {"smoothing": 1.1}, {"temperature": 0.0}, {"distance": "l1"}]
)
def test_rejects_bad_arguments(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        TeacherPriorSDMLLoss(**kwargs)


def test_rejects_mismatched_teacher_rows() -> None:
    loss = TeacherPriorSDMLLoss()
    with pytest.raises(ValueError, match="teacher"):
        loss(torch.zeros(3, 2), torch.zeros(3, 2), torch.zeros(2, 4), torch.zeros(2, 4))
