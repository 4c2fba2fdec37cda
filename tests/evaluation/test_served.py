"""The pure parts of `qpr.evaluation.served`: which questions have no paraphrase, and a
query's own question dropped from its served hits."""

from __future__ import annotations

import pandas as pd

from qpr.evaluation.served import singleton_queries


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
