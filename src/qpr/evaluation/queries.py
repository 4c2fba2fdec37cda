"""The queries of an evaluation and how a system's answers to them are scored.

Every question of a split's clusters is a query; its relevant documents are the other
questions of its cluster (`qpr.evaluation.trec.qrels_from_clusters`). A system's search
output becomes a TREC run scored with trec_eval's measures (`trec_measures`).

Questions added after the logs were clustered (`qpr index add`) and absorbed by a full
build are in the index but in no cluster; `judged_questions` gives each the cluster its
answer leads to, so a hit on it counts as a paraphrase, as it is one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from qpr.evaluation.trec import Qrels, Run, qrels_from_clusters, run_from_search, trec_measures


@dataclass(frozen=True)
class QuerySet:
    """The queries of one split and their relevance judgements."""

    split: str
    query_ids: np.ndarray  # int64 [Q]
    texts: list[str]
    qrels: Qrels


def query_set(questions: pd.DataFrame, split: str) -> QuerySet:
    """Queries = the split's questions; relevant = every other question of the cluster
    (whatever its split: a paraphrase kept out of val/test by the leakage filter is still
    a right answer when it is in the index)."""
    clustered = questions[questions["cluster_id"] >= 0]
    members = clustered.groupby("cluster_id")["question_id"].apply(list).to_dict()
    cluster_of = dict(zip(clustered["question_id"], clustered["cluster_id"], strict=True))
    in_split = questions[questions["split"] == split]
    qrels = qrels_from_clusters(
        in_split["question_id"].tolist(), cluster_of, members, drop_singletons=True
    )
    kept = in_split[in_split["question_id"].astype(str).isin(qrels.keys())]
    return QuerySet(
        split=split,
        query_ids=kept["question_id"].to_numpy(np.int64),
        texts=kept["text"].tolist(),
        qrels=qrels,
    )


def judged_questions(questions: pd.DataFrame, index_questions: pd.DataFrame) -> pd.DataFrame:
    """The questions relevance is judged on: the cluster stage's (question_id, text,
    cluster_id, split), plus each indexed question it does not hold (absorbed from a
    delta) with the cluster whose answer it leads to, and split None.

    index_questions: the index stage's question table (question_id, text, cluster_id,
    answer_id). An answer is a cluster's when the indexed questions of that cluster, and
    of no other, lead to it; a question whose answer is no cluster's keeps cluster -1."""
    known = set(questions["question_id"].tolist())
    extra = index_questions[~index_questions["question_id"].isin(known)]
    if extra.empty or "answer_id" not in index_questions.columns:
        return questions
    clustered = index_questions[
        (index_questions["cluster_id"] >= 0) & index_questions["answer_id"].notna()
    ]
    per_answer = clustered.groupby("answer_id")["cluster_id"].unique()
    cluster_of = {a: int(c[0]) for a, c in per_answer.items() if len(c) == 1}
    added = pd.DataFrame(
        {
            "question_id": extra["question_id"].to_numpy(np.int64),
            "text": extra["text"].tolist(),
            "cluster_id": [cluster_of.get(a, -1) for a in extra["answer_id"].tolist()],
            "split": None,
        }
    )
    return pd.concat([questions, added], ignore_index=True)


@dataclass(frozen=True)
class SearchTask:
    """What a system searches: the index questions (row r is ``index_texts[r]``, question
    ``row_to_qid[r]``), the queries, each query's own row (left out of its results; -1:
    none) and the results kept per query."""

    index_texts: list[str]
    row_to_qid: np.ndarray
    queries: QuerySet
    query_rows: np.ndarray
    k: int


@dataclass(frozen=True)
class SystemResult:
    """One system's answers to a query set: trec_eval measures (mean and per query), its
    run, each query's rank-1 distance (the no-answer threshold's unit) and the time taken."""

    name: str
    summary: dict[str, float]
    per_query: dict[str, dict[str, float]]
    run: Run
    top1: np.ndarray  # float [Q] rank-1 distance (lower = closer); inf when nothing found
    seconds: float


def score_system(
    name: str,
    queries: QuerySet,
    rows: np.ndarray,
    scores: np.ndarray,
    row_to_qid: np.ndarray,
    *,
    higher_is_better: bool,
    seconds: float,
) -> SystemResult:
    """Score a search's (rows, scores) [Q, k] on `queries`: lower scores are better unless
    `higher_is_better` (similarities); top1 is always "lower = closer"."""
    run = run_from_search(
        queries.query_ids, rows, scores, row_to_qid, higher_is_better=higher_is_better
    )
    per_query, summary = trec_measures(queries.qrels, run)
    first = np.where(rows[:, 0] >= 0, scores[:, 0], np.inf if not higher_is_better else -np.inf)
    top1 = -first if higher_is_better else first
    return SystemResult(name, summary, per_query, run, top1.astype(np.float64), seconds)
