"""The fusion of the dense and the BM25 rankings of one query.

Fusion (`fuse_union`): both sides' candidates in one union (`candidate_union`), each
scored by its exact dense distance; BM25 scores and dense similarities min-max normalised
per query to [0, 1] (a row BM25 did not return gets 0 there), combined as
α·dense + (1 - α)·lexical. α is chosen on the validation split by the evaluate stage;
α = 1 is the dense ranking. The served ranking built on it: `qpr.retrieval.hybrid`.

Arrays: float32 scores, int64 rows (-1 = empty slot); small functions, no framework code.
"""

from __future__ import annotations

import numpy as np

from qpr.retrieval.maxscore import fuse_one, union_one


def candidate_union(dense_rows: np.ndarray, lexical_rows: np.ndarray) -> np.ndarray:
    """Each query's distinct candidates from both retrievers: int64 [Q, Cd + Cl], ascending,
    -1 (empty) slots last. dense_rows int64 [Q, Cd], lexical_rows int64 [Q, Cl].

    Every row of the union is then scored by its exact distance
    (`qpr.retrieval.dense.distances_to`), so a BM25 candidate the approximate index did not
    return still gets its dense share in `fuse_union`, and the dense side only has to add
    the few candidates BM25 missed.
    """
    dense_rows = np.asarray(dense_rows, np.int64)
    lexical_rows = np.asarray(lexical_rows, np.int64)
    if dense_rows.ndim != 2 or lexical_rows.ndim != 2 or len(dense_rows) != len(lexical_rows):
        raise ValueError(
            f"dense_rows and lexical_rows must be [Q, C] with the same Q, got "
            f"{dense_rows.shape} and {lexical_rows.shape}"
        )
    if len(dense_rows) == 1:  # one question (the service): compiled
        return union_one(dense_rows[0], lexical_rows[0])[None]
    empty = np.iinfo(np.int64).max  # sorts after every row
    both = np.concatenate([dense_rows, lexical_rows], axis=1)
    both = np.sort(np.where(both >= 0, both, empty), axis=1)
    repeated = np.zeros(both.shape, bool)
    repeated[:, 1:] = both[:, 1:] == both[:, :-1]
    both[repeated] = empty
    both.sort(axis=1)
    return np.where(both == empty, -1, both)


