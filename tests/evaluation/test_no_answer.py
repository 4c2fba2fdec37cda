"""Queries with no paraphrase (qpr.evaluation.no_answer): which are held out, and that
dropping a query's own cluster from its candidates is the search of an index built
without that cluster."""

from __future__ import annotations

import faiss
import numpy as np
import pandas as pd
import pytest

from qpr.artifacts import SearchConfig
from qpr.evaluation.no_answer import cluster_rows, held_out_mask, row_clusters
from qpr.retrieval.bm25 import BM25Index
from qpr.retrieval.hybrid import HybridSearch


def test_held_out_mask_takes_whole_clusters_seeded():
    clusters = np.repeat(np.arange(10, dtype=np.int64), 3)
    held = held_out_mask(clusters, 0.2, seed=1)
    assert len(np.unique(clusters[held])) == 2 and held.sum() == 6
    # a cluster is held out whole or not at all
    assert all(held[clusters == c].all() or not held[clusters == c].any() for c in range(10))
    assert np.array_equal(held, held_out_mask(clusters, 0.2, seed=1))
    assert not np.array_equal(held, held_out_mask(clusters, 0.2, seed=2))
    assert held_out_mask(clusters[:3], 0.01, seed=0).all()  # at least one cluster
    with pytest.raises(ValueError, match="share"):
        held_out_mask(clusters, 1.0, seed=0)


def test_row_clusters_keep_64_bit_ids_exact():
    big = np.int64(5835192729437288911)  # through float64 it would become ...448
    questions = pd.DataFrame(
        {"question_id": np.array([11, 12], np.int64), "cluster_id": np.array([big, big + 1])}
    )
    got = row_clusters(np.array([12, 11, 99], np.int64), questions)
    assert got.dtype == np.int64 and got.tolist() == [big + 1, big, -1]


def test_cluster_rows_lists_each_query_cluster_padded():
    row_cluster = np.array([7, 8, 7, 9, 8, -1, 7], np.int64)  # rows 0..6
    got = cluster_rows(np.array([8, 7, 5]), row_cluster, 3)
    assert got.tolist() == [[1, 4, -1], [0, 2, 6], [-1, -1, -1]]
    with pytest.raises(ValueError, match="width"):
        cluster_rows(np.array([7]), row_cluster, 2)


def test_excluding_the_cluster_rows_is_an_index_without_it():
    rng = np.random.default_rng(0)
    row_cluster = np.repeat(np.arange(12, dtype=np.int64), 5)
    centres = rng.standard_normal((12, 8)).astype(np.float32)
    x = centres[row_cluster] + 0.3 * rng.standard_normal((60, 8)).astype(np.float32)
    texts = [f"topic{c} word{i % 7} item{i % 3}" for i, c in enumerate(row_cluster)]
    index = faiss.IndexFlatL2(8)
    index.add(x)
    config = SearchConfig(dense_weight=0.6, lexical_candidates=6, dense_candidates=4)
    searcher = HybridSearch(index, config, bm25=BM25Index.build(texts), texts=texts)
    queries = np.arange(0, 60, 10)  # one member of every other cluster
    own = cluster_rows(row_cluster[queries], row_cluster, 5)
    ranking = searcher.rank([texts[q] for q in queries], lambda: x[queries], 1, exclude=own)
    got = ranking.distances[:, 0]
    for i, q in enumerate(queries):
        # the reference: the cluster's rows never searched, the collection's weights kept
        allowed = row_cluster != row_cluster[q]
        ranking = searcher.rank([texts[q]] * 2, lambda q=q: x[[q, q]], 1, allowed=allowed)
        assert (
            got[i] == ranking.distances[0, 0] and row_cluster[ranking.rows[0, 0]] != row_cluster[q]
        )
    # with its cluster in the index, a query finds itself: distance 0, nothing like it
    assert (got > 0.1).all()
