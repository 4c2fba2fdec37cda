"""Exact top-k of BM25 scores over term-major posting lists, compiled (numba, no GIL).

Document-at-a-time MaxScore (Turtle & Flood 1995; the essential-list form of Mallia et
al. 2017, "An experimental study of index compression and DAAT query processing methods").
Terms go largest possible contribution first, and `left[j]` is the most terms j, j+1, ...
can add together. Once θ, the k-th best score so far, passes `left[j]`, a document in none
of the lists before j cannot enter the top k. So only those lists ("essential") are merged
in document order. The others are searched, galloping forward, only for documents that can
still reach θ.

Not term-at-a-time, as before: at 1M-10M questions the common words' lists hold hundreds of
thousands of postings. Completing the documents still alive read them in full or one random
row per document (p50 12.9 ms, p99 72 ms at 10M). In document order each list is read
forward once, and no per-document accumulator needs clearing.

θ starts high so that pruning starts at once: the first `_SEED_DOCS` documents of the
rarest lists are scored in full from the document-major weights. Their k-th best score
bounds the final θ from below, since k real documents reach it. The heap keeps the k best
by (score desc, row asc), the results' order, so ties come out as before. 256 seeds beat
64 and 1024: top-100 p50 0.23 / 0.23 / 0.30 ms at 134k, 0.76 / 0.83 / 0.82 ms at 1M
(synthetic, one run, blocks alternated).

At 134k questions the term-at-a-time kernel was faster at p50 (0.17 against 0.23 ms) and
slower at p99 (0.78 against 0.46 ms): short lists suit an accumulator. One kernel is kept.

Exact: a score is summed in float32 in the query's term order, as
``acc[rows] += weights * times`` would, so it is bit-identical to the term-at-a-time
kernel's. The bounds carry a small relative slack, so rounding never drops a document that
belongs.

Block maxima (Ding & Suel 2011: each 64 postings' largest weight) were tried and removed.
A short question sits in nearly every block of 64, so a block's max is near its list's:
at 1M, without -> with, p50 0.58 -> 0.56 ms and p99 2.36 -> 2.47 ms (best of 3 per
query, one run each): within noise.

Compiled because a question's terms reach hundreds of thousands of postings and numpy holds
the GIL: compiled, the kernel runs beside the dense search in another thread.

`top_k` takes its arrays in three groups: `Postings` (the index's weights, both ways),
`Query` (the question's terms in MaxScore's order, `Query.of`) and `Scratch` (work arrays
that come back as they were given, so a thread reuses its own: `thread_scratch`). The
compiled kernel behind it, `_top_k`, takes them one by one: numba compiles for flat arrays.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import NamedTuple

import numba
import numpy as np

__all__ = [
    "Postings",
    "Query",
    "Scratch",
    "fuse_one",
    "scan_top_k",
    "scores_at",
    "thread_scratch",
    "top_k",
    "union_one",
]

_SEEN = 1
_SEED_DOCS = 256  # documents scored from their rows for a first θ
_NO_MASK = np.zeros(0, np.bool_)  # `allowed` of size 0: every document may be returned


class Postings(NamedTuple):
    """BM25 weights term-major (term t's postings: rows[indptr[t]:indptr[t+1]], ascending,
    with weights[...]) and the same weights document-major (document d's terms:
    doc_terms[doc_indptr[d]:doc_indptr[d+1]], with doc_weights[...]), read to score the seed
    documents that give θ its first value."""

    indptr: np.ndarray  # int64 [V + 1]
    rows: np.ndarray  # int32 [nnz]
    weights: np.ndarray  # float32 [nnz], > 0
    doc_indptr: np.ndarray  # int64 [N + 1]
    doc_terms: np.ndarray  # int32 [nnz]
    doc_weights: np.ndarray  # float32 [nnz]


class Query(NamedTuple):
    """A question's terms in the order MaxScore visits them (largest possible contribution
    first), how often each is in the question, and left[j] = the most the terms j, j+1, ...
    can still add to one document's score (left[T] = 0)."""

    terms: np.ndarray  # int64 [T]
    repeats: np.ndarray  # float32 [T]
    left: np.ndarray  # float64 [T + 1]

    @classmethod
    def of(cls, counts: Mapping[int, int], upper_bounds: np.ndarray) -> Query:
        """The question's terms (term id -> times in the question, first-seen order) by
        `times * upper bound` descending, ties in first-seen order. upper_bounds: float32
        [V], each term's largest weight."""
        terms = np.fromiter(counts.keys(), np.int64, len(counts))
        repeats = np.fromiter(counts.values(), np.int64, len(counts))
        bounds = upper_bounds[terms].astype(np.float64) * repeats
        order = np.argsort(-bounds, kind="stable")
        left = np.append(np.cumsum(bounds[order][::-1])[::-1], 0.0)
        return cls(terms[order], repeats[order].astype(np.float32), left)


