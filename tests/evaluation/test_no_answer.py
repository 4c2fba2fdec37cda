"""Queries with no paraphrase (qpr.evaluation.no_answer): which are held out, and that
dropping a query's own cluster from its candidates is the search of an index built
without that cluster."""

from __future__ import annotations

import faiss
import numpy as np
import pandas as pd
import pytest

from qpr.evaluation.no_answer import (
    dense_top1_without_cluster,
    drop_own_cluster,
    fused_top1_without_cluster,
    held_out_mask,
    row_clusters,
)
from qpr.retrieval.dense import distances_to
from qpr.retrieval.fusion import candidate_union, fuse_union


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


def test_drop_own_cluster_moves_the_rest_up():
    rows = np.array([[4, 1, 2, 0, -1], [3, 2, 1, 0, 4]], np.int64)
    values = np.arange(10, dtype=np.float32).reshape(2, 5)
    row_cluster = np.array([7, 8, 7, 9, 8], np.int64)  # rows 0..4
    kept_rows, kept_values = drop_own_cluster(rows, values, row_cluster, np.array([8, 7]), 3)
    assert kept_rows.tolist() == [[2, 0, -1], [3, 1, 4]]
    assert kept_values.tolist() == [[2.0, 3.0, -np.inf], [5.0, 7.0, 9.0]]


def _world(seed: int = 0):
    """60 vectors in 12 clusters of 5; each query is a cluster member's own vector."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((12, 8)).astype(np.float32)
    row_cluster = np.repeat(np.arange(12, dtype=np.int64), 5)
    x = centres[row_cluster] + 0.3 * rng.standard_normal((60, 8)).astype(np.float32)
    lexical = rng.random((6, 60)).astype(np.float32)  # a fixed lexical score per row
    queries = np.arange(0, 60, 10)  # one member of every other cluster
    return x, row_cluster, lexical, queries


def _top_scores(scores: np.ndarray, allowed: np.ndarray, k: int):
    """Each query's top k rows among `allowed` by `scores` [Q, N], best first."""
    masked = np.where(allowed, scores, -np.inf)
    rows = np.argsort(-masked, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(masked, rows, axis=1), rows.astype(np.int64)


def test_dropping_the_cluster_is_searching_an_index_without_it():
    x, row_cluster, lexical, queries = _world()
    index = faiss.IndexFlatL2(8)
    index.add(x)
    own = row_cluster[queries]
    vectors = x[queries]
    extra, dense_k, lexical_k, weight = 5, 4, 6, 0.6

    got_dense = dense_top1_without_cluster(index, vectors, row_cluster, own, 1 + extra)
    got_fused = fused_top1_without_cluster(
        index,
        vectors,
        _top_scores(lexical, np.ones(60, bool)[None], lexical_k + extra),
        row_cluster,
        own,
        dense_candidates=dense_k,
        extra=extra,
        dense_weight=weight,
    )
    for i, cluster in enumerate(own):
        # the reference: an index that never held the cluster, its rows mapped back
        left = np.flatnonzero(row_cluster != cluster)
        small = faiss.IndexFlatL2(8)
        small.add(x[left])
        d, r = small.search(vectors[i : i + 1], dense_k)
        assert got_dense[i] == pytest.approx(d[0, 0])
        dense_rows = left[r]
        lex_scores, lex_rows = _top_scores(lexical[i : i + 1], row_cluster[None] != cluster, 6)
        union = candidate_union(dense_rows, lex_rows)
        sims = -distances_to(index, vectors[i : i + 1], union)
        _, top = fuse_union(sims, union, lex_scores, lex_rows, weight, 1)
        want = distances_to(index, vectors[i : i + 1], top)[0, 0]
        assert got_fused[i] == pytest.approx(want)
        assert row_cluster[top[0, 0]] != cluster
    # with its cluster in the index, a query finds itself: distance 0, nothing like it
    assert (got_dense > 0.1).all()
