"""A bundle measured as the service serves it, on another data set's questions.

`served_bundle` gives the bundle's own query encoder, search config (threshold, fusion
weight α, candidate depths, nprobe / efSearch) and re-ranker a new set of questions: an
index of the file's questions built like the index stage's (params' index.factory, fitted
to the file's size) and, when the bundle fuses, a BM25 built with the bundle's own BM25
settings (k1, b, stemmer). Every query then goes through `Bundle.search_batch`, the code
the service runs (`served_system`).

Each query leaves its own question out of the search (`Bundle.search_batch`'s
``exclude``), as the evaluate stage does: the question is not among either retriever's
candidates, so the fusion's scaling is that of an index without it. "answered" is judged
on the first hit, against the bundle's threshold.

Library code: no Prefect or MLflow here; progress goes to the ``log`` callable.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from qpr.evaluation.queries import QuerySet, SearchTask, SystemResult, score_system

if TYPE_CHECKING:
    from qpr.config import Settings
    from qpr.retrieval.bm25 import BM25Index
    from qpr.retrieval.bundle import Bundle

__all__ = [
    "TIMED_QUERIES",
    "UNANSWERABLE_MAX",
    "bm25_settings",
    "lexical_system",
    "median_ms",
    "served_bundle",
    "served_system",
    "served_top1_without_cluster",
    "singleton_queries",
]

# Queries timed one at a time (the service's one question per request) for p50 latency.
TIMED_QUERIES = 200
# Questions with no paraphrase searched for false answers, at most (a seeded sample).
UNANSWERABLE_MAX = 5_000
_CHUNK = 2_000  # queries per search_batch call: a progress line each


def bm25_settings(bundle: Bundle, settings: Settings) -> dict[str, Any]:
    """The BM25 the served system fuses: the bundle's own (k1, b, stemmer) when it has
    one, else params' index.lexical (then it is the "BM25 alone" row only)."""
    if bundle.bm25 is not None:
        return dict(bundle.bm25.settings)
    lexical = settings.index.lexical
    out: dict[str, Any] = {"stemmer": lexical.stemmer, "k1": lexical.k1, "b": lexical.b}
    if lexical.analyzer != "words":  # as BM25Index.settings records it
        out.update(analyzer=lexical.analyzer, ngram=lexical.ngram)
    return out


def served_bundle(
    base: Bundle,
    settings: Settings,
    vectors: np.ndarray,
    corpus: pd.DataFrame,
    bm25: BM25Index,
    log: Callable[[str], None],
) -> tuple[Bundle, dict[str, Any]]:
    """(`base` over the corpus's questions, what its index is: results.json's
    "served_index"). corpus: question_id, text, cluster_id (row r = vectors[r])."""
    from qpr.retrieval.bundle import IndexedQuestions
    from qpr.retrieval.dense import (
        IndexConfig,
        build_index,
        ef_search_of,
        fit_factory,
        set_ef_search,
        set_nprobe,
        use_per_query_scan,
    )

    factory = settings.index.factory
    index = build_index(
        vectors,
        IndexConfig.from_settings(settings.index, factory=factory),
        seed=settings.seed,
        log=log,
    )
    use_per_query_scan(index)
    # The depth the bundle's evaluation chose, as Bundle.load sets it.
    nprobe, ef_search = base.search_config.depth()
    if nprobe is not None:
        set_nprobe(index, nprobe)
    if ef_search is not None:
        set_ef_search(index, ef_search)
    questions = IndexedQuestions(
        index=index,
        qids=corpus["question_id"].to_numpy(np.int64),
        texts=corpus["text"].tolist(),
        cluster_ids=corpus["cluster_id"].to_numpy(np.int64),
        bm25=bm25 if base.search_config.fused else None,
    )
    served = base.with_questions(questions)
    fitted, _ = fit_factory(factory, *vectors.shape)
    return served, {
        "factory": fitted,
        "nprobe": served.nprobe,
        "ef_search": ef_search_of(index),
        "fusion": base.search_config.fusion,
        "bm25": bm25_settings(base, settings) if base.search_config.fused else None,
        "rerank_top": base.search_config.rerank_top,
        "threshold": base.search_config.threshold,
    }


def _search_without_self(
    bundle: Bundle, texts: list[str], own: np.ndarray, k: int, log: Callable[[str], None]
) -> list[list[Any]]:
    """The served hits of each query, its own question left out (module docstring)."""
    out: list[list[Any]] = []
    started = time.perf_counter()
    for lo in range(0, len(texts), _CHUNK):
        # threshold inf: every hit comes back; the threshold is applied by the caller.
        chunk = own[lo : lo + _CHUNK].tolist()
        results = bundle.search_batch(texts[lo : lo + _CHUNK], k, threshold=math.inf, exclude=chunk)
        out.extend(result.hits for result in results)
        rate = len(out) / max(time.perf_counter() - started, 1e-9)
        log(f"served: {len(out):,} / {len(texts):,} queries, top {k} ({rate:,.0f}/s)")
    return out


