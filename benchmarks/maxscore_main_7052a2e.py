"""FROZEN COPY of main's BM25 kernel (src/qpr/retrieval/maxscore.py at commit 7052a2e), kept
only as the baseline of benchmarks/bm25_kernel.py. Do not use it elsewhere.

Exact top-k of BM25 scores over term-major posting lists, compiled (numba, no GIL).

MaxScore (Turtle & Flood 1995): the query's terms are visited from the largest possible
contribution down. Before a long posting list, the k-th best score so far (θ) is compared
with the most the remaining terms can still add to one document (`left`); once θ is out of
reach, no document not yet seen can enter the top k: the remaining (long, common-word)
lists are not read at all; the few documents still able to reach θ get those terms'
weights from a document-major copy of the weights (a handful of terms per question).

Compiled because a question's terms reach tens of thousands of postings (on Quora, "what"
alone has 54k) and numpy's scatter-add holds the GIL; compiled, a Quora question's top 100
cost about 0.2 ms (0.4 ms in numpy) and run beside the dense search in another thread.
Scores are summed in float32 in term order, exactly as ``acc[rows] += weights * times``
would.

Against bm25s with its numba backend (`benchmarks/library_choices.py`, Quora, k 100, the
service's candidates): bm25s is faster (p50 0.24 against 0.34 ms, p99 0.43 against 1.7 ms),
in the service's fused path too, with the same top k up to the order of equal scores; both
kernels release the GIL (a busy encoder thread beside either keeps the same pace).
Replacing this module by bm25s is proposed (issue 24); until then this kernel serves.

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

__all__ = ["Postings", "Query", "Scratch", "fuse_one", "thread_scratch", "top_k", "union_one"]

_SEEN, _ALIVE = 1, 2
# A random read of one document's row costs about as much as reading this many postings
# in order. On 1M synthetic questions (half the queries keep 25k documents alive, against
# 400k postings left) choosing the cheaper way took the kernel's p50 from 3.0 to 2.0 ms and
# its p99 from 23 to 9 ms (one run each, the machine busy with other work).
_ROW_COST = 16


class Postings(NamedTuple):
    """BM25 weights term-major (term t's postings: rows[indptr[t]:indptr[t+1]], ascending,
    with weights[...]) and the same weights document-major (document d's terms:
    doc_terms[doc_indptr[d]:doc_indptr[d+1]], with doc_weights[...]), read to complete the
    scores of the few documents still alive once pruning starts."""

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
    """Work arrays, returned as they were given: acc float32 [N] zeros, state uint8 [N]
    zeros, touched int32 [N], position int32 [V] all -1."""

    acc: np.ndarray
    state: np.ndarray
    touched: np.ndarray
    position: np.ndarray


_THREAD = threading.local()


def thread_scratch(num_docs: int, num_terms: int) -> Scratch:
    """This thread's work arrays for `top_k` (allocated once per thread and size: top_k
    leaves them as it found them)."""
    scratch = getattr(_THREAD, "scratch", None)
    if scratch is None or scratch.acc.size != num_docs or scratch.position.size != num_terms:
        scratch = Scratch(
            np.zeros(num_docs, np.float32),
            np.zeros(num_docs, np.uint8),
            np.zeros(num_docs, np.int32),
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
    worth_pruning: int,
) -> tuple[np.ndarray, np.ndarray, int]:
    """(scores float32 [<= k], rows int64 [<= k], first pruned term or -1), best first,
    ties by row; documents scoring 0 and `exclude_row` are left out. worth_pruning: lists
    at least this long are worth a check of θ before them. Compiled, GIL released."""
    return _top_k(*postings, *question, k, exclude_row, worth_pruning, *scratch)


@numba.njit(nogil=True, cache=True)
def _kth_best(acc: np.ndarray, docs: np.ndarray, k: int) -> np.float32:
    """The k-th largest of acc[docs] (k <= docs.size), through a min-heap of the k best:
    linear in practice and unaffected by ties (BM25 scores repeat a lot, which sends a
    quickselect towards quadratic time)."""
    heap = np.empty(k, np.float32)
    for i in range(k):  # heapify the first k, sifting each up
        heap[i] = acc[docs[i]]
        c = i
        while c > 0 and heap[(c - 1) >> 1] > heap[c]:
            parent = (c - 1) >> 1
            heap[c], heap[parent] = heap[parent], heap[c]
            c = parent
    for i in range(k, docs.size):
        x = acc[docs[i]]
        if x <= heap[0]:
            continue
        c = 0  # replace the smallest, sift it down
        while True:
            child = 2 * c + 1
            if child >= k:
                break
            if child + 1 < k and heap[child + 1] < heap[child]:
                child += 1
            if heap[child] >= x:
                break
            heap[c] = heap[child]
            c = child
        heap[c] = x
    return heap[0]


@numba.njit(nogil=True, cache=True)
def _complete_alive(
    indptr: np.ndarray,
    rows: np.ndarray,
    weights: np.ndarray,
    doc_indptr: np.ndarray,
    doc_terms: np.ndarray,
    doc_weights: np.ndarray,
    terms: np.ndarray,
    repeats: np.ndarray,
    pruned_at: int,
    theta: np.float32,
    still: float,
    touched: np.ndarray,
    acc: np.ndarray,
    state: np.ndarray,
    position: np.ndarray,
) -> None:
    """After pruning at term `pruned_at`: mark the touched documents that can still reach
    θ alive and add the remaining terms' weights to their scores (in `acc`)."""
    rest = terms.size - pruned_at
    alive = 0
    for i in range(touched.size):
        d = touched[i]
        if acc[d] + still >= theta:
            state[d] = _ALIVE
            alive += 1
    remaining = 0
    for i in range(rest):
        remaining += indptr[terms[pruned_at + i] + 1] - indptr[terms[pruned_at + i]]
    if alive * _ROW_COST > remaining:
        # Many alive documents (a low θ on a large corpus): reading the remaining
        # lists in order costs less than a random read of each document's row. Added
        # term by term, the same order as below: the same float32 sums.
        for i in range(rest):
            times = repeats[pruned_at + i]
            for p in range(indptr[terms[pruned_at + i]], indptr[terms[pruned_at + i] + 1]):
                if state[rows[p]] == _ALIVE:
                    acc[rows[p]] += weights[p] * times
        rest = 0
    # Each alive document gets the remaining terms' weights from its own (short) row,
    # added in term order as the lists would.
    for i in range(rest):
        position[terms[pruned_at + i]] = i
    found = np.zeros(rest, np.float32)
    for i in range(touched.size if rest else 0):
        d = touched[i]
        if state[d] != _ALIVE:
            continue
        found[:] = 0.0
        for p in range(doc_indptr[d], doc_indptr[d + 1]):
            at = position[doc_terms[p]]
            if at >= 0:
                found[at] = doc_weights[p]
        for at in range(rest):
            if found[at] > 0:
                acc[d] += found[at] * repeats[pruned_at + at]
    for i in range(rest):
        position[terms[pruned_at + i]] = -1


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
    worth_pruning: int,
    acc: np.ndarray,
    state: np.ndarray,
    touched: np.ndarray,
    position: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, int]:
    """`top_k` with its groups spread out (`Postings`, `Query`, `Scratch` say what each
    array holds)."""
    n_touched = 0
    pruned_at = -1
    theta, still = np.float32(0.0), 0.0
    for j in range(terms.size):
        a, z = indptr[terms[j]], indptr[terms[j] + 1]
        times = repeats[j]
        for p in range(a, z):
            d = rows[p]
            if d == exclude_row:
                continue
            if state[d] == 0:
                state[d] = _SEEN
                touched[n_touched] = d
                n_touched += 1
            acc[d] += weights[p] * times
        if j + 1 < terms.size and n_touched >= k:
            nxt = indptr[terms[j + 1] + 1] - indptr[terms[j + 1]]
            if nxt >= worth_pruning:
                theta = _kth_best(acc, touched[:n_touched], k)
                # Relative slack: float32 sums may round a hair above float64 bounds.
                still = left[j + 1] * (1.0 + 1e-5)
                if still < theta:
                    pruned_at = j + 1
                    break

    if pruned_at >= 0:
        _complete_alive(
            indptr, rows, weights, doc_indptr, doc_terms, doc_weights, terms, repeats,
            pruned_at, theta, still, touched[:n_touched], acc, state, position,
        )  # fmt: skip

    # The result: the kept documents with a positive score, by (score desc, row asc).
    want = _SEEN if pruned_at < 0 else _ALIVE
    kept = np.empty(n_touched, np.int64)
    n = 0
    for i in range(n_touched):
        d = touched[i]
        if state[d] >= want and acc[d] > 0:
            kept[n] = d
            n += 1
    kept = kept[:n]
    if n > k:
        theta = _kth_best(acc, kept, k)
        m = 0
        for i in range(n):
            if acc[kept[i]] >= theta:  # ties at the cut stay: rows break them
                kept[m] = kept[i]
                m += 1
        kept = kept[:m]
    kept = np.sort(kept)
    scores = np.empty(kept.size, np.float32)
    for i in range(kept.size):
        scores[i] = acc[kept[i]]
    order = np.argsort(-scores, kind="mergesort")[:k]  # stable: equal scores stay by row
    out_rows, out_scores = kept[order], scores[order]

    for i in range(n_touched):
        acc[touched[i]] = 0.0
        state[touched[i]] = 0
    return out_scores, out_rows, pruned_at


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
