"""qpr.retrieval.maxscore: the compiled top k prunes long lists and hands its scratch back."""

from __future__ import annotations

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
    assert not scratch.acc.any() and not scratch.state.any() and (scratch.position == -1).all()
    # the same search unpruned gives the same top 2 with the same float32 scores
    same = top_k(index.postings, question, 2, scratch, worth_pruning=10**9)
    assert same[2] == -1 and np.array_equal(same[0], scores) and np.array_equal(same[1], rows)
