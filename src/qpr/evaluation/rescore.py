"""Score a finished bundle on a query set, the way every bundle is scored when two are
compared: the register stage re-scores the champion on the challenger's validation queries
so that the promotion decision compares two numbers measured alike (same queries, same
protocol), never a recorded number of another split or another data set.

Protocol: each query searches the whole index through the bundle's own search (its encoder,
fusion and re-ranker as served), with no "no answer" cut; its own question is left out of
its hits when the index holds it; relevant = the other questions of its cluster.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from qpr.evaluation.queries import QuerySet
from qpr.evaluation.trec import Run, trec_measures


class _Hit(Protocol):
    question_id: int
    score: float


class _Result(Protocol):
    hits: Sequence[_Hit]


class Searcher(Protocol):
    """What is scored: `qpr.retrieval.bundle.Bundle` (search_batch)."""

    def search_batch(
        self, questions: Sequence[str], k: int = 10, *, threshold: float | None = None
    ) -> Sequence[_Result]: ...


def rescore(searcher: Searcher, queries: QuerySet, k: int = 10) -> dict[str, float]:
    """trec_eval measures (means over the queries) of `searcher` on `queries`."""
    results = searcher.search_batch(queries.texts, k + 1, threshold=math.inf)
    run: Run = {}
    for qid, result in zip(queries.query_ids, results, strict=True):
        # k + 1 asked for: the query's own question, when indexed, is dropped from its hits.
        hits = [h for h in result.hits if int(h.question_id) != int(qid)][:k]
        run[str(int(qid))] = [(str(int(h.question_id)), float(h.score)) for h in hits]
    _, summary = trec_measures(queries.qrels, run)
    return summary
