"""A "no answer" threshold chosen on half a data set's clusters, checked on the rest."""

from __future__ import annotations

import numpy as np
import pytest

from qpr.evaluation.calibrate import calibrate, halves


def _shifted_domain(seed: int = 0, clusters: int = 40, per: int = 5):
    """Answerable rank-1 distances near 2.0 (a domain whose distances sit far above the
    bundle's own threshold of 0.5), nine in ten correct; unanswerable ones near 4.0."""
    rng = np.random.default_rng(seed)
    q = clusters * per
    cluster = np.repeat(np.arange(clusters, dtype=np.int64) * 7 + 3, per)
    top1 = rng.normal(2.0, 0.2, q)
    correct = rng.random(q) < 0.95
    top1[~correct] += 0.8  # wrong rank-1s are farther, as in real data
    u_top1 = rng.normal(4.0, 0.3, q)
    return top1, correct, cluster, u_top1


def test_halves_cut_by_cluster_and_by_seed() -> None:
    cluster = np.repeat(np.arange(10, dtype=np.int64), 3)
    half = halves(cluster, seed=5)
    assert np.array_equal(half, halves(cluster, seed=5))
    assert not np.array_equal(half, halves(cluster, seed=6))
    assert np.unique(cluster[half]).size == 5
    assert not set(cluster[half]) & set(cluster[~half])  # no cluster on both sides


def test_a_threshold_from_another_domain_is_chosen_again() -> None:
    top1, correct, cluster, u_top1 = _shifted_domain()
    u_half = halves(cluster, seed=1)  # each query's own held-out search, in its half
    result = calibrate(
        top1,
        correct,
        cluster,
        (u_top1, u_half),
        bundle_threshold=0.5,
        target_precision=0.9,
        max_false_answer_rate=0.2,
        seed=1,
    )
    assert result.rule == "target" and result.meets_target
    assert 2.0 < result.threshold < 4.0
    bundle, mine = result.check["bundle"], result.check["calibrated"]
    assert bundle["answered_share"] == 0.0  # the travelled threshold refuses everything
    assert mine["answered_share"] > 0.8
    assert mine["precision_at_1"] >= 0.9
    assert mine["false_answer_rate"] <= 0.2
    assert mine["answerable"] + result.calibration["answerable"] == top1.size
    assert result.calibration["clusters"] + result.calibration["check_clusters"] == 40
    assert result.as_json()["check"]["calibrated"] == mine


def test_a_domain_with_nothing_to_refuse_answers_everything_it_can() -> None:
    top1, correct, cluster, _ = _shifted_domain(seed=2)
    result = calibrate(
        top1,
        np.ones_like(correct),
        cluster,
        (np.zeros(0), np.zeros(0, bool)),
        bundle_threshold=None,
        target_precision=0.9,
        max_false_answer_rate=0.2,
        seed=3,
    )
    assert result.threshold == pytest.approx(top1[halves(cluster, 3)].max())
    assert result.check["bundle"]["answered_share"] == 1.0
    assert result.check["calibrated"]["false_answer_rate"] is None


def test_shapes_that_differ_are_refused() -> None:
    top1, correct, cluster, u_top1 = _shifted_domain()
    common = {"bundle_threshold": None, "target_precision": 0.9, "max_false_answer_rate": 0.2}
    with pytest.raises(ValueError, match="three"):
        calibrate(top1[:-1], correct, cluster, (u_top1, u_top1 > 0), seed=0, **common)
    with pytest.raises(ValueError, match="unanswerable"):
        calibrate(top1, correct, cluster, (u_top1, u_top1[:-1] > 0), seed=0, **common)
