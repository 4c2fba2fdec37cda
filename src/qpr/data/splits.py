"""Train / validation / test splits by cluster, the leakage filter, and positive pairs.

Splitting by cluster (never by question) keeps every paraphrase of a test question out of
training; the leakage filter then removes val/test questions whose normalised text also
occurs in train (paper section 4.1.1, "a second filter").
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from qpr.errors import QPRError

SPLITS: tuple[str, ...] = ("train", "val", "test")
NO_SPLIT = "none"
DROPPED = "dropped"


def filter_clusters(
    clusters: pd.DataFrame, *, coherence_threshold: float, min_size: int
) -> pd.DataFrame:
    """Mark each cluster kept or dropped, with the reason (incoherent / too_small)."""
    frame = clusters.copy()
    too_small = frame["size"] < min_size
    incoherent = ~too_small & (frame["coherence"] < coherence_threshold)
    frame["kept"] = ~(too_small | incoherent)
    frame["drop_reason"] = np.select([too_small, incoherent], ["too_small", "incoherent"], "")
    return frame


def assign_splits(
    clusters: pd.DataFrame, ratios: Mapping[str, float], *, seed: int
) -> pd.DataFrame:
    """Add a `split` column: kept clusters shuffled with `seed` and cut by `ratios` (by
    cluster count); dropped clusters get "dropped". Deterministic for a given cluster set."""
    frame = clusters.sort_values("cluster_id").reset_index(drop=True)
    frame["split"] = DROPPED
    kept = frame.index[frame["kept"]].to_numpy()
    order = np.random.default_rng(seed).permutation(kept)
    start = 0
    for name, end in zip(SPLITS, _cuts(len(order), ratios), strict=True):
        frame.loc[order[start:end], "split"] = name
        start = end
    return frame


def _cuts(total: int, ratios: Mapping[str, float]) -> np.ndarray:
    """Where `assign_splits` cuts `total` shuffled clusters: each split's end."""
    cuts = np.rint(np.cumsum([ratios[name] for name in SPLITS]) * total).astype(int)
    cuts[-1] = total
    return cuts


def splits_fit(total: int, ratios: Mapping[str, float], tolerance: float) -> bool:
    """Whether `total` kept clusters split as `assign_splits` cuts them give every split
    with a ratio at least one cluster, each share within `tolerance` of its ratio (the
    cluster gate's split_shares check)."""
    if total < 1:
        return False
    counts = np.diff(_cuts(total, ratios), prepend=0)
    for name, count in zip(SPLITS, counts, strict=True):
        expected = float(ratios[name])
        if (expected > 0 and count < 1) or abs(count / total - expected) > tolerance:
            return False
    return True


def min_clusters(ratios: Mapping[str, float], tolerance: float, *, most: int = 100_000) -> int:
    """The fewest kept clusters from which every count splits within `tolerance`
    (14 for 80/10/10 within 0.05: 8 to 12 fit, 13 does not)."""
    positive = [float(r) for r in ratios.values() if float(r) > 0]
    # Past 1/tolerance clusters every share is within it; the rarest split needs a cluster.
    bound = min(most, int(1 / max(tolerance, 1 / most)) + int(2 / min(positive)) + 2)
    failing = [n for n in range(1, bound + 1) if not splits_fit(n, ratios, tolerance)]
    return failing[-1] + 1 if failing else 1


class TooFewClusters(QPRError, ValueError):
    """Data too small to split into train / validation / test clusters."""


def require_enough_clusters(
    clusters: pd.DataFrame,
    ratios: Mapping[str, float],
    *,
    tolerance: float,
    min_size: int,
    source: object,
) -> None:
    """Raise TooFewClusters, in one line naming what is missing, when the kept clusters
    (columns kept, size) cannot be split as the cluster gate demands; else nothing."""
    kept = clusters[clusters["kept"].astype(bool)]
    if splits_fit(len(kept), ratios, tolerance):
        return
    need = min_clusters(ratios, tolerance)
    shares = "/".join(f"{round(100 * float(ratios[name]))}" for name in SPLITS)
    raise TooFewClusters(
        f"too little data to train on: {source} holds {int(kept['size'].sum()):,} questions "
        f"in {len(kept):,} paraphrase clusters (questions with one answer); splitting "
        f"clusters {shares} (train/val/test) needs at least {need:,} clusters of "
        f"{min_size}+ questions each. Add logs with more answers, each asked {min_size}+ ways"
    )