class Scratch(NamedTuple):
    """Work arrays, returned as they were given: state uint8 [N] zeros, touched int32
    [_SEED_DOCS] (the documents scored for the first θ), position int32 [V] all -1."""

    state: np.ndarray
    touched: np.ndarray
    position: np.ndarray


_THREAD = threading.local()


def thread_scratch(num_docs: int, num_terms: int) -> Scratch:
    """This thread's work arrays for `top_k` (allocated once per thread and size: top_k
    leaves them as it found them)."""
    scratch = getattr(_THREAD, "scratch", None)
    if scratch is None or scratch.state.size != num_docs or scratch.position.size != num_terms:
        scratch = Scratch(
            np.zeros(num_docs, np.uint8),
            np.zeros(_SEED_DOCS, np.int32),
            np.full(num_terms, -1, np.int32),
        )
        _THREAD.scratch = scratch
    return scratch


def top_k(
    postings: Postings,
    question: Query,
    k: int,
    scratch: Scratch,
    *,
    exclude_row: int = -1,
    allowed: np.ndarray | None = None,
    worth_pruning: int,
) -> tuple[np.ndarray, np.ndarray, int]:
    """(scores float32 [<= k], rows int64 [<= k], first term not read in full or -1), best
    first, ties by row; documents scoring 0 and `exclude_row` are left out. allowed: bool
    [N] (None: every document); a document with False is never scored, neither for θ nor
    for the top k, so the result is the top k of the allowed documents alone. worth_pruning:
    lists shorter than this are always read in full. Compiled, GIL released."""
    mask = _NO_MASK if allowed is None else allowed
    return _top_k(*postings, *question, k, exclude_row, mask, worth_pruning, *scratch)


@numba.njit(nogil=True, cache=True)
def _worse(s: np.float32, d: np.int64, t: np.float32, e: np.int64) -> bool:
    """Whether (score s, row d) ranks below (t, e): a lower score, or equal and a larger row."""
    return s < t or (s == t and d > e)


@numba.njit(nogil=True, cache=True)
def _sift_down(heap_s: np.ndarray, heap_d: np.ndarray, size: int) -> None:
    """Restore the heap (worst at the root) after its root was replaced."""
    s, d = heap_s[0], heap_d[0]
    c = 0
    while True:
        child = 2 * c + 1
        if child >= size:
            break
        if child + 1 < size and _worse(
            heap_s[child + 1], heap_d[child + 1], heap_s[child], heap_d[child]
        ):
            child += 1
        if not _worse(heap_s[child], heap_d[child], s, d):
            break
        heap_s[c], heap_d[c] = heap_s[child], heap_d[child]
        c = child
    heap_s[c], heap_d[c] = s, d


@numba.njit(nogil=True, cache=True)
def _sift_up(heap_s: np.ndarray, heap_d: np.ndarray, c: int) -> None:
    """Restore the heap after an entry was appended at c."""
    s, d = heap_s[c], heap_d[c]
    while c > 0:
        parent = (c - 1) >> 1
        if not _worse(s, d, heap_s[parent], heap_d[parent]):
            break
        heap_s[c], heap_d[c] = heap_s[parent], heap_d[parent]
        c = parent
    heap_s[c], heap_d[c] = s, d


@numba.njit(nogil=True, cache=True)
def _offer(
    heap_s: np.ndarray, heap_d: np.ndarray, size: int, k: int, s: np.float32, d: np.int64
) -> int:
    """Keep (s, d) in the k-best min-heap of `size` entries when it belongs there; the
    heap's new size."""
    if size < k:
        heap_s[size], heap_d[size] = s, d
        _sift_up(heap_s, heap_d, size)
        return size + 1
    if _worse(heap_s[0], heap_d[0], s, d):
        heap_s[0], heap_d[0] = s, d
        _sift_down(heap_s, heap_d, size)
    return size


