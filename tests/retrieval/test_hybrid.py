"""The served ranking (qpr.retrieval.hybrid): leaving rows out with ``exclude`` is searching
an index without them, the one-question path is the batch path, and re-ranking only moves
rows within the head."""

from __future__ import annotations

import itertools

import faiss
import numpy as np
import pytest

from qpr.artifacts import SearchConfig
from qpr.retrieval.bm25 import BM25Index
from qpr.retrieval.hybrid import HybridSearch, Ranking, answered, drop_rows, fuse

WORDS = ("printer", "garden", "laptop", "bicycle", "account", "invoice")
VERBS = ("install", "reset", "clean", "repair", "find")
TEXTS = [f"how do i {v} my {w} {n}" for (v, w), n in itertools.product(
    itertools.product(VERBS, WORDS), ("today", "now"))]  # fmt: skip
CLUSTER = np.arange(len(TEXTS), dtype=np.int64) // 2  # the two wordings of one request


def _world(dim: int = 8):
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((CLUSTER.max() + 1, dim)).astype(np.float32)
    x = centres[CLUSTER] + 0.2 * rng.standard_normal((len(TEXTS), dim)).astype(np.float32)
    index = faiss.IndexFlatL2(dim)
    index.add(x)
    return index, x, BM25Index.build(TEXTS)


FUSED = SearchConfig(dense_weight=0.6, lexical_candidates=6, dense_candidates=4)
DENSE = SearchConfig()


@pytest.mark.parametrize("config", [FUSED, DENSE], ids=["fused", "dense"])
def test_excluding_a_cluster_is_searching_without_it(config: SearchConfig) -> None:
    index, x, bm25 = _world()
    search = HybridSearch(index, config, bm25=bm25, texts=TEXTS)
    queries = np.arange(0, len(TEXTS), 7)
    texts = [TEXTS[i] for i in queries]
    own = np.stack([np.flatnonzero(CLUSTER[i] == CLUSTER) for i in queries])
    got = search.rank(texts, lambda: x[queries], 5, exclude=own)
    for i, q in enumerate(queries):
        # the same collection's weights, the cluster's rows never searched
        allowed = CLUSTER[q] != CLUSTER
        want = search.rank([TEXTS[q], TEXTS[q]], lambda q=q: x[[q, q]], 5, allowed=allowed)
        assert got.rows[i].tolist() == want.rows[0].tolist()
        np.testing.assert_array_equal(got.distances[i], want.distances[0])
        assert not np.isin(got.rows[i], own[i]).any()


def test_excluding_itself_is_searching_without_it() -> None:
    index, x, bm25 = _world()
    search = HybridSearch(index, FUSED, bm25=bm25, texts=TEXTS)
    queries = np.array([0, 5, 11, 40])
    got = search.rank([TEXTS[i] for i in queries], lambda: x[queries], 5, exclude=queries)
    for i, q in enumerate(queries):
        allowed = np.arange(len(TEXTS)) != q
        want = search.rank([TEXTS[q], TEXTS[q]], lambda q=q: x[[q, q]], 5, allowed=allowed)
        assert got.rows[i].tolist() == want.rows[0].tolist()
        assert q not in got.rows[i]


def test_one_question_ranks_as_in_a_batch() -> None:
    index, x, bm25 = _world()
    search = HybridSearch(index, FUSED, bm25=bm25, texts=TEXTS)
    batch = search.rank(TEXTS[:9], lambda: x[:9], 5)
    for i in range(9):
        one = search.rank([TEXTS[i]], lambda i=i: x[i : i + 1], 5)
        assert one.rows[0].tolist() == batch.rows[i].tolist()
        np.testing.assert_array_equal(one.distances[0], batch.distances[i])
        np.testing.assert_array_equal(one.scores[0], batch.scores[i])


def test_the_steps_compose_to_rank() -> None:
    index, x, bm25 = _world()
    search = HybridSearch(index, FUSED, bm25=bm25, texts=TEXTS)
    found = search.candidates(TEXTS[:6], x[:6], 5)
    stepwise = fuse(found, 0.6, 5)
    whole = search.rank(TEXTS[:6], lambda: x[:6], 5)
    np.testing.assert_array_equal(stepwise.rows, whole.rows)
    np.testing.assert_array_equal(stepwise.scores, whole.scores)
    # a search's k beyond the collection is clipped to it
    assert search.rank(TEXTS[:1], lambda: x[:1], 500).rows.shape == (1, len(TEXTS))


def test_answered_judges_the_first_row() -> None:
    ranking = Ranking(
        np.array([[3, 1], [-1, -1], [2, 0]]), np.array([[0.5, 0.9], [np.inf] * 2, [2.0, 3.0]])
    )
    assert answered(ranking, None).tolist() == [True, False, True]
    assert answered(ranking, 1.0).tolist() == [True, False, False]


def test_drop_rows_moves_the_rest_up() -> None:
    rows = np.array([[4, 1, 2, 0, -1], [3, 2, 1, 0, 4]], np.int64)
    values = np.arange(10, dtype=np.float32).reshape(2, 5)
    exclude = np.array([[1, 4], [0, 2]], np.int64)
    kept_rows, kept_values = drop_rows(rows, values, exclude, 3)
    assert kept_rows.tolist() == [[2, 0, -1], [3, 1, 4]]
    assert kept_values.tolist() == [[2.0, 3.0, -np.inf], [5.0, 7.0, 9.0]]


def test_a_fused_config_needs_its_parts() -> None:
    index, _, _ = _world()
    with pytest.raises(ValueError, match="BM25"):
        HybridSearch(index, FUSED)
    legacy = SearchConfig(dense_weight=0.5, lexical_candidates=6)
    with pytest.raises(ValueError, match="dense_candidates"):
        HybridSearch(index, legacy, bm25=BM25Index.build(TEXTS))