def apply_splits(questions: pd.DataFrame, clusters: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Give each question its cluster's split, then remove leakage.

    Returns the questions frame with a `split` column (train/val/test, or "none" for
    questions in no kept cluster; they stay in the index) and the number of val/test
    questions moved to "none" because their normalised text also occurs in train.
    """
    split_of = dict(zip(clusters["cluster_id"], clusters["split"], strict=True))
    frame = questions.copy()
    frame["split"] = frame["cluster_id"].map(split_of).fillna(NO_SPLIT)
    frame.loc[frame["split"] == DROPPED, "split"] = NO_SPLIT
    train_keys = set(frame.loc[frame["split"] == "train", "norm_key"])
    leaked = frame["split"].isin(["val", "test"]) & frame["norm_key"].isin(train_keys)
    frame.loc[leaked, "split"] = NO_SPLIT
    # Within val/test, one normalised text may still appear under two qids (Quora):
    # keep the first so no text is ever a query and its own relevant document.
    evaluated = frame["split"].isin(["val", "test"])
    repeated = evaluated & frame.duplicated("norm_key", keep="first")
    frame.loc[repeated, "split"] = NO_SPLIT
    return frame, int(leaked.sum() + repeated.sum())


def shrink_small_clusters(
    questions: pd.DataFrame, clusters: pd.DataFrame, *, min_size: int
) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """Clusters left with fewer than `min_size` questions in their split after the leakage
    filter have no positive pair and no relevant document: drop them (reason
    "too_small_after_leakage") and move their questions to "none"."""
    in_split = questions[questions["split"].isin(SPLITS)]
    remaining = in_split.groupby("cluster_id").size()
    kept = clusters["kept"].to_numpy()
    sizes = clusters["cluster_id"].map(remaining).fillna(0).to_numpy()
    shrunk = kept & (sizes < min_size)
    clusters = clusters.copy()
    clusters.loc[shrunk, ["kept", "drop_reason", "split"]] = [
        False,
        "too_small_after_leakage",
        DROPPED,
    ]
    gone = set(clusters.loc[shrunk, "cluster_id"])
    questions = questions.copy()
    questions.loc[questions["cluster_id"].isin(gone), "split"] = NO_SPLIT
    return questions, clusters, int(shrunk.sum())


def positive_pairs(
    questions: pd.DataFrame, *, max_per_cluster: int, seed: int | np.random.Generator
) -> pd.DataFrame:
    """Every within-cluster pair of split questions, at most `max_per_cluster` per cluster
    (sampled with `seed`, so large clusters do not dominate training). A Generator as
    `seed` goes on where it stopped: pairs drawn piece by piece, in cluster order, equal
    those drawn at once.

    Pairs are stored canonically, q1_id < q2_id (a self pair is impossible by
    construction and the cluster gate checks it); orientation is randomised at training.
    Columns: q1_id, q2_id, cluster_id (int64), split (str).
    """
    rng = np.random.default_rng(seed)
    in_split = questions[questions["split"].isin(SPLITS)].sort_values(["cluster_id", "question_id"])
    chunks: list[np.ndarray] = []
    cluster_col: list[np.ndarray] = []
    split_col: list[np.ndarray] = []
    for (cluster_id, split), group in in_split.groupby(["cluster_id", "split"], sort=True):
        ids = group["question_id"].to_numpy(dtype=np.int64)
        left, right = np.triu_indices(len(ids), k=1)
        if len(left) > max_per_cluster:
            chosen = np.sort(rng.choice(len(left), size=max_per_cluster, replace=False))
            left, right = left[chosen], right[chosen]
        chunks.append(np.stack([ids[left], ids[right]], axis=1))
        cluster_col.append(np.full(len(left), cluster_id, dtype=np.int64))
        split_col.append(np.full(len(left), split, dtype=object))
    if not chunks:
        return pd.DataFrame({"q1_id": [], "q2_id": [], "cluster_id": [], "split": []}).astype(
            {"q1_id": "int64", "q2_id": "int64", "cluster_id": "int64", "split": "object"}
        )
    pairs = np.concatenate(chunks)
    return pd.DataFrame(
        {
            "q1_id": pairs.min(axis=1),
            "q2_id": pairs.max(axis=1),
            "cluster_id": np.concatenate(cluster_col),
            "split": np.concatenate(split_col),
        }
    )


def training_pairs_frame(questions: pd.DataFrame, pairs: pd.DataFrame) -> pd.DataFrame:
    """Train pairs with their texts: q1_id, q2_id, cluster_id, q1_text, q2_text."""
    text_of = questions.set_index("question_id")["text"]
    train = pairs[pairs["split"] == "train"].reset_index(drop=True)
    return train.assign(
        q1_text=text_of.reindex(train["q1_id"]).to_numpy(),
        q2_text=text_of.reindex(train["q2_id"]).to_numpy(),
    )