@numba.njit(nogil=True, cache=True)
def _next_geq(rows: np.ndarray, lo: int, hi: int, d: int) -> int:
    """The first p in [lo, hi) with rows[p] >= d (hi if none): galloping, then binary."""
    if lo >= hi or rows[lo] >= d:
        return lo
    step = 1
    while lo + step < hi and rows[lo + step] < d:
        lo += step
        step <<= 1
    top = min(lo + step, hi)  # rows[lo] < d <= rows[top] (or top == hi)
    while top - lo > 1:
        mid = (lo + top) >> 1
        if rows[mid] < d:
            lo = mid
        else:
            top = mid
    return top


@numba.njit(nogil=True, cache=True)
def _seed_theta(
    indptr: np.ndarray,
    rows: np.ndarray,
    doc_indptr: np.ndarray,
    doc_terms: np.ndarray,
    doc_weights: np.ndarray,
    terms: np.ndarray,
    repeats: np.ndarray,
    k: int,
    exclude_row: int,
    allowed: np.ndarray,
    budget: int,
    state: np.ndarray,
    touched: np.ndarray,
    position: np.ndarray,
) -> float:
    """A lower bound of the final k-th best score: the k-th best full score of the first
    `budget` documents of the lists in query order (the rarest, heaviest words first),
    each scored from its own row; -inf when they are fewer than k."""
    n_terms = terms.size
    # position[t]: the query's first slot of term t; same[i]: its next slot (a repeat)
    same = np.full(n_terms, -1, np.int64)
    for i in range(n_terms):
        if position[terms[i]] < 0:
            position[terms[i]] = i
        else:
            at = position[terms[i]]
            while same[at] >= 0:
                at = same[at]
            same[at] = i
    found = np.zeros(n_terms, np.float32)
    heap_s = np.empty(k, np.float32)
    heap_d = np.empty(k, np.int64)
    size = 0
    n = 0
    for j in range(n_terms):
        for p in range(indptr[terms[j]], indptr[terms[j] + 1]):
            if n >= budget:
                break
            d = rows[p]
            if state[d] != 0 or d == exclude_row or (allowed.size and not allowed[d]):
                continue
            state[d] = _SEEN
            touched[n] = d
            n += 1
            for r in range(doc_indptr[d], doc_indptr[d + 1]):
                at = position[doc_terms[r]]
                while at >= 0:
                    found[at] = doc_weights[r]
                    at = same[at]
            s = np.float32(0.0)
            for at in range(n_terms):
                if found[at] > 0:
                    s += found[at] * repeats[at]
                    found[at] = 0.0
            if size < k:
                heap_s[size], heap_d[size] = s, d
                _sift_up(heap_s, heap_d, size)
                size += 1
            elif s > heap_s[0]:
                heap_s[0], heap_d[0] = s, d
                _sift_down(heap_s, heap_d, size)
    for i in range(n):
        state[touched[i]] = 0
    for i in range(n_terms):
        position[terms[i]] = -1
    return heap_s[0] if size == k else -np.inf