def values_at(rows: np.ndarray, values: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """values float [Q, C] of rows int64 [Q, C] (-1 = empty) looked up for wanted int64
    [Q, k]: float32 [Q, k], inf for -1; the first occurrence when a row repeats.
    ValueError when a wanted row is not among its query's rows."""
    rows = np.asarray(rows, np.int64)
    wanted = np.asarray(wanted, np.int64)
    q = rows.shape[0]
    width = int(max(rows.max(initial=0), wanted.max(initial=0))) + 2
    offsets = np.arange(q, dtype=np.int64)[:, None] * width
    keys = (np.where(rows >= 0, rows, width - 1) + offsets).ravel()
    order = np.argsort(keys, kind="stable")
    found = wanted >= 0
    targets = (wanted + offsets)[found]
    slots = np.searchsorted(keys[order], targets)
    if slots.size and (slots.max() >= keys.size or not (keys[order][slots] == targets).all()):
        raise ValueError("a wanted row is not among its query's rows")
    out = np.full(wanted.shape, np.inf, np.float32)
    out[found] = np.asarray(values, np.float32).ravel()[order[slots]]
    return out


def unit_range(scores: np.ndarray) -> np.ndarray:
    """float32 [Q, C]: scores float [Q, C] min-max scaled per row to [0, 1] over the finite
    entries (-inf: no candidate, 0 out); a constant row becomes 1. Each side's scaling in
    `fuse_union`, public for a caller mixing in scores of its own."""
    finite = np.isfinite(scores)
    lo = np.where(finite, scores, np.inf).min(axis=1, keepdims=True)
    hi = np.where(finite, scores, -np.inf).max(axis=1, keepdims=True)
    span = np.where(hi > lo, hi - lo, 1.0)
    out = np.where(finite, (scores - lo) / span, 0.0)
    return np.where(finite & (hi == lo), 1.0, out).astype(np.float32)


def scaled_at(scores: np.ndarray, rows: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """One side of one query's fusion, read for some rows: float32 [len(wanted)], each
    wanted row's score min-max scaled over the side's candidates as `fuse_union` scales it, 0
    where the side did not return the row. scores float [C] for rows int64 [C] (-1 =
    empty). What `explain` reports: α times the dense value plus (1 - α) times the
    lexical one is the fused score."""
    rows = np.asarray(rows, np.int64)
    valid = rows >= 0
    scaled = unit_range(np.where(valid, np.asarray(scores, np.float32), -np.inf)[None])[0]
    share = dict(zip(rows[valid].tolist(), scaled[valid].tolist(), strict=True))
    return np.asarray([share.get(row, 0.0) for row in np.asarray(wanted).tolist()], np.float32)


def fuse_union(
    dense_sims: np.ndarray,
    union_rows: np.ndarray,
    lexical_scores: np.ndarray,
    lexical_rows: np.ndarray,
    dense_weight: float,
    k: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Fused (scores float32 [Q, k], rows int64 [Q, k]), best first, ties by row, for
    candidates from `candidate_union`, every one with its dense similarity; all queries at
    once (no per-query loop). One question alone goes faster through `fuse_union_one`
    (compiled).

    union_rows int64 [Q, U]: ascending per query, -1 slots last, holding every row of
    lexical_rows (what `candidate_union` returns); dense_sims float [Q, U] for them,
    higher = closer (minus the exact L2 distance). lexical_scores float [Q, C] for
    lexical_rows int64 [Q, C] (BM25; -1 = empty). dense_weight α in [0, 1]:
    α·dense + (1 - α)·lexical after per-query min-max scaling; a row BM25 did not return
    gets 0 from it.
    """
    if not 0.0 <= dense_weight <= 1.0:
        raise ValueError(f"dense_weight must be in [0, 1], got {dense_weight}")
    union_rows = np.asarray(union_rows, np.int64)
    lexical_rows = np.asarray(lexical_rows, np.int64)
    q, u = union_rows.shape
    if lexical_rows.shape[0] != q:
        raise ValueError(f"{q} union rows but {lexical_rows.shape[0]} lexical rows")
    valid = union_rows >= 0
    dense = unit_range(np.where(valid, dense_sims, -np.inf))
    lexical_found = lexical_rows >= 0
    lexical = unit_range(np.where(lexical_found, lexical_scores, -np.inf))
    # Each lexical row's slot in its query's union: one search over keys made globally
    # ascending by a per-query offset (empty slots take the largest key of their query).
    width = int(max(union_rows.max(initial=0), lexical_rows.max(initial=0))) + 2
    offsets = np.arange(q, dtype=np.int64)[:, None] * width
    keys = (np.where(valid, union_rows, width - 1) + offsets).ravel()
    wanted = (lexical_rows + offsets)[lexical_found]
    slots = np.searchsorted(keys, wanted)
    if slots.size and (slots.max() >= keys.size or not (keys[slots] == wanted).all()):
        raise ValueError(_NOT_A_UNION)
    lexical_share = np.zeros(q * u, np.float32)
    lexical_share[slots] = lexical[lexical_found]
    score = np.float32(dense_weight) * dense + np.float32(1.0 - dense_weight) * (
        lexical_share.reshape(q, u)
    )
    score = np.where(valid, score, -np.inf).astype(np.float32)
    order = np.lexsort((np.where(valid, union_rows, width), -score), axis=-1)[:, :k]
    out_s = np.full((q, k), -np.inf, np.float32)
    out_r = np.full((q, k), -1, np.int64)
    taken = np.take_along_axis(score, order, axis=1)
    out_s[:, : order.shape[1]] = taken
    out_r[:, : order.shape[1]] = np.where(
        np.isfinite(taken), np.take_along_axis(union_rows, order, axis=1), -1
    )
    return out_s, out_r


_NOT_A_UNION = "union_rows must hold every lexical row (use candidate_union)"


def fuse_union_one(
    sims: np.ndarray,
    union: np.ndarray,
    lexical_scores: np.ndarray,
    lexical_rows: np.ndarray,
    dense_weight: float,
    k: int,
) -> tuple[np.ndarray, np.ndarray]:
    """`fuse_union` for one question, 1-D arrays in: (scores float32 [<= k], slots int64
    [<= k]) best first, each slot indexing `union`, so the caller reads each kept row's
    own values (its distance) without searching for them. The same float32 arithmetic.

    sims float [U] for union int64 [U] (ascending, -1 slots last, holding every lexical
    row); lexical_scores float [C], lexical_rows int64 [C] (-1 = empty).
    """
    if not 0.0 <= dense_weight <= 1.0:
        raise ValueError(f"dense_weight must be in [0, 1], got {dense_weight}")
    scores, slots = fuse_one(
        np.ascontiguousarray(sims, np.float32),
        np.ascontiguousarray(union, np.int64),
        np.ascontiguousarray(lexical_scores, np.float32),
        np.ascontiguousarray(lexical_rows, np.int64),
        np.float32(dense_weight),
        np.float32(1.0 - dense_weight),
        k,
    )
    if slots.size and slots[0] < 0:
        raise ValueError(_NOT_A_UNION)
    return scores, slots
