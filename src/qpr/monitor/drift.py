"""Drift of live questions from the training questions: small functions over arrays.

Three measures, each with a decision that holds on samples of a few hundred questions:

- **Embedding drift, by a domain classifier** (the method Evidently uses for embeddings
  and text): a logistic regression learns to tell reference vectors from live ones on one
  seeded half and is scored (ROC AUC) on the other. Same distribution: AUC about 0.5.
  Drift needs both an AUC above the null's spread (`z` standard errors of a random
  classifier's AUC on that many questions) and above `min_auc`, an effect size, so a
  large sample does not flag a shift nobody would notice.
- **Vocabulary drift**: the share of live words the reference never used, against the
  same share for a held-out half of the reference itself (a fair baseline: no finite
  sample covers its own domain's vocabulary).
- **Length and distance drift**: the two-sample Kolmogorov-Smirnov test on words per
  question, and on each question's rank-1 distance (how far the nearest known question is).

Why not Evidently itself: its wheel brings some twenty packages (a second web framework,
statsmodels, plotly, a telemetry client that calls home), for three measures that
scikit-learn and scipy, already here, compute the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = [
    "DriftResult",
    "auc_null_sd",
    "domain_classifier_auc",
    "embedding_drift",
    "ks_drift",
    "vocabulary_drift",
]


@dataclass(frozen=True)
class DriftResult:
    """One measure's verdict: `value` against `threshold`; `drifted` when over it."""

    measure: str
    value: float
    threshold: float
    drifted: bool
    detail: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def auc_null_sd(n_reference: int, n_live: int) -> float:
    """The standard error of a random classifier's ROC AUC on n_reference negatives and
    n_live positives (Mann-Whitney U under the null: sqrt((n0 + n1 + 1) / (12 n0 n1)))."""
    if n_reference < 1 or n_live < 1:
        raise ValueError(f"need both samples, got {n_reference} and {n_live}")
    return float(np.sqrt((n_reference + n_live + 1) / (12.0 * n_reference * n_live)))


def _balanced(reference: np.ndarray, live: np.ndarray, cap: int, rng: np.random.Generator):
    """Equal-sized seeded subsamples (at most `cap` each): an AUC means the same thing
    whatever the two sizes were."""
    n = min(len(reference), len(live), cap)
    ref = reference[rng.choice(len(reference), n, replace=False)]
    cur = live[rng.choice(len(live), n, replace=False)]
    return ref, cur


def domain_classifier_auc(
    reference: np.ndarray, live: np.ndarray, *, seed: int, cap: int = 2000
) -> tuple[float, int]:
    """(ROC AUC, questions per side in the scored half) of a logistic regression that
    tells `live` (float [L, D]) from `reference` (float [R, D]), trained on one seeded half
    of a balanced sample and scored on the other."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    reference = np.asarray(reference, np.float32)
    live = np.asarray(live, np.float32)
    if reference.ndim != 2 or live.ndim != 2 or reference.shape[1] != live.shape[1]:
        raise ValueError(f"need [R, D] and [L, D] vectors, got {reference.shape} and {live.shape}")
    if min(len(reference), len(live)) < 4:
        raise ValueError("need at least 4 questions on each side")
    rng = np.random.default_rng(seed)
    ref, cur = _balanced(reference, live, cap, rng)
    n = len(ref)
    x = np.concatenate([ref, cur])
    y = np.concatenate([np.zeros(n, np.int8), np.ones(n, np.int8)])
    # Split each side in two so both halves stay balanced.
    train = np.zeros(2 * n, bool)
    train[rng.permutation(n)[: n // 2]] = True
    train[n + rng.permutation(n)[: n // 2]] = True
    model = LogisticRegression(C=1.0, max_iter=1000)
    model.fit(x[train], y[train])
    scores = model.decision_function(x[~train])
    return float(roc_auc_score(y[~train], scores)), int((~train).sum() // 2)


def embedding_drift(
    reference: np.ndarray, live: np.ndarray, *, seed: int, min_auc: float, z: float
) -> DriftResult:
    """The domain classifier's verdict: drifted when its AUC exceeds both `min_auc` and
    0.5 + `z` null standard errors (see the module docstring)."""
    auc, per_side = domain_classifier_auc(reference, live, seed=seed)
    sd = auc_null_sd(per_side, per_side)
    threshold = max(min_auc, 0.5 + z * sd)
    detail = {"questions_per_side": per_side, "null_sd": sd, "min_auc": min_auc, "z": z}
    return DriftResult("embedding_auc", auc, threshold, auc > threshold, detail)


def _words(questions: Sequence[Sequence[str]]) -> list[str]:
    return [word for question in questions for word in question]


def vocabulary_drift(
    reference: Sequence[Sequence[str]],
    live: Sequence[Sequence[str]],
    *,
    seed: int,
    max_increase: float,
) -> DriftResult:
    """Drifted when the share of live words unseen in the reference exceeds the share a
    held-out half of the reference shows by more than `max_increase`. Questions are lists
    of words (tokenized as the model reads them)."""
    if len(reference) < 2 or not live:
        raise ValueError("need at least 2 reference questions and 1 live question")
    order = np.random.default_rng(seed).permutation(len(reference))
    half = len(reference) // 2
    known_half = set(_words([reference[i] for i in order[:half]]))
    held_out = _words([reference[i] for i in order[half:]])
    baseline = sum(w not in known_half for w in held_out) / max(len(held_out), 1)
    known = set(_words(reference))
    live_words = _words(live)
    unseen = sum(w not in known for w in live_words) / max(len(live_words), 1)
    # Against the half-reference baseline the full reference knows more words, so the
    # comparison errs on the side of no alarm.
    increase = unseen - baseline
    detail = {"live_unseen_share": unseen, "reference_unseen_share": baseline}
    return DriftResult("unseen_words", increase, max_increase, increase > max_increase, detail)


def ks_drift(
    measure: str,
    reference: np.ndarray,
    live: np.ndarray,
    *,
    alpha: float,
    min_statistic: float,
    larger_only: bool = False,
) -> DriftResult:
    """Drifted when the two-sample Kolmogorov-Smirnov test rejects equal distributions at
    `alpha` and its statistic (the largest gap between the two CDFs) is over
    `min_statistic`; with `larger_only`, only when the live median is the larger (a
    rank-1 distance that shrank is no alarm). Used on words per question and on rank-1
    distances."""
    from scipy.stats import ks_2samp

    ref = np.asarray(reference, np.float64)
    cur = np.asarray(live, np.float64)
    if ref.size == 0 or cur.size == 0:
        raise ValueError(f"{measure}: need values on both sides")
    test = ks_2samp(ref, cur)
    statistic, p_value = float(test.statistic), float(test.pvalue)
    ref_median, live_median = float(np.median(ref)), float(np.median(cur))
    drifted = p_value < alpha and statistic > min_statistic
    if larger_only:
        drifted = drifted and live_median > ref_median
    detail = {
        "p_value": p_value,
        "alpha": alpha,
        "reference_median": ref_median,
        "live_median": live_median,
    }
    return DriftResult(measure, statistic, min_statistic, drifted, detail)
