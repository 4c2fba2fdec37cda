"""qpr.retrieval.maxscore: the compiled top k prunes long lists, hands its scratch back,
and returns the exhaustive top k with bit-identical scores."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from qpr.retrieval.bm25 import BM25Index
from qpr.retrieval.maxscore import Query, thread_scratch, top_k


def test_maxscore_prunes_long_lists_and_leaves_its_scratch_zeroed() -> None:
    # "rare" in 3 documents, "common" in all 2,000: once the top 2 are known, no document
    # holding "common" alone can reach them, so that list is never read.
    docs = ["rare common"] * 3 + ["common filler"] * 1997
    index = BM25Index.build(docs)
    terms = np.array([index.terms["rare"], index.terms["common"]], np.int64)
    bounds = index.upper_bounds[terms].astype(np.float64)
    question = Query(terms, np.ones(2, np.float32), np.array([bounds.sum(), bounds[1], 0.0]))
    # Query.of orders the terms by their bound, the rare (heavier) word first
    counts = {index.terms["common"]: 1, index.terms["rare"]: 1}
    for got, want in zip(Query.of(counts, index.upper_bounds), question, strict=True):
        assert np.array_equal(got, want)
    scratch = thread_scratch(index.num_docs, len(index.terms))
    scores, rows, pruned_at = top_k(index.postings, question, 2, scratch, worth_pruning=100)
    assert pruned_at == 1 and rows.tolist() == [0, 1]
    assert not scratch.state.any() and (scratch.position == -1).all()
    # the same search unpruned gives the same top 2 with the same float32 scores
    same = top_k(index.postings, question, 2, scratch, worth_pruning=10**9)
    assert same[2] == -1 and np.array_equal(same[0], scores) and np.array_equal(same[1], rows)


# -- exactness against a brute-force scorer ------------------------------------------------


def _brute_force(
    index: BM25Index, question: Query, k: int, exclude_row: int = -1
) -> tuple[np.ndarray, np.ndarray]:
    """Every list added in full, in the question's term order, in float32 (as the kernel
    sums), then the k best by (score desc, row asc), zeros and exclude_row left out."""
    acc = np.zeros(index.num_docs, np.float32)
    for t, times in zip(question.terms, question.repeats, strict=True):
        a, z = index.indptr[t], index.indptr[t + 1]
        acc[index.rows[a:z]] += index.weights[a:z] * times  # rows distinct within a list
    if 0 <= exclude_row < acc.size:
        acc[exclude_row] = 0.0
    rows = np.flatnonzero(acc > 0)
    order = np.lexsort((rows, -acc[rows]))[:k]
    return acc[rows[order]], rows[order].astype(np.int64)


def _random_index(rng: np.random.Generator, num_docs: int, num_terms: int) -> BM25Index:
    """Zipf-like lists (a few over most documents, most a handful long), weights from a
    small set of values so that scores tie often."""
    df = np.clip((num_docs * 0.9 / np.arange(1, num_terms + 1) ** 1.3).astype(int), 1, num_docs)
    indptr = np.zeros(num_terms + 1, np.int64)
    np.cumsum(df, out=indptr[1:])
    rows = np.concatenate([np.sort(rng.choice(num_docs, n, replace=False)) for n in df])
    levels = np.array([0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 4.0], np.float32)
    weights = levels[rng.integers(0, levels.size, rows.size)] * np.float32(
        rng.choice([1.0, 1.1, 1.3])
    )
    terms = {f"t{i}": i for i in range(num_terms)}
    return BM25Index(terms, indptr, rows.astype(np.int32), weights, num_docs)


def _check_scratch(scratch: object) -> None:
    assert not scratch.state.any() and (scratch.position == -1).all()  # type: ignore[attr-defined]


def test_top_k_equals_brute_force_bit_for_bit_on_random_indices() -> None:
    rng = np.random.default_rng(11)
    pruned = 0
    for num_docs, num_terms in ((300, 20), (4000, 60)):
        index = _random_index(rng, num_docs, num_terms)
        scratch = thread_scratch(index.num_docs, len(index.terms))
        for _ in range(60):
            n = int(rng.integers(1, 9))
            # common and rare terms, some repeated (counts > 1)
            picked = rng.integers(0, num_terms, n) if rng.random() < 0.5 else rng.zipf(1.5, n) - 1
            counts: dict[int, int] = {}
            for t in picked.tolist():
                if t < num_terms:
                    counts[t] = counts.get(t, 0) + 1
            if not counts:
                continue
            question = Query.of(counts, index.upper_bounds)
            for k in (1, 2, 7, 50, 100, num_docs + 5):
                exclude = int(rng.integers(-1, num_docs))
                want_s, want_r = _brute_force(index, question, k, exclude)
                for wp in (0, 64, 10**9):
                    scores, rows, stopped = top_k(
                        index.postings, question, k, scratch, exclude_row=exclude, worth_pruning=wp
                    )
                    pruned += stopped >= 0
                    assert scores.dtype == np.float32 and rows.dtype == np.int64
                    assert np.array_equal(scores.view(np.int32), want_s.view(np.int32))
                    assert np.array_equal(rows, want_r), (counts, k, wp)
                    _check_scratch(scratch)
    assert pruned > 100  # the lists skipped in part were skipped exactly


def test_a_term_listed_twice_counts_twice_and_an_empty_question_finds_nothing() -> None:
    rng = np.random.default_rng(5)
    index = _random_index(rng, 2000, 30)
    scratch = thread_scratch(index.num_docs, len(index.terms))
    # a hand-made Query may list a term twice: both times add its weight, in order
    terms = np.array([7, 0, 7, 1], np.int64)
    bounds = index.upper_bounds[terms].astype(np.float64)
    order = np.argsort(-bounds, kind="stable")
    terms = terms[order]
    left = np.append(np.cumsum(bounds[order][::-1])[::-1], 0.0)
    question = Query(terms, np.ones(4, np.float32), left)
    for k in (1, 10, 3000):
        want_s, want_r = _brute_force(index, question, k)
        scores, rows, _ = top_k(index.postings, question, k, scratch, worth_pruning=0)
        assert np.array_equal(scores, want_s) and np.array_equal(rows, want_r)
        _check_scratch(scratch)
    empty = Query(np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(1))
    scores, rows, stopped = top_k(index.postings, empty, 5, scratch, worth_pruning=0)
    assert scores.size == 0 and rows.size == 0 and stopped == -1


def test_top_k_equals_brute_force_on_a_small_scale_corpus(tmp_path: Path) -> None:
    from qpr.data.scale import ScaleSpec, scale_queries, write_scale_corpus
    from qpr.retrieval.indexer import read_texts

    spec = ScaleSpec(20_000, seed=13, shard_rows=10_000)
    shards = write_scale_corpus(spec, tmp_path, log=lambda _: None)
    texts = [t for shard in shards for t in read_texts(shard, "question")]
    index = BM25Index.build(texts, k1=0.9, b=0.75, stemmer="english")
    scratch = thread_scratch(index.num_docs, len(index.terms))
    for text in scale_queries(spec, 150)["question"]:
        counts = Counter(index.query_terms(text).tolist())
        if not counts:
            continue
        question = Query.of(counts, index.upper_bounds)
        for k in (1, 10, 100):
            want_s, want_r = _brute_force(index, question, k)
            scores, rows, _ = top_k(index.postings, question, k, scratch, worth_pruning=256)
            assert np.array_equal(scores.view(np.int32), want_s.view(np.int32)), text
            assert np.array_equal(rows, want_r), text
    _check_scratch(scratch)
