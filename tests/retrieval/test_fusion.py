"""Fusion of the dense and BM25 rankings on hand-made rankings (qpr.retrieval.fusion)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qpr.retrieval.fusion import (
    candidate_union,
    fuse_union,
    fuse_union_one,
    scaled_at,
    unit_range,
    values_at,
)


def test_unit_range_scales_each_row_over_its_finite_scores() -> None:
    scores = np.array([[2.0, 4.0, -np.inf, 3.0], [5.0, 5.0, -np.inf, -np.inf]])
    out = unit_range(scores)
    assert out.dtype == np.float32
    assert out.tolist() == [[0.0, 1.0, 0.0, 0.5], [1.0, 1.0, 0.0, 0.0]]


def test_fuse_union_one_returns_slots_into_the_union() -> None:
    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(5, 200))
        dense = rng.integers(0, n, (1, int(rng.integers(1, 30))))
        lexical = rng.permutation(n + 40)[:30][None]
        lexical[lexical >= n] = -1
        scores = np.where(lexical >= 0, rng.integers(0, 5, lexical.shape), -np.inf)
        union = candidate_union(dense, lexical)
        sims = np.where(union >= 0, -rng.integers(0, 6, union.shape), -np.inf).astype(np.float32)
        weight, k = float(rng.choice([0.0, 0.3, 0.5, 1.0])), int(rng.integers(1, 60))
        want_scores, want_rows = fuse_union(sims, union, scores, lexical, weight, k)
        valid = union[0] >= 0
        got_scores, slots = fuse_union_one(
            sims[0][valid], union[0][valid], scores[0], lexical[0], weight, k
        )
        kept = want_rows[0] >= 0
        assert np.array_equal(union[0][valid][slots], want_rows[0][kept])
        assert np.array_equal(got_scores, want_scores[0][kept])
    with pytest.raises(ValueError, match="every lexical row"):
        fuse_union_one(np.zeros(2), np.array([2, 4]), np.ones(2), np.array([2, 9]), 0.5, 2)
    with pytest.raises(ValueError, match="dense_weight"):
        fuse_union_one(np.zeros(2), np.array([2, 4]), np.ones(1), np.array([2]), 1.5, 2)


def _sims(union: np.ndarray, sims: dict[int, float]) -> np.ndarray:
    """Dense similarities float32 [1, U] for a one-query union: -inf at empty slots."""
    return np.array([[sims.get(int(r), -np.inf) for r in union[0]]], np.float32)


def test_fuse_hand_computed() -> None:
    # dense over the union: rows 5, 7, 9, 3 with sims 0, -1, -2, -2 → scaled 1, 0.5, 0, 0
    # bm25:  rows 9, 3 with scores 4, 2                        → scaled 1, 0
    lex_s, lex_r = np.array([[4.0, 2.0, -np.inf]]), np.array([[9, 3, -1]])
    union = candidate_union(np.array([[5, 7, 9]]), lex_r)
    sims = _sims(union, {5: 0.0, 7: -1.0, 9: -2.0, 3: -2.0})
    scores, rows = fuse_union(sims, union, lex_s, lex_r, 0.5, 4)
    # 5: 0.5·1 = 0.5; 7: 0.5·0.5 = 0.25; 9: 0.5·0 + 0.5·1 = 0.5; 3: 0 → 5 and 9 tie: by row
    assert rows.tolist() == [[5, 9, 7, 3]]
    assert scores.tolist()[0] == pytest.approx([0.5, 0.5, 0.25, 0.0])


def test_fuse_limits_are_the_single_rankings() -> None:
    rng = np.random.default_rng(1)
    dense_r = np.stack([rng.permutation(50)[:10] for _ in range(4)])
    lex_r = np.stack([rng.permutation(50)[:10] for _ in range(4)])
    lex_s = -np.sort(-rng.random((4, 10)), axis=1)
    union = candidate_union(dense_r, lex_r)
    sims = np.where(union >= 0, -rng.random(union.shape), -np.inf).astype(np.float32)
    by_distance = np.take_along_axis(union, np.argsort(-sims, axis=1), axis=1)
    assert np.array_equal(fuse_union(sims, union, lex_s, lex_r, 1.0, 5)[1], by_distance[:, :5])
    assert np.array_equal(fuse_union(sims, union, lex_s, lex_r, 0.0, 5)[1], lex_r[:, :5])


def test_fuse_with_an_empty_side_and_bad_weight() -> None:
    empty_s, empty_r = np.full((1, 2), -np.inf), np.full((1, 2), -1)
    union = candidate_union(np.array([[4, 2]]), empty_r)
    sims = _sims(union, {4: 0.0, 2: -3.0})
    scores, rows = fuse_union(sims, union, empty_s, empty_r, 0.3, 3)
    assert rows.tolist() == [[4, 2, -1]]
    assert scores[0, :2].tolist() == pytest.approx([0.3, 0.0]) and np.isneginf(scores[0, 2])
    with pytest.raises(ValueError, match="dense_weight"):
        fuse_union(sims, union, empty_s, empty_r, 1.5, 1)


def test_candidate_union_is_each_querys_distinct_rows_ascending() -> None:
    dense = np.array([[7, 3, -1], [2, 2, 5]])
    lexical = np.array([[3, 9], [-1, -1]])
    assert candidate_union(dense, lexical).tolist() == [[3, 7, 9, -1, -1], [2, 5, -1, -1, -1]]
    with pytest.raises(ValueError, match="same Q"):
        candidate_union(dense, lexical[:1])


def test_one_questions_compiled_union_equals_the_vectorised_one() -> None:
    rng = np.random.default_rng(5)
    for _ in range(200):
        dense = rng.integers(-1, 60, (3, int(rng.integers(1, 25))))
        lexical = rng.integers(-1, 60, (3, int(rng.integers(1, 40))))
        together = candidate_union(dense, lexical)  # Q = 3: numpy
        for i in range(3):  # Q = 1: compiled
            assert np.array_equal(
                candidate_union(dense[i : i + 1], lexical[i : i + 1]), together[i : i + 1]
            )


def test_values_at_looks_each_wanted_row_up_in_its_own_query() -> None:
    rows = np.array([[3, 7, 9, -1], [7, 2, -1, -1]])
    values = np.array([[0.5, 1.5, 2.5, 9.0], [4.0, 5.0, 9.0, 9.0]])
    got = values_at(rows, values, np.array([[9, 3, -1], [7, 2, 2]]))
    assert got.dtype == np.float32
    assert got.tolist() == [[2.5, 0.5, math.inf], [4.0, 5.0, 5.0]]
    with pytest.raises(ValueError, match="not among"):
        values_at(rows, values, np.array([[9], [3]]))  # 3 is query 0's row, not query 1's


def test_fuse_over_the_union_gives_lexical_only_rows_their_dense_share() -> None:
    # dense search found row 5 only; BM25 found 9 and 3; the union is scored exactly:
    # sims 5: 0, 9: -1, 3: -2 → scaled 1, 0.5, 0; BM25 9: 4, 3: 2 → scaled 1, 0
    union = candidate_union(np.array([[5]]), np.array([[9, 3]]))
    sims = _sims(union, {5: 0.0, 9: -1.0, 3: -2.0})
    scores, rows = fuse_union(sims, union, np.array([[4.0, 2.0]]), np.array([[9, 3]]), 0.5, 3)
    # 9: 0.5·0.5 + 0.5·1 = 0.75 beats 5: 0.5·1; without the union 9 would get 0.5 only
    assert rows.tolist() == [[9, 5, 3]]
    assert scores[0].tolist() == pytest.approx([0.75, 0.5, 0.0])


def test_fuse_union_fuses_each_query_on_its_own() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        q, n = int(rng.integers(2, 5)), int(rng.integers(5, 200))
        dense = rng.integers(-1, n, (q, int(rng.integers(1, 30))))
        lexical = np.stack([rng.permutation(n + 40)[:30] for _ in range(q)])
        lexical[lexical >= n] = -1  # empty slots
        scores = np.where(lexical >= 0, rng.integers(0, 5, lexical.shape), -np.inf)
        union = candidate_union(dense, lexical)
        # integer similarities: many ties, broken by row
        sims = np.where(union >= 0, -rng.integers(0, 6, union.shape), -np.inf).astype(np.float32)
        weight, k = float(rng.choice([0.0, 0.3, 0.5, 1.0])), int(rng.integers(1, 60))
        got_scores, got_rows = fuse_union(sims, union, scores, lexical, weight, k)
        for i in range(q):  # the batch's per-query offsets leak nothing between queries
            one = slice(i, i + 1)
            alone = fuse_union(sims[one], union[one], scores[one], lexical[one], weight, k)
            assert np.array_equal(got_rows[i], alone[1][0])
            assert np.array_equal(got_scores[i], alone[0][0])
            kept = got_rows[i] >= 0
            assert set(got_rows[i][kept].tolist()) <= set(union[i].tolist())
            rank = list(zip(-got_scores[i][kept], got_rows[i][kept], strict=True))
            assert rank == sorted(rank)  # best first, ties by row


def test_fuse_union_refuses_rows_outside_the_union() -> None:
    union = candidate_union(np.array([[4, 2]]), np.array([[2]]))
    with pytest.raises(ValueError, match="every lexical row"):
        fuse_union(np.zeros((1, 3)), union, np.array([[1.0, 2.0]]), np.array([[2, 9]]), 0.5, 2)
    with pytest.raises(ValueError, match="dense_weight"):
        fuse_union(np.zeros((1, 3)), union, np.array([[1.0]]), np.array([[2]]), -0.1, 2)


def test_scaled_at_reads_each_side_of_the_fusion_for_the_kept_rows() -> None:
    rng = np.random.default_rng(3)
    lexical_rows = np.array([[9, 5, 2, -1]])
    lexical_scores = np.array([[3.0, 1.5, 0.5, -np.inf]], np.float32)
    union = candidate_union(np.array([[4, 9, 2, 7, -1]]), lexical_rows)
    dense_sims = np.where(union >= 0, -rng.random(union.shape), -np.inf).astype(np.float32)
    for weight in (0.0, 0.4, 1.0):
        scores, rows = fuse_union(dense_sims, union, lexical_scores, lexical_rows, weight, 5)
        kept = rows[0][rows[0] >= 0]
        dense = scaled_at(dense_sims[0], union[0], kept)
        lexical = scaled_at(lexical_scores[0], lexical_rows[0], kept)
        np.testing.assert_allclose(weight * dense + (1 - weight) * lexical, scores[0][: kept.size],
                                   atol=1e-6)  # fmt: skip
    # row 4: not a BM25 candidate; 9: the best; 5: (1.5 - 0.5) / (3 - 0.5)
    got = scaled_at(lexical_scores[0], lexical_rows[0], np.array([4, 9, 5]))
    np.testing.assert_allclose(got, [0.0, 1.0, 0.4], rtol=1e-6)
