"""Queries with no paraphrase in the index, for measuring false answers.

Validation and test hold only answerable queries: every query has a paraphrase. A
seeded share of a split's clusters is held out instead: each question of a held-out
cluster searches the index with every question of its own cluster removed, so nothing
it finds is right. The "no answer" threshold must refuse it; answering it is a false
answer.

The removal is simulated per query: its own cluster's rows are dropped from both
retrievers' candidates, fetched deeper by the largest cluster's size, inside the served
ranking (`qpr.retrieval.hybrid.HybridSearch.rank` with ``exclude``). Within the candidate
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


def cluster_rows(own: np.ndarray, row_cluster: np.ndarray, width: int) -> np.ndarray:
    """int64 [Q, width]: the index rows of each query's own cluster, -1 padded; what a
    search leaves out (`qpr.retrieval.hybrid`'s ``exclude``) to serve the query as if its
    cluster were not indexed. own int64 [Q]; row_cluster int64 [N] (`row_clusters`);
    width: at least the largest cluster's size (ValueError otherwise)."""
    own = np.asarray(own, np.int64)
    out = np.full((own.size, width), -1, np.int64)
    clustered = np.flatnonzero(np.asarray(row_cluster) >= 0)
    members = pd.Series(clustered).groupby(np.asarray(row_cluster)[clustered]).apply(np.asarray)
    for i, cluster in enumerate(own.tolist()):
        rows = members.get(cluster, np.empty(0, np.int64))
        if rows.size > width:
            raise ValueError(f"cluster {cluster} has {rows.size} rows, more than width {width}")
        out[i, : rows.size] = rows
    return out
