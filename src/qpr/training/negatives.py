"""Hard negatives: for each training pair, a question of another cluster that an encoder
places close to it (the negatives of DPR, Karpukhin et al. 2020, and of Sentence-BERT's
mined-negative training).

In-batch negatives are random questions: after a few epochs almost all are easy and the
softmax learns little from them. A mined negative is one the encoder still confuses with
the pair. The nearest such question is often an unlabelled paraphrase (Quora's duplicate
labels are far from complete), so the pick is random among the ranks `skip` .. `skip +
window - 1` of the neighbours, not always the first.
"""

from __future__ import annotations

import numpy as np
import torch


def mine_hard_negatives(
    vectors: np.ndarray,
    anchors: np.ndarray,
    cluster_ids: np.ndarray,
    eligible: np.ndarray | None = None,
    *,
    skip: int = 0,
    window: int = 10,
    seed: int = 0,
    device: str = "cpu",
    batch_size: int = 1024,
) -> np.ndarray:
    """Row of one hard negative per anchor, int64 [P].

    vectors: float32 [Q, D], every question's embedding; anchors: int [P], the row of each
    pair's first question; cluster_ids: int [Q] (a negative never shares the anchor's);
    eligible: bool [Q], the rows a negative may come from (None: all; e.g. training and
    unclustered questions, never validation or test ones). The candidates are the eligible
    rows of other clusters by squared L2 distance to the anchor; the pick is uniform among the ranks
    skip .. skip + window - 1 (fewer where fewer exist).
    """
    vectors = np.asarray(vectors, dtype=np.float32)
    anchors = np.array(anchors, dtype=np.int64)
    # Copies: torch.from_numpy wants writable arrays (pandas hands out read-only views).
    cluster_ids = np.array(cluster_ids, dtype=np.int64)
    eligible = (
        np.ones(cluster_ids.shape, dtype=bool) if eligible is None else np.array(eligible, bool)
    )
    if vectors.ndim != 2 or cluster_ids.shape != (vectors.shape[0],):
        raise ValueError(
            f"vectors must be [Q, D] and cluster_ids [Q], got {vectors.shape}, {cluster_ids.shape}"
        )
    if eligible.shape != cluster_ids.shape:
        raise ValueError(f"eligible must be [{cluster_ids.shape[0]}], got {eligible.shape}")
    if skip < 0 or window < 1:
        raise ValueError(f"need skip >= 0 and window >= 1, got {skip}, {window}")
    if anchors.size and (anchors.min() < 0 or anchors.max() >= vectors.shape[0]):
        raise ValueError("anchors must be rows of vectors")
    depth = min(skip + window, vectors.shape[0])
    x = torch.from_numpy(vectors).to(device)
    norms = (x * x).sum(dim=1)
    clusters = torch.from_numpy(cluster_ids).to(device)
    blocked = ~torch.from_numpy(eligible).to(device)
    rng = np.random.default_rng(seed)
    picked = np.empty(anchors.shape[0], dtype=np.int64)
    for start in range(0, anchors.shape[0], batch_size):
        rows = torch.from_numpy(anchors[start : start + batch_size]).to(device)
        q = x[rows]
        # ||q||² is the same along a row and does not change the order: left out.
        distance = norms[None, :] - 2.0 * q @ x.T
        same_cluster = clusters[None, :] == clusters[rows][:, None]
        distance = distance.masked_fill(same_cluster | blocked[None, :], float("inf"))
        top = torch.topk(distance, depth, dim=1, largest=False)
        ranks = top.indices[:, skip:].cpu().numpy()
        finite = torch.isfinite(top.values[:, skip:]).sum(dim=1).cpu().numpy()
        if (finite == 0).any():
            raise ValueError("an anchor has no eligible question of another cluster")
        choice = np.floor(rng.random(rows.shape[0]) * finite).astype(np.int64)
        picked[start : start + rows.shape[0]] = ranks[np.arange(rows.shape[0]), choice]
    return picked