@numba.njit(nogil=True, cache=True)
def _top_k(
    indptr: np.ndarray,
    rows: np.ndarray,
    weights: np.ndarray,
    doc_indptr: np.ndarray,
    doc_terms: np.ndarray,
    doc_weights: np.ndarray,
    terms: np.ndarray,
    repeats: np.ndarray,
    left: np.ndarray,
    k: int,
    exclude_row: int,
    allowed: np.ndarray,
    worth_pruning: int,
    state: np.ndarray,
    touched: np.ndarray,
    position: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, int]:
    """`top_k` with its groups spread out (`Postings`, `Query`, `Scratch` say what each
    array holds)."""
    n_terms = terms.size
    masked = allowed.size > 0
    # float32 sums of n_terms products may round a hair above the float64 bounds
    slack = 1.0 + 1e-5 + (n_terms + 2) * 2.0**-23
    cur = np.empty(n_terms, np.int64)
    end = np.empty(n_terms, np.int64)
    # Lists shorter than worth_pruning stay essential: `floor` is past the last of them.
    floor = 0
    for j in range(n_terms):
        cur[j], end[j] = indptr[terms[j]], indptr[terms[j] + 1]
        if end[j] - cur[j] < worth_pruning:
            floor = j + 1
    theta = -np.inf
    if floor < n_terms and k > 0:
        theta = _seed_theta(
            indptr, rows, doc_indptr, doc_terms, doc_weights, terms, repeats, k,
            exclude_row, allowed, _SEED_DOCS, state, touched, position,
        )  # fmt: skip
    heap_s = np.empty(max(k, 1), np.float32)  # the k best so far, worst at the root
    heap_d = np.empty(max(k, 1), np.int64)
    size = 0
    # Terms [0, ess) are essential: a document in none of their lists scores at most
    # left[ess] < θ. Their lists are merged document by document; the others are searched
    # only for the documents that can still reach θ.
    ess = n_terms
    while ess > floor and left[ess - 1] * slack < theta:
        ess -= 1
    big = np.iinfo(np.int64).max
    while ess > 0:
        d = big
        for j in range(ess):
            if cur[j] < end[j] and rows[cur[j]] < d:
                d = rows[cur[j]]
        if d == big:
            break
        s = np.float32(0.0)
        for j in range(ess):
            if cur[j] < end[j] and rows[cur[j]] == d:
                s += weights[cur[j]] * repeats[j]
                cur[j] += 1
        if d == exclude_row or (masked and not allowed[d]):
            continue
        dropped = False
        for j in range(ess, n_terms):
            if (s + left[j]) * slack < theta:
                dropped = True
                break
            if cur[j] >= end[j]:
                continue
            cur[j] = _next_geq(rows, cur[j], end[j], d)
            if cur[j] < end[j] and rows[cur[j]] == d:
                s += weights[cur[j]] * repeats[j]
        if dropped:
            continue
        size = _offer(heap_s, heap_d, size, k, s, d)
        # A no-op when (s, d) was not kept: theta already holds the heap's worst.
        if size == k and heap_s[0] > theta:
            theta = heap_s[0]
            while ess > floor and left[ess - 1] * slack < theta:
                ess -= 1

    # best first: rows ascending, then a stable sort by score descending
    order = np.argsort(heap_d[:size])
    kept = heap_d[:size][order]
    scores = heap_s[:size][order]
    best = np.argsort(-scores, kind="mergesort")
    return scores[best], kept[best], ess if ess < n_terms else -1


@numba.njit(nogil=True, cache=True)
def _row_score(
    d: int,
    doc_indptr: np.ndarray,
    doc_terms: np.ndarray,
    doc_weights: np.ndarray,
    repeats: np.ndarray,
    position: np.ndarray,
    found: np.ndarray,
) -> tuple[np.float32, bool]:
    """(document d's score, whether it shares a term) read from its row of the
    document-major weights: position[t] is term t's slot in the query (-1: not in it), each
    term once; found float32 [T] zeros, left as given. Summed in the query's term order,
    as `_top_k` sums, so the score is bit for bit the same."""
    for r in range(doc_indptr[d], doc_indptr[d + 1]):
        at = position[doc_terms[r]]
        if at >= 0:
            found[at] = doc_weights[r]
    s = np.float32(0.0)
    shared = False
    for at in range(found.size):
        if found[at] > 0:
            s += found[at] * repeats[at]
            found[at] = 0.0
            shared = True
    return s, shared


def scan_top_k(
    postings: Postings,
    question: Query,
    k: int,
    docs: np.ndarray,
    scratch: Scratch,
    *,
    exclude_row: int = -1,
) -> tuple[np.ndarray, np.ndarray]:
    """`top_k` over the documents `docs` (int64, ascending) alone, each scored from its own
    row of the document-major weights: for a filter allowing few documents, reading their
    rows costs less than walking the posting lists past every other document. The same
    float32 sums in the same term order, so the same scores and ties."""
    return _scan_top_k(
        postings.doc_indptr, postings.doc_terms, postings.doc_weights,
        question.terms, question.repeats, docs, k, exclude_row, scratch.position,
    )  # fmt: skip


