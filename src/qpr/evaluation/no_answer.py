"""Queries with no paraphrase in the index, for measuring false answers.

Validation and test hold only answerable queries: every query has a paraphrase. A
seeded share of a split's clusters is held out instead: each question of a held-out
cluster searches the index with every question of its own cluster removed, so nothing
it finds is right. The "no answer" threshold must refuse it; answering it is a false
answer.

The removal is simulated per query: its own cluster's rows are dropped from both
retrievers' candidates, fetched deeper by the largest cluster's size. Within the candidate
depth this is the ranking an index without that cluster serves (BM25's IDF aside).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from qpr.evaluation.queries import QuerySet


@dataclass(frozen=True)
class Unanswerable:
    """One split's held-out queries and what the served search gives them.

    held_out : bool [Q] the query's cluster is held out (a query with no paraphrase).
    top1 : float64 [Q] rank-1 distance with the query's own cluster removed from the
        index; inf where nothing is left or where the query is not held out.
    """

    held_out: np.ndarray
    top1: np.ndarray

    @property
    def distances(self) -> np.ndarray:
        """float64 [U] the held-out queries' rank-1 distances."""
        return self.top1[self.held_out]


def query_clusters(queries: QuerySet, questions: pd.DataFrame) -> np.ndarray:
    """int64 [Q] each query's cluster id (from the cluster stage's questions)."""
    cluster_of = pd.Series(
        questions["cluster_id"].to_numpy(np.int64), index=questions["question_id"].to_numpy()
    )
    return cluster_of.loc[queries.query_ids].to_numpy(np.int64)


def row_clusters(row_to_qid: np.ndarray, questions: pd.DataFrame) -> np.ndarray:
    """int64 [N] the cluster id of each index row; -1 for a question in no cluster."""
    cluster_of = pd.Series(
        questions["cluster_id"].to_numpy(np.int64), index=questions["question_id"].to_numpy()
    )
    # fill_value keeps the dtype int64: through float64, 64-bit cluster ids lose digits.
    return cluster_of.reindex(np.asarray(row_to_qid), fill_value=-1).to_numpy(np.int64)


def held_out_mask(clusters: np.ndarray, share: float, seed: int) -> np.ndarray:
    """bool [Q]: the queries whose cluster is among a seeded `share` of the distinct
    `clusters` (int64 [Q]); at least one cluster when share > 0 and any exist."""
    if not 0.0 <= share < 1.0:
        raise ValueError(f"share must be in [0, 1), got {share}")
    distinct = np.unique(np.asarray(clusters, np.int64))
    count = round(share * distinct.size)
    if share > 0 and distinct.size:
        count = max(count, 1)
    chosen = np.random.default_rng(seed).choice(distinct, size=count, replace=False)
    return np.isin(clusters, chosen)


def drop_own_cluster(
    rows: np.ndarray,
    values: np.ndarray,
    row_cluster: np.ndarray,
    own: np.ndarray,
    keep: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Candidates with every row of the query's own cluster removed, the rest moved up in
    their order: (rows int64 [Q, keep], values float32 [Q, keep]); -1 / -inf pad the tail.

    rows int64 [Q, C] (-1 = empty), values float [Q, C] beside them, row_cluster int64 [N]
    (`row_clusters`), own int64 [Q] each query's cluster.
    """
    rows = np.asarray(rows, np.int64)
    values = np.asarray(values, np.float32)
    gone = (rows < 0) | (row_cluster[np.maximum(rows, 0)] == np.asarray(own)[:, None])
    # A stable sort on "dropped" keeps the survivors in their rank order, first.
    order = np.argsort(gone, axis=1, kind="stable")[:, :keep]
    kept_rows = np.take_along_axis(rows, order, axis=1)
    kept_values = np.take_along_axis(values, order, axis=1)
    dropped = np.take_along_axis(gone, order, axis=1)
    out_rows = np.full((rows.shape[0], keep), -1, np.int64)
    out_values = np.full((rows.shape[0], keep), -np.inf, np.float32)
    width = order.shape[1]
    out_rows[:, :width] = np.where(dropped, -1, kept_rows)
    out_values[:, :width] = np.where(dropped, -np.inf, kept_values)
    return out_rows, out_values


def dense_top1_without_cluster(
    index,
    vectors: np.ndarray,
    row_cluster: np.ndarray,
    own: np.ndarray,
    depth: int,
) -> np.ndarray:
    """float64 [Q] the dense rank-1 distance once the query's own cluster is gone.

    vectors float32 [Q, D]; depth: how many rows to fetch (at least 1 + the largest
    cluster, so something outside the cluster is always among them)."""
    from qpr.retrieval.dense import search

    distances, rows = search(index, vectors, depth)
    rows, distances = drop_own_cluster(rows, distances, row_cluster, own, 1)
    return np.where(rows[:, 0] >= 0, distances[:, 0], np.inf).astype(np.float64)


def fused_top1_without_cluster(
    index,
    vectors: np.ndarray,
    lexical: tuple[np.ndarray, np.ndarray],
    row_cluster: np.ndarray,
    own: np.ndarray,
    *,
    dense_candidates: int,
    extra: int,
    dense_weight: float,
) -> np.ndarray:
    """float64 [Q] the rank-1 distance of the served fusion once the query's own cluster
    is gone: the index's top `dense_candidates` and BM25's top Cl - `extra` outside the
    cluster, each scored by its exact distance and fused at `dense_weight`
    (`qpr.evaluation.fusion_tuning.fused_result`, as `Bundle.search` serves it).

    lexical: BM25 (scores float32 [Q, Cl], rows int64 [Q, Cl]) fetched `extra` deeper
    than the served candidates; extra: the largest cluster's size (the over-fetch).
    """
    from qpr.retrieval.dense import distances_to, search
    from qpr.retrieval.fusion import candidate_union, fuse_union

    distances, dense_rows = search(index, vectors, dense_candidates + extra)
    dense_rows, _ = drop_own_cluster(dense_rows, distances, row_cluster, own, dense_candidates)
    served = lexical[1].shape[1] - extra
    lex_rows, lex_scores = drop_own_cluster(lexical[1], lexical[0], row_cluster, own, served)
    rows = candidate_union(dense_rows, lex_rows)
    sims = -distances_to(index, vectors, rows)
    _, top = fuse_union(sims, rows, lex_scores, lex_rows, dense_weight, 1)
    return distances_to(index, vectors, top)[:, 0].astype(np.float64)
