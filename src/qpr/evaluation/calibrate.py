"""A "no answer" threshold calibrated on a new data set's own clusters.

A threshold chosen on one domain's validation split does not travel: a distance means
another thing on other questions. The product default, trained on the embedded logs,
answered 5% of the README's example, though every one of its questions has a paraphrase.
So the threshold is chosen again on the data that will be served, by the evaluate stage's
rule (`qpr.evaluation.threshold.choose_threshold`): on a seeded half of the file's
clusters (the calibration half), and reported on the other half (the check half), beside
the bundle's own threshold on the same queries.

Per half, as in the evaluate stage:
- answerable: each query searched as served, itself left out (`SystemResult.top1`);
- unanswerable: the same queries searched with their whole cluster left out, as if their
  answer were not indexed (`served_top1_without_cluster`), and the file's questions with no
  paraphrase (`qpr.evaluation.served.singleton_queries`), split into halves by a seed too.

Small functions over arrays; no I/O here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from qpr.evaluation.no_answer import held_out_mask
from qpr.evaluation.threshold import choose_threshold, outcome_of, threshold_curve

__all__ = ["Calibration", "calibrate", "halves"]

# The share of clusters that choose the threshold; the rest check it.
CALIBRATION_SHARE = 0.5


@dataclass(frozen=True)
class Calibration:
    """The threshold chosen on the calibration half, and both thresholds on the check half.

    threshold: the chosen one (None: no query had a hit). rule: "target", "bound" or
        "strictest" (`choose_threshold`).
    calibration: what chose it: answered share and P@1 answered of the calibration half at
        the chosen threshold, its query and unanswerable counts, the clusters.
    check: {"bundle": outcome, "calibrated": outcome} on the check half; an outcome is
        answered_share, precision_at_1, false_answer_rate, answerable, unanswerable.
    """

    threshold: float | None
    rule: str
    meets_target: bool
    target_precision: float
    max_false_answer_rate: float
    calibration: dict[str, Any]
    check: dict[str, dict[str, Any]]

    def as_json(self) -> dict[str, Any]:
        """A plain dict for results.json (every field: plain values already)."""
        return dataclasses.asdict(self)


def halves(clusters: np.ndarray, seed: int) -> np.ndarray:
    """bool [Q]: the queries of a seeded half of the distinct `clusters` (int64 [Q]), the
    calibration half; at least one cluster when there is any."""
    return held_out_mask(np.asarray(clusters, np.int64), CALIBRATION_SHARE, seed)


def calibrate(
    top1: np.ndarray,
    correct: np.ndarray,
    clusters: np.ndarray,
    unanswerable: tuple[np.ndarray, np.ndarray],
    *,
    bundle_threshold: float | None,
    target_precision: float,
    max_false_answer_rate: float,
    seed: int,
) -> Calibration:
    """Choose a threshold on a seeded half of the clusters; check it on the other half.

    top1 : float [Q] each answerable query's served rank-1 distance (inf: no hit).
    correct : bool [Q] its rank-1 is a paraphrase.
    clusters : int64 [Q] its cluster; the halves are cut by cluster, so no cluster's
        paraphrases are on both sides.
    unanswerable : (float [U] rank-1 distances with no paraphrase indexed, bool [U] in the
        calibration half). The module docstring says where both come from.
    bundle_threshold : the bundle's own threshold, reported on the check half beside.

    ValueError on shapes that differ.
    """
    top1 = np.asarray(top1, np.float64)
    correct = np.asarray(correct, bool)
    clusters = np.asarray(clusters, np.int64)
    u_top1, u_half = (np.asarray(unanswerable[0], np.float64), np.asarray(unanswerable[1], bool))
    if not top1.shape == correct.shape == clusters.shape or top1.ndim != 1:
        shapes = f"{top1.shape}, {correct.shape}, {clusters.shape}"
        raise ValueError(f"need three [Q] arrays, got {shapes}")
    if u_top1.shape != u_half.shape:
        raise ValueError(f"unanswerable arrays differ: {u_top1.shape} and {u_half.shape}")
    half = halves(clusters, seed)
    curve = threshold_curve(top1[half], correct[half], unanswerable=u_top1[u_half])
    choice = choose_threshold(curve, target_precision, max_false_answer_rate)
    chosen = outcome_of(choice.threshold, top1[half], correct[half], u_top1[u_half])
    check = {
        name: outcome_of(threshold, top1[~half], correct[~half], u_top1[~u_half])
        for name, threshold in (("bundle", bundle_threshold), ("calibrated", choice.threshold))
    }
    return Calibration(
        threshold=choice.threshold,
        rule=choice.rule,
        meets_target=choice.meets_target,
        target_precision=target_precision,
        max_false_answer_rate=max_false_answer_rate,
        calibration={
            **chosen,
            "clusters": int(np.unique(clusters[half]).size),
            "check_clusters": int(np.unique(clusters[~half]).size),
        },
        check=check,
    )
