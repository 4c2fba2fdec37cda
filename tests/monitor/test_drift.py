"""The drift measures on seeded samples: a planted shift is flagged, a sample of the
reference's own distribution is not."""

from __future__ import annotations

import numpy as np
import pytest

from qpr.monitor import drift


def _vectors(n: int, seed: int, shift: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 16)).astype(np.float32)
    x[:, 0] += shift
    return x


def test_a_shifted_embedding_sample_is_flagged() -> None:
    result = drift.embedding_drift(
        _vectors(400, 1), _vectors(400, 2, shift=1.0), seed=0, min_auc=0.55, z=3.0
    )
    assert result.drifted and result.value > 0.7


def test_a_sample_of_the_same_distribution_is_not_flagged() -> None:
    results = [
        drift.embedding_drift(_vectors(400, 1), _vectors(400, s), seed=s, min_auc=0.55, z=3.0)
        for s in range(10, 20)
    ]
    assert not any(r.drifted for r in results)
    assert abs(np.mean([r.value for r in results]) - 0.5) < 0.05


def test_the_threshold_grows_with_a_small_sample() -> None:
    small = drift.embedding_drift(_vectors(40, 1), _vectors(40, 2), seed=0, min_auc=0.55, z=3.0)
    large = drift.embedding_drift(_vectors(2000, 1), _vectors(2000, 2), seed=0, min_auc=0.55, z=3)
    assert small.threshold > large.threshold == 0.55


def test_null_sd_matches_the_mann_whitney_formula() -> None:
    assert drift.auc_null_sd(100, 100) == pytest.approx(np.sqrt(201 / (12 * 100 * 100)))
    with pytest.raises(ValueError):
        drift.auc_null_sd(0, 5)


def test_mismatched_widths_are_refused() -> None:
    with pytest.raises(ValueError, match="vectors"):
        drift.domain_classifier_auc(np.zeros((10, 4)), np.zeros((10, 5)), seed=0)


TOPIC_A = ["how do i cook rice", "best way to boil pasta", "how long to bake bread"] * 30
TOPIC_B = ["what is a tensor rank", "how to invert a matrix", "eigenvalue of a symmetric"] * 30


def _split(questions: list[str]) -> list[list[str]]:
    return [q.split() for q in questions]


def test_words_from_another_topic_are_flagged() -> None:
    result = drift.vocabulary_drift(_split(TOPIC_A), _split(TOPIC_B), seed=0, max_increase=0.1)
    assert result.drifted and result.detail["live_unseen_share"] > 0.5


def test_words_from_the_same_topic_are_not_flagged() -> None:
    result = drift.vocabulary_drift(_split(TOPIC_A), _split(TOPIC_A[:20]), seed=0, max_increase=0.1)
    assert not result.drifted and result.value <= 0.0


def test_longer_questions_are_flagged_and_equal_lengths_are_not() -> None:
    rng = np.random.default_rng(0)
    reference = rng.poisson(8, 500)
    same = drift.ks_drift("length", reference, rng.poisson(8, 500), alpha=0.01, min_statistic=0.1)
    longer = drift.ks_drift(
        "length", reference, rng.poisson(14, 500), alpha=0.01, min_statistic=0.1
    )
    assert not same.drifted
    assert longer.drifted and longer.detail["live_median"] > longer.detail["reference_median"]


def test_larger_only_ignores_a_shift_down() -> None:
    rng = np.random.default_rng(0)
    reference = rng.normal(1.0, 0.1, 500)
    closer = rng.normal(0.5, 0.1, 500)
    assert drift.ks_drift("d", reference, closer, alpha=0.01, min_statistic=0.1).drifted
    kept = drift.ks_drift("d", reference, closer, alpha=0.01, min_statistic=0.1, larger_only=True)
    assert not kept.drifted
