"""The served ranking, in one place: what `Bundle.search` serves and what every
evaluation measures.

One query's path, `HybridSearch.rank`:

1. **candidates**: BM25's top `lexical_candidates` (started first, on a worker thread)
   and the index's top max(k, `dense_candidates`), both over the `allowed` rows and
   without the `exclude`d ones; their union, each row scored by its exact distance
   (`qpr.retrieval.dense.distances_to`). A dense-only config keeps the index's top k.
2. **fuse**: α·dense + (1 - α)·BM25 after per-query min-max scaling
   (`qpr.retrieval.fusion.fuse_union`), top k, ties by row. With a companion
   (`qpr.retrieval.companion`) the dense term mixes in its cosine first.
3. **re-rank**: with a re-ranker and ``rerank_top`` N, the first N re-ordered by the
   cross-encoder (`qpr.retrieval.reranker`); a hit keeps its distance and first-stage score.
4. **threshold**: a query is answered when its first row's distance is at most the
   threshold (`answered`).

The evaluate stage tunes α and the served depth on steps 1-2 (`Candidates`, `fuse`),
then measures val and test through `rank` itself, so ``metrics.json`` describes what is
served. ``exclude`` is how an evaluation leaves a query's own question (int64 [Q]) or
its whole cluster (int64 [Q, E], -1 padded) out of the index without rebuilding it.

Arrays: float32 vectors and distances, int64 rows (-1 = empty slot); no torch.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from qpr.artifacts import SearchConfig
from qpr.retrieval.bm25 import BM25Index, lexical_search
from qpr.retrieval.companion import Companion, mixed, mixed_one
from qpr.retrieval.dense import RowDistances, distances_to, search
from qpr.retrieval.fusion import (
    candidate_union,
    fuse_union,
    fuse_union_one,
    scaled_at,
    values_at,
)
from qpr.retrieval.reranker import Reranker

__all__ = ["Candidates", "HybridSearch", "Ranking", "answered", "drop_rows", "fuse"]


@dataclass(frozen=True)
class Ranking:
    """Ranked rows of Q queries: rows int64 [Q, k] (-1 = empty), their squared L2
    distances float32 [Q, k] (inf for -1) and scores float32 [Q, k], higher first
    (fused: the fusion's; dense only: None, the distance ranks). reranked: the head was
    re-ordered by a cross-encoder, so the scores need not fall with the rank."""

    rows: np.ndarray
    distances: np.ndarray
    scores: np.ndarray | None = None
    reranked: bool = False


@dataclass(frozen=True)
class Candidates:
    """One batch's candidates from both retrievers, before fusion (step 1).

    union: int64 [Q, U] both retrievers' rows, ascending, -1 last (`candidate_union`);
    distances: float32 [Q, U] their exact squared L2 distances; lexical_scores float32
    [Q, Cl] and lexical_rows int64 [Q, Cl]: BM25's own candidates; companion float32
    [Q, U]: the companion's cosine of each union row (-inf at empty slots), None without
    one."""

    union: np.ndarray
    distances: np.ndarray
    lexical_scores: np.ndarray
    lexical_rows: np.ndarray
    companion: np.ndarray | None = None


def fuse(
    candidates: Candidates, dense_weight: float, k: int, companion_weight: float = 0.0
) -> Ranking:
    """Step 2 for a batch: the top k of the candidates fused at α = dense_weight, the
    companion's cosine mixed into the dense term at companion_weight (0: none)."""
    scores, rows = fuse_union(
        dense_term(candidates, companion_weight),
        candidates.union,
        candidates.lexical_scores,
        candidates.lexical_rows,
        dense_weight,
        k,
    )
    return Ranking(rows, values_at(candidates.union, candidates.distances, rows), scores)


def dense_term(candidates: Candidates, companion_weight: float = 0.0) -> np.ndarray:
    """float32 [Q, U]: what fusion takes as the dense side of each union row, higher =
    closer: minus the exact distance, the companion's cosine mixed in at companion_weight
    (`qpr.retrieval.companion.mixed`; 0: none)."""
    if not companion_weight:
        return -candidates.distances
    if candidates.companion is None:
        raise ValueError("a companion weight, but the candidates have no companion cosines")
    return mixed(-candidates.distances, candidates.companion, companion_weight)


def answered(ranking: Ranking, threshold: float | None) -> np.ndarray:
    """bool [Q]: a first row found and, with a threshold, its distance within it."""
    first = ranking.rows[:, 0] >= 0 if ranking.rows.shape[1] else np.zeros(len(ranking.rows), bool)
    if threshold is None:
        return first
    return first & (np.maximum(ranking.distances[:, 0], 0.0) <= threshold)


def drop_rows(
    rows: np.ndarray, values: np.ndarray, exclude: np.ndarray, keep: int
) -> tuple[np.ndarray, np.ndarray]:
    """The first `keep` of each query's ranked rows int64 [Q, C] (values float [Q, C]
    beside them) once the rows in its line of exclude int64 [Q, E] (-1 padded) are gone,
    the rest moved up in order: (rows int64 [Q, keep], values float32 [Q, keep]), -1 /
    -inf padding the tail."""
    rows = np.asarray(rows, np.int64)
    values = np.asarray(values, np.float32)
    exclude = np.asarray(exclude, np.int64)
    gone = rows < 0
    for column in exclude.T:  # E is a cluster's size: a few columns
        gone |= (rows == column[:, None]) & (column[:, None] >= 0)
    # A stable sort on "dropped" keeps the survivors in their rank order, first.
    order = np.argsort(gone, axis=1, kind="stable")[:, :keep]
    dropped = np.take_along_axis(gone, order, axis=1)
    out_rows = np.full((rows.shape[0], keep), -1, np.int64)
    out_values = np.full((rows.shape[0], keep), -np.inf, np.float32)
    width = order.shape[1]
    out_rows[:, :width] = np.where(dropped, -1, np.take_along_axis(rows, order, axis=1))
    out_values[:, :width] = np.where(dropped, -np.inf, np.take_along_axis(values, order, axis=1))
    return out_rows, out_values


class HybridSearch:
    """The served ranking over one index: built from the FAISS index, the rows' BM25 (None:
    dense only) and texts, the `SearchConfig`, and the re-ranker when the config re-ranks.

    size: the rows a search may return (the index's less tombstoned ones). Immutable;
    safe to call from several threads (FAISS and ONNX Runtime reads are)."""

    def __init__(
        self,
        index,
        config: SearchConfig,
        *,
        bm25: BM25Index | None = None,
        texts: Sequence[str] = (),
        reranker: Reranker | None = None,
        size: int | None = None,
        companion: Companion | None = None,
    ) -> None:
        if config.fused and bm25 is None:
            raise ValueError("the search config fuses BM25 in: BM25 weights are needed")
        if config.companion_weight is not None and companion is None:
            raise ValueError(f"the search config mixes in the {config.companion} companion")
        if config.fused and config.dense_candidates is None:
            raise ValueError("a fused search config needs dense_candidates (migrate it first)")
        self.index = index
        self.config = config
        self.bm25 = bm25 if config.fused else None
        self.texts = texts
        self.reranker = reranker if config.rerank_top is not None else None
        self.size = int(index.ntotal) if size is None else size
        # Kept whenever given: an evaluation mixes it in at several weights (`candidates`).
        self.companion = companion
        if companion is not None and companion.rows != int(index.ntotal):
            raise ValueError(f"{companion.rows} companion rows for {index.ntotal} index rows")
        self._row_distances = RowDistances(index)

    # -- the whole path -------------------------------------------------------------------

    def depth(self, k: int) -> int:
        """Rows the first stage ranks for a request of k: max(k, rerank_top), at most size."""
        top = self.config.rerank_top if self.reranker is not None else None
        return min(max(k, top or 0), self.size)

    def rank(
        self,
        texts: Sequence[str],
        embed: Callable[[], np.ndarray],
        k: int,
        *,
        allowed: np.ndarray | None = None,
        exclude: np.ndarray | None = None,
    ) -> Ranking:
        """Steps 1-3 for a batch: the top k rows of each text, re-ranked when configured.

        embed: returns the texts' query vectors float32 [Q, D]; called after BM25 has
        started on a worker thread, so encoding overlaps it. allowed: bool [N] the rows
        that may be returned (None: all). exclude: int64 [Q] or [Q, E] rows left out of
        each query's candidates (-1: none)."""
        first = self.depth(k)
        if first < 1:
            return _empty(len(texts), k)
        if self.bm25 is None:
            ranking = dense(self.index, embed(), first, allowed=allowed, exclude=exclude)
        elif len(texts) == 1 and exclude is None:
            ranking = self._fused_one(texts[0], embed, first, allowed)
        else:
            lexical = lexical_pool().submit(self._lexical, texts, first, allowed, exclude)
            vectors = embed()
            candidates = self._candidates(texts, vectors, lexical.result(), first, allowed, exclude)
            ranking = fuse(candidates, self._weight, first, self._companion_weight)
        return self.reranked(texts, ranking, k)

    def candidates(
        self,
        texts: Sequence[str],
        vectors: np.ndarray,
        k: int,
        *,
        allowed: np.ndarray | None = None,
        exclude: np.ndarray | None = None,
        lexical: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> Candidates:
        """Step 1 alone, for a request of k (what an evaluation fuses at several α).
        lexical: BM25's (scores, rows) when already found for these texts, k, allowed and
        exclude (they do not depend on the index's depth, which a tuning varies)."""
        first = self.depth(k)
        if lexical is None:
            lexical = self._lexical(texts, first, allowed, exclude)
        return self._candidates(texts, vectors, lexical, first, allowed, exclude)

    def lexical(
        self,
        texts: Sequence[str],
        k: int,
        *,
        allowed: np.ndarray | None = None,
        exclude: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """BM25's half of step 1 for a request of k: (scores float32 [Q, Cl], rows int64
        [Q, Cl]), to pass to `candidates` when the index's depth is what varies."""
        return self._lexical(texts, self.depth(k), allowed, exclude)

    def reranked(self, texts: Sequence[str], ranking: Ranking, k: int) -> Ranking:
        """Step 3: each query's first rerank_top rows re-ordered by the cross-encoder (none
        without one), then cut to k."""
        if self.reranker is None:
            return _cut(ranking, k)
        top = self.config.rerank_top
        assert top is not None
        rows = ranking.rows.copy()
        distances = ranking.distances.copy()
        scores = None if ranking.scores is None else ranking.scores.copy()
        for i, text in enumerate(texts):
            head = [slot for slot in range(min(top, rows.shape[1])) if rows[i, slot] >= 0]
            line = ranking.rows[i]
            order = self.reranker.rerank(
                text, head, top, text=lambda s, line=line: self.texts[line[s]]
            )
            rows[i, head] = ranking.rows[i, order]
            distances[i, head] = ranking.distances[i, order]
            if scores is not None:
                scores[i, head] = ranking.scores[i, order]
        return _cut(Ranking(rows, distances, scores, reranked=True), k)

    def shares(
        self, text: str, vector: np.ndarray, rows: np.ndarray, k: int, allowed: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(dense, BM25) float32 [len(rows)]: each row's scaled share of one query's fusion,
        its candidates found again as a search of depth k finds them (what explain shows)."""
        lexical = self._lexical([text], k, allowed, None)
        found = self._candidates([text], vector, lexical, k, allowed, None)
        union = found.union[0]
        valid = union >= 0
        sims = dense_term(found, self._companion_weight)[0]
        dense_share = scaled_at(sims[valid], union[valid], rows)
        return dense_share, scaled_at(lexical[0][0], lexical[1][0], rows)

    # -- step 1 ---------------------------------------------------------------------------

    @property
    def _weight(self) -> float:
        weight = self.config.dense_weight
        assert weight is not None  # a fused config has one
        return weight

    @property
    def _companion_weight(self) -> float:
        return self.config.companion_weight or 0.0

    def _lexical_depth(self, k: int) -> int:
        lexical_candidates = self.config.lexical_candidates
        assert lexical_candidates is not None  # a fused config has them
        return min(max(k, lexical_candidates), self.size)

    def _lexical(
        self,
        texts: Sequence[str],
        k: int,
        allowed: np.ndarray | None,
        exclude: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """BM25's (scores float32 [Q, Cl], rows int64 [Q, Cl]) for a first stage of k,
        over the allowed rows, without the excluded ones."""
        assert self.bm25 is not None
        depth = self._lexical_depth(k)
        if exclude is None or np.ndim(exclude) == 1:
            return lexical_search(self.bm25, texts, depth, exclude_rows=exclude, allowed=allowed)
        extra = np.shape(exclude)[1]
        scores, rows = lexical_search(self.bm25, texts, depth + extra, allowed=allowed)
        rows, scores = drop_rows(rows, scores, exclude, depth)
        return scores, rows

    def _candidates(
        self,
        texts: Sequence[str],
        vectors: np.ndarray,
        lexical: tuple[np.ndarray, np.ndarray],
        k: int,
        allowed: np.ndarray | None,
        exclude: np.ndarray | None,
    ) -> Candidates:
        """The union of BM25's rows and the index's top max(k, dense_candidates), each with
        its exact distance (and its companion cosine when there is a companion)."""
        assert self.config.dense_candidates is not None
        wanted = min(max(k, self.config.dense_candidates), self.size)
        dense_rows = dense(self.index, vectors, wanted, allowed=allowed, exclude=exclude).rows
        lexical_scores, lexical_rows = lexical
        union = candidate_union(dense_rows, lexical_rows)
        companion = None if self.companion is None else self.companion.similarities(texts, union)
        return Candidates(
            union, distances_to(self.index, vectors, union), lexical_scores, lexical_rows, companion
        )

    def _fused_one(
        self, text: str, embed: Callable[[], np.ndarray], k: int, allowed: np.ndarray | None
    ) -> Ranking:
        """Steps 1-2 for one question (the service's path): the batch path's ranking with
        less around it. BM25 reads the question's words on the worker thread; the union's
        distances come from `RowDistances` (the stored vectors looked up once per index)
        and the kept rows' distances are read at the slots the fusion returns. The same
        float32 arithmetic as `fuse`, compiled (`fuse_union_one`)."""
        assert self.bm25 is not None and self.config.dense_candidates is not None
        depth = self._lexical_depth(k)
        lexical = lexical_pool().submit(self.bm25.search, text, depth, allowed=allowed)
        vector = embed()
        wanted = min(max(k, self.config.dense_candidates), self.size)
        _, dense_rows = search(self.index, vector, wanted, allowed=allowed)
        # Encoded while BM25 runs on its thread, not after: 0.557 → 0.535 ms a Quora
        # question (docs/scale.md, "Where a Quora question spends its time").
        companion = self.companion if self._companion_weight else None
        query = None if companion is None else companion.encoder.encode([text])
        lexical_scores, lexical_rows = lexical.result()
        union = candidate_union(dense_rows, lexical_rows[None])[0]
        union = union[union >= 0]
        distances = self._row_distances(vector, union)
        sims = -distances
        if companion is not None:
            cosines = companion.cosines(query, union[None])[0]
            sims = mixed_one(sims, cosines, self._companion_weight)
        scores, slots = fuse_union_one(sims, union, lexical_scores, lexical_rows, self._weight, k)
        out = _empty(1, k)
        out.rows[0, : slots.size] = union[slots]
        out.distances[0, : slots.size] = distances[slots]
        assert out.scores is not None
        out.scores[0, : slots.size] = scores
        return out


def dense(
    index,
    vectors: np.ndarray,
    k: int,
    *,
    allowed: np.ndarray | None = None,
    exclude: np.ndarray | None = None,
) -> Ranking:
    """The index's top k of each query vector float32 [Q, D] (no scores: the distance
    ranks), over the allowed rows, without the excluded ones (int64 [Q] or [Q, E])."""
    if exclude is None or np.ndim(exclude) == 1:
        distances, rows = search(index, vectors, k, allowed=allowed, exclude=exclude)
        return Ranking(rows, distances)
    extra = np.shape(exclude)[1]
    distances, rows = search(index, vectors, k + extra, allowed=allowed)
    rows, distances = drop_rows(rows, distances, exclude, k)
    return Ranking(rows, np.where(rows >= 0, distances, np.inf).astype(np.float32))


def _empty(q: int, k: int) -> Ranking:
    return Ranking(
        np.full((q, k), -1, np.int64),
        np.full((q, k), np.inf, np.float32),
        np.full((q, k), -np.inf, np.float32),
    )


def _cut(ranking: Ranking, k: int) -> Ranking:
    if ranking.rows.shape[1] <= k:
        return ranking
    scores = None if ranking.scores is None else ranking.scores[:, :k]
    return Ranking(ranking.rows[:, :k], ranking.distances[:, :k], scores, ranking.reranked)


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def lexical_pool() -> ThreadPoolExecutor:
    """One pool per process for the BM25 half of fused searches, shared by every search
    (a reloaded bundle leaves no threads behind), one worker per core."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            workers = max(1, os.cpu_count() or 1)
            _POOL = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="qpr-bm25")
        return _POOL