@numba.njit(nogil=True, cache=True)
def _scan_top_k(
    doc_indptr: np.ndarray,
    doc_terms: np.ndarray,
    doc_weights: np.ndarray,
    terms: np.ndarray,
    repeats: np.ndarray,
    docs: np.ndarray,
    k: int,
    exclude_row: int,
    position: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    n_terms = terms.size
    for i in range(n_terms):  # a query's terms are distinct (Query.of counts repeats)
        position[terms[i]] = i
    found = np.zeros(n_terms, np.float32)
    heap_s = np.empty(max(k, 1), np.float32)
    heap_d = np.empty(max(k, 1), np.int64)
    size = 0
    for d in docs:
        if d == exclude_row:
            continue
        s, shared = _row_score(d, doc_indptr, doc_terms, doc_weights, repeats, position, found)
        if not shared:
            continue
        size = _offer(heap_s, heap_d, size, k, s, d)
    for i in range(n_terms):
        position[terms[i]] = -1
    order = np.argsort(heap_d[:size])
    kept = heap_d[:size][order]
    scores = heap_s[:size][order]
    best = np.argsort(-scores, kind="mergesort")
    return scores[best], kept[best]


def scores_at(
    postings: Postings, question: Query, rows: np.ndarray, scratch: Scratch
) -> np.ndarray:
    """float32 [R]: the question's BM25 score of each of rows int64 [R] (0: no word shared;
    -inf at -1 slots), read from the document-major weights. Summed in the query's term
    order, as `top_k` sums, so a row `top_k` returns gets its score bit for bit. A row
    costs its own terms, not the lists' lengths. Compiled, GIL released."""
    return _scores_at(
        postings.doc_indptr,
        postings.doc_terms,
        postings.doc_weights,
        question.terms,
        question.repeats,
        np.ascontiguousarray(rows, np.int64),
        scratch.position,
    )


@numba.njit(nogil=True, cache=True)
def _scores_at(
    doc_indptr: np.ndarray,
    doc_terms: np.ndarray,
    doc_weights: np.ndarray,
    terms: np.ndarray,
    repeats: np.ndarray,
    rows: np.ndarray,
    position: np.ndarray,
) -> np.ndarray:
    n_terms = terms.size
    for i in range(n_terms):  # `Query.of` holds each term once
        position[terms[i]] = i
    found = np.zeros(n_terms, np.float32)
    out = np.full(rows.size, -np.inf, np.float32)
    for i in range(rows.size):
        if rows[i] >= 0:
            out[i] = _row_score(
                rows[i], doc_indptr, doc_terms, doc_weights, repeats, position, found
            )[0]
    for i in range(n_terms):
        position[terms[i]] = -1
    return out


@numba.njit(nogil=True, cache=True)
def union_one(dense_rows: np.ndarray, lexical_rows: np.ndarray) -> np.ndarray:
    """Distinct rows of both int64 [Cd], [Cl] (-1 = empty): int64 [Cd + Cl], ascending,
    -1 slots last (one question's `qpr.retrieval.fusion.candidate_union`)."""
    both = np.concatenate((dense_rows, lexical_rows))
    both = np.sort(both[both >= 0])
    out = np.full(dense_rows.size + lexical_rows.size, -1, np.int64)
    n = 0
    for i in range(both.size):
        if i == 0 or both[i] != both[i - 1]:
            out[n] = both[i]
            n += 1
    return out


@numba.njit(nogil=True, cache=True)
def fuse_one(
    sims: np.ndarray,
    union: np.ndarray,
    lexical_scores: np.ndarray,
    lexical_rows: np.ndarray,
    dense_weight: np.float32,
    lexical_weight: np.float32,
    k: int,
) -> tuple[np.ndarray, np.ndarray]:
    """One question's fusion over its candidate union (`qpr.retrieval.fusion.fuse_union`'s
    arithmetic, float32): (scores float32 [<= k], slots int64 [<= k]) best first, ties by
    row, slots indexing `union`; slots [-1] when a lexical row is missing from the union.

    sims float32 [U]: higher = closer, for union int64 [U] (ascending, -1 slots last);
    lexical_scores float32 [C] for lexical_rows int64 [C] (-1 = empty); the weights are
    α and 1 - α as float32 (rounded from float64, as numpy would).
    """
    n = 0
    while n < union.size and union[n] >= 0:
        n += 1
    if n == 0:
        return np.empty(0, np.float32), np.empty(0, np.int64)
    lo, hi = sims[0], sims[0]
    for i in range(1, n):
        lo, hi = min(lo, sims[i]), max(hi, sims[i])
    score = np.empty(n, np.float32)
    for i in range(n):
        dense = (sims[i] - lo) / (hi - lo) if hi > lo else np.float32(1.0)
        score[i] = dense_weight * dense
    lexical = np.zeros(n, np.float32)
    found = lexical_rows >= 0
    if found.any():
        scores = lexical_scores[found]
        lo, hi = scores.min(), scores.max()
        for j, row in enumerate(lexical_rows[found]):
            at = np.searchsorted(union[:n], row)
            if at >= n or union[at] != row:
                return np.empty(0, np.float32), np.full(1, -1, np.int64)
            lexical[at] = (scores[j] - lo) / (hi - lo) if hi > lo else np.float32(1.0)
    for i in range(n):
        score[i] += lexical_weight * lexical[i]
    # union is ascending: a stable sort on -score breaks ties by row
    order = np.argsort(-score, kind="mergesort")[:k]
    return score[order], order
