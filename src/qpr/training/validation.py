"""Validation measures: how well an encoder separates paraphrases, epoch after epoch.

Early stopping watches the validation ROC AUC (Prechelt 1998; Bradley 1997), where a pair's
score is minus the squared distance of its two vectors, positives being same-cluster
validation pairs and negatives random cross-cluster ones, or the validation MRR (each
validation question queries all the others by exact distance; relevant = same cluster).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from qpr.training.embed import embed_token_ids


@dataclass
class ValidationSet:
    """Validation questions with their paraphrase clusters.

    texts: N questions; cluster_ids: int [N] (same id = paraphrases).
    positive_pairs: int64 [P, 2] indices into texts; default: consecutive members of each
    cluster (a chain, n - 1 pairs for a cluster of n, so big clusters do not dominate).
    negative_pairs: int64 [Q, 2] cross-cluster pairs; default: max(P, num_negatives)
    random ones drawn with `seed` (fixed for the whole run so epochs are comparable).
    """

    texts: list[str]
    cluster_ids: np.ndarray
    positive_pairs: np.ndarray | None = None
    negative_pairs: np.ndarray | None = None
    num_negatives: int = 1000
    seed: int = 0

    def __post_init__(self) -> None:
        self.texts = list(self.texts)
        self.cluster_ids = np.asarray(self.cluster_ids)
        if self.cluster_ids.shape != (len(self.texts),):
            raise ValueError(
                f"cluster_ids shape {self.cluster_ids.shape} != ({len(self.texts)},) texts"
            )
        if np.unique(self.cluster_ids).shape[0] < 2:
            raise ValueError("validation needs at least two clusters (negatives cross them)")
        if self.positive_pairs is None:
            self.positive_pairs = _chain_pairs(self.cluster_ids)
        if self.negative_pairs is None:
            count = max(int(self.positive_pairs.shape[0]), self.num_negatives)
            self.negative_pairs = _random_negative_pairs(self.cluster_ids, count, self.seed)
        self.positive_pairs = np.asarray(self.positive_pairs, dtype=np.int64).reshape(-1, 2)
        self.negative_pairs = np.asarray(self.negative_pairs, dtype=np.int64).reshape(-1, 2)
        if self.positive_pairs.shape[0] == 0:
            raise ValueError("validation needs at least one cluster with two questions")


def _chain_pairs(cluster_ids: np.ndarray) -> np.ndarray:
    order = np.argsort(cluster_ids, kind="stable")
    same = cluster_ids[order][1:] == cluster_ids[order][:-1]
    return np.stack([order[:-1][same], order[1:][same]], axis=1).astype(np.int64)


def _random_negative_pairs(cluster_ids: np.ndarray, count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, 0x7E6])
    n = cluster_ids.shape[0]
    found: list[np.ndarray] = []
    have = 0
    while have < count:  # rejection sampling; >= 2 clusters guarantees progress
        cand = rng.integers(0, n, size=(2 * (count - have) + 16, 2))
        cand = cand[cluster_ids[cand[:, 0]] != cluster_ids[cand[:, 1]]]
        found.append(cand)
        have += cand.shape[0]
    return np.concatenate(found)[:count].astype(np.int64)


def roc_auc(positive_scores: np.ndarray, negative_scores: np.ndarray) -> float:
    """ROC AUC = P(score_pos > score_neg) + ½ P(tie) (Mann-Whitney U with average ranks)."""
    pos = np.asarray(positive_scores, dtype=np.float64).ravel()
    neg = np.asarray(negative_scores, dtype=np.float64).ravel()
    if pos.size == 0 or neg.size == 0:
        raise ValueError("roc_auc needs at least one positive and one negative score")
    _, inverse, counts = np.unique(
        np.concatenate([pos, neg]), return_inverse=True, return_counts=True
    )
    ends = np.cumsum(counts)
    avg_rank = (ends - counts + 1 + ends) / 2.0  # 1-based mean rank of each tie group
    rank_sum = avg_rank[inverse[: pos.size]].sum()
    return float((rank_sum - pos.size * (pos.size + 1) / 2.0) / (pos.size * neg.size))


def mean_reciprocal_rank(
    embeddings: torch.Tensor, cluster_ids: np.ndarray, *, chunk: int = 1024
) -> float:
    """MRR of every question querying all the others by exact squared L2; relevant = same
    cluster. Questions with no other member of their cluster are not counted. Ties are
    broken against the query (a relevant item tied with a non-relevant one ranks after it),
    so a collapsed encoder that maps everything to one point scores low, not 1.0.
    """
    emb = embeddings.detach().to(torch.float32)
    # Dense int labels: cluster ids may be strings (answer ids) or sparse ints.
    _, dense = np.unique(np.asarray(cluster_ids), return_inverse=True)
    labels = torch.from_numpy(dense.astype(np.int64).ravel()).to(emb.device)
    n = emb.shape[0]
    sq_norm = (emb * emb).sum(dim=1)
    reciprocal: list[torch.Tensor] = []
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        dist = sq_norm[start:stop, None] - 2.0 * emb[start:stop] @ emb.T + sq_norm[None, :]
        rows = torch.arange(stop - start, device=emb.device)
        self_mask = torch.zeros_like(dist, dtype=torch.bool)
        self_mask[rows, rows + start] = True
        relevant = (labels[start:stop, None] == labels[None, :]) & ~self_mask
        has_relevant = relevant.any(dim=1)
        inf = torch.tensor(float("inf"), device=emb.device)
        best_relevant = torch.where(relevant, dist, inf).amin(dim=1, keepdim=True)
        ahead = (~relevant & ~self_mask & (dist <= best_relevant)).sum(dim=1)
        reciprocal.append((1.0 / (1.0 + ahead.to(torch.float64)))[has_relevant])
    values = torch.cat(reciprocal) if reciprocal else torch.zeros(0, dtype=torch.float64)
    return float(values.mean()) if values.numel() else float("nan")


def evaluate_token_ids(
    encoder: nn.Module,
    token_ids: np.ndarray,
    lengths: np.ndarray,
    val: ValidationSet,
    *,
    batch_size: int,
    device: str | torch.device,
) -> dict[str, float]:
    """{"val_auc", "val_mrr"} of an encoder on val.texts, tokenised once by the caller."""
    emb = embed_token_ids(encoder, token_ids, lengths, batch_size=batch_size, device=device)
    assert val.positive_pairs is not None and val.negative_pairs is not None

    def scores(pairs: np.ndarray) -> np.ndarray:
        diff = emb[torch.from_numpy(pairs[:, 0])] - emb[torch.from_numpy(pairs[:, 1])]
        return -(diff * diff).sum(dim=1).numpy()

    return {
        "val_auc": roc_auc(scores(val.positive_pairs), scores(val.negative_pairs)),
        "val_mrr": mean_reciprocal_rank(emb, val.cluster_ids),
    }