def served_system(bundle: Bundle, task: SearchTask, log: Callable[[str], None]) -> SystemResult:
    """The served system's measures on `task`'s queries; its top1 holds the first hit's
    distance (the threshold's unit) once the query's own question is dropped."""
    from qpr.retrieval.dense import IdMap

    started = time.perf_counter()
    queries = task.queries
    hits = _search_without_self(bundle, queries.texts, queries.query_ids, task.k, log)
    ids = IdMap(np.asarray(task.row_to_qid, np.int64))
    rows = np.full((len(hits), task.k), -1, np.int64)
    top1 = np.full(len(hits), np.inf)
    for i, found in enumerate(hits):
        if not found:
            continue
        rows[i, : len(found)] = ids.to_rows(np.asarray([h.question_id for h in found], np.int64))
        top1[i] = found[0].distance
    # Scored by rank: a re-ranked hit keeps its first-stage score, so the score need not
    # fall with the rank, and trec_eval orders by score.
    ranks = np.broadcast_to(np.arange(task.k, 0, -1, dtype=np.float32), rows.shape)
    result = score_system(
        "served",
        queries,
        rows,
        np.where(rows >= 0, ranks, -np.inf),
        task.row_to_qid,
        higher_is_better=True,
        seconds=time.perf_counter() - started,
    )
    return replace(result, top1=top1)


def served_top1(
    bundle: Bundle, texts: list[str], own: np.ndarray, log: Callable[[str], None]
) -> np.ndarray:
    """float64 [U] the served first hit's distance of each question, itself left out."""
    hits = _search_without_self(bundle, texts, own, 1, log)
    return np.asarray([h[0].distance if h else np.inf for h in hits], np.float64)


def served_top1_without_cluster(
    bundle: Bundle,
    queries: QuerySet,
    clusters: np.ndarray,
    depth: int,
    log: Callable[[str], None],
) -> np.ndarray:
    """float64 [Q] each query's served first hit outside its own cluster (int64 [Q]
    `clusters`), itself left out: the search of an index without its answer. Searched
    `depth` deep (more than the largest cluster's size); inf when every hit within it is
    of the query's own cluster. A bundle's hits carry the file's cluster ids
    (`served_bundle`)."""
    hits = _search_without_self(bundle, queries.texts, queries.query_ids, depth, log)
    own = np.asarray(clusters, np.int64)
    out = np.full(len(hits), np.inf)
    for i, found in enumerate(hits):
        other = next((h.distance for h in found if h.cluster_id != own[i]), None)
        if other is not None:
            out[i] = other
    return out


def lexical_system(bm25: BM25Index, task: SearchTask, log: Callable[[str], None]) -> SystemResult:
    """BM25 alone (the served system's BM25 settings), each query's own row excluded."""
    from qpr.retrieval.bm25 import lexical_search

    started = time.perf_counter()
    scores, rows = lexical_search(
        bm25, task.queries.texts, task.k, exclude_rows=np.asarray(task.query_rows, np.int64)
    )
    log(f"BM25 alone: {len(rows):,} queries, top {task.k}")
    result = score_system(
        "bm25_alone",
        task.queries,
        rows,
        scores,
        task.row_to_qid,
        higher_is_better=True,
        seconds=time.perf_counter() - started,
    )
    # BM25 scores are not distances: no threshold applies to this row.
    return replace(result, top1=np.full(len(rows), np.nan))


def median_ms(search: Callable[[str], object], texts: Sequence[str]) -> float | None:
    """p50 wall time of `search` on each of the first `TIMED_QUERIES` texts, one call a
    text (as the service gets them), in milliseconds; None without texts.

    FAISS runs on one OpenMP thread meanwhile, the service's default (serve
    faiss_threads): with every core, a one-question IVF search wakes threads that spin
    and took 40 ms instead of 0.6 ms on 2 shared cores."""
    from qpr.retrieval.dense import faiss_threads

    times = []
    with faiss_threads(1):
        for text in list(texts)[:TIMED_QUERIES]:
            started = time.perf_counter()
            search(text)
            times.append((time.perf_counter() - started) * 1000.0)
    return statistics.median(times) if times else None


def singleton_queries(
    questions: pd.DataFrame, seed: int, limit: int = UNANSWERABLE_MAX
) -> QuerySet:
    """The file's questions with no paraphrase in it: alone in their cluster (or in none),
    their normalised text not shared with another question; a seeded sample of at most
    `limit`. Any answer they get (themselves left out) is a false answer."""
    sizes = questions.groupby("cluster_id")["question_id"].transform("size")
    alone = (questions["cluster_id"] < 0) | (sizes == 1)
    alone &= ~questions["norm_key"].duplicated(keep=False)
    chosen = questions[alone.to_numpy()]
    if len(chosen) > limit:
        chosen = chosen.sample(n=limit, random_state=seed).sort_index()
    return QuerySet(
        split="no-paraphrase",
        query_ids=chosen["question_id"].to_numpy(np.int64),
        texts=chosen["text"].tolist(),
        qrels={},
    )
