"""The pure parts of `qpr.evaluation.served`: which questions have no paraphrase, and a
query's own question dropped from its served hits."""

from __future__ import annotations

import numpy as np
import pandas as pd

from qpr.evaluation.served import _own_dropped, singleton_queries
from qpr.retrieval.bundle import Hit, SearchResult


def test_singleton_queries_are_the_questions_with_no_paraphrase() -> None:
    questions = pd.DataFrame(
        {
            "question_id": [1, 2, 3, 4, 5, 6],
            "text": ["a b", "a c", "lonely", "no cluster", "same text", "same text!"],
            "norm_key": ["a b", "a c", "lonely", "no cluster", "same text", "same text"],
            "cluster_id": [10, 10, 11, -1, 12, 13],
        }
    )
    chosen = singleton_queries(questions, seed=0)
    # 1 and 2 share a cluster; 5 and 6 are one text under two ids (each the other's copy).
    assert chosen.query_ids.tolist() == [3, 4]
    assert chosen.texts == ["lonely", "no cluster"] and chosen.qrels == {}
    sample = singleton_queries(questions, seed=0, limit=1)
    assert len(sample.query_ids) == 1 and sample.query_ids[0] in (3, 4)


def test_own_question_is_dropped_and_k_kept() -> None:
    def hit(qid: int, distance: float) -> Hit:
        return Hit(question_id=qid, text="", cluster_id=-1, distance=distance, score=0.0)

    results = [
        SearchResult("q1", [hit(1, 0.0), hit(2, 0.5), hit(3, 0.7)], answered=True),
        SearchResult("q9", [hit(2, 0.2), hit(3, 0.4), hit(4, 0.9)], answered=True),
    ]
    kept = _own_dropped(results, np.asarray([1, 9]), k=2)
    assert [[h.question_id for h in hits] for hits in kept] == [[2, 3], [2, 3]]
