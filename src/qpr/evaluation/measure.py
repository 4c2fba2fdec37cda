"""The served system measured on the validation and test splits: what the evaluate stage
reports and the "no answer" threshold is chosen from.

Each split's queries are encoded as `Bundle.search` encodes them and searched with their
own question excluded: the dense ranking alone ("dense"), then, with BM25, the fusion
weight α and the served depth tuned on val (`qpr.evaluation.fusion_tuning`), then both
splits through the served ranking itself (`qpr.retrieval.hybrid.HybridSearch`, re-ranker
included: "model") and BM25 alone ("lexical", α = 0). A seeded share of each split's
clusters is then searched with the whole cluster left out (`qpr.evaluation.no_answer`).
The baselines params ask for run on the test split (`qpr.evaluation.baselines`).

Library code: the stage reads the files and writes the results; progress goes to ``log``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from qpr.artifacts import SearchConfig
from qpr.evaluation.baselines import run_baselines
from qpr.evaluation.fusion_tuning import (
    choose_dense_weight,
    choose_served_depth,
    plot_fusion_curve,
)
from qpr.evaluation.no_answer import (
    Unanswerable,
    cluster_rows,
    held_out_mask,
    query_clusters,
    row_clusters,
)
from qpr.evaluation.queries import QuerySet, SearchTask, SystemResult, query_set, score_system
from qpr.retrieval.dense import exact_twin
from qpr.retrieval.encoders import query_vectors
from qpr.retrieval.hybrid import Candidates, HybridSearch, Ranking, dense, fuse
from qpr.text.spelling import Speller

if TYPE_CHECKING:
    from pathlib import Path

    from qpr.config import Settings
    from qpr.retrieval.bm25 import BM25Index
    from qpr.retrieval.companion import Companion
    from qpr.retrieval.dense import IdMap
    from qpr.retrieval.reranker import Reranker
    from qpr.text.vocab import Vocabulary
    from qpr.text.wordpiece import WordPieceTokenizer

SPLITS = ("val", "test")


@dataclass(frozen=True)
class Served:
    """What the service would search with: the FAISS index and its rows' question ids and
    texts (row order), the query encoder (session, tokenizer, max_len), BM25 when fused
    in, the re-ranker when one is served, the companion when params name one (its weight
    is tuned here)."""

    index: Any
    ids: IdMap
    texts: list[str]
    session: Any
    vocab: Vocabulary | WordPieceTokenizer
    max_len: int
    bm25: BM25Index | None = None
    reranker: Reranker | None = None
    companion: Companion | None = None

    def searcher(self, config: SearchConfig, index: Any = None) -> HybridSearch:
        """The served ranking over this index (or `index`, e.g. its exact twin)."""
        return HybridSearch(
            self.index if index is None else index,
            config,
            bm25=self.bm25,
            texts=self.texts,
            reranker=self.reranker,
            companion=self.companion,
        )


@dataclass(frozen=True)
class Split:
    """One split's queries: their vectors, their own index rows (left out of their
    results), and their dense ranking scored."""

    queries: QuerySet
    vectors: np.ndarray  # float32 [Q, D]
    rows: np.ndarray  # int64 [Q]
    dense: SystemResult


@dataclass(frozen=True)
class Measured:
    """The splits measured: every system's results per split ("model" is the served one),
    the served search config (no threshold yet), the fusion chosen and its served depth
    (None without BM25), and the queries with no paraphrase per split."""

    splits: dict[str, Split]
    results: dict[str, dict[str, SystemResult]]
    config: SearchConfig
    fusion: dict | None
    depth: dict | None
    no_paraphrase: dict[str, Unanswerable]


def measure_served(
    served: Served,
    questions: pd.DataFrame,
    base: SearchConfig,
    settings: Settings,
    plot: Path,
    log: Callable[[str], None],
) -> Measured:
    """Val and test measured as served (module docstring). questions: those relevance is
    judged on (`qpr.evaluation.queries.judged_questions`); base: the search config without
    fusion; plot: where the fusion curve goes.

    Searches first, scores after: each step asks retrieval for every ranking it needs,
    then judges them."""
    k = settings.evaluate.k
    asked = {name: query_set(questions, name) for name in SPLITS}
    queries = as_searched(served, asked, base)
    if base.spelling:
        changed = sum(
            a != b for n in SPLITS for a, b in zip(asked[n].texts, queries[n].texts, strict=True)
        )
        log(f"spelling: {changed:,} queries corrected against the index's words")
    held = held_out(queries, questions, served.ids, settings)
    splits = dense_splits(served, queries, k)
    fusion = depth = None
    config = base
    if served.bm25 is not None:
        fusion, depth = tune_fusion(served, splits["val"], base, settings, plot, log)
        config = fused_config(
            base, settings, fusion["dense_weight"], depth, fusion.get("companion_weight")
        )
    searcher = served.searcher(config)
    rankings, seconds = served_rankings(searcher, splits, held, k)
    results = {name: {split.dense.name: split.dense} for name, split in splits.items()}
    for name, ranked in rankings.items():
        for system in ("model", "lexical"):
            if system in ranked:
                result = ranked_result(system, splits[name].queries, ranked[system], served.ids)
                results[name][system] = result
        results[name]["model"] = replace(results[name]["model"], seconds=seconds[name])
    if fusion is not None:
        _log_fusion(fusion, results, log)
    else:
        plot_fusion_curve({}, None, plot)
    # The baselines see the queries as asked: BM25 alone is BM25 as a user would run it.
    results["test"].update(baselines(served, asked["test"], settings, log))
    no_paraphrase = {
        name: unanswerable(held[name][0], rankings[name]["no_paraphrase"]) for name in SPLITS
    }
    return Measured(splits, results, config, fusion, depth, no_paraphrase)


def as_searched(
    served: Served, queries: dict[str, QuerySet], base: SearchConfig
) -> dict[str, QuerySet]:
    """The queries as the bundle searches them (`Bundle.search_batch`): spelling corrected
    against the index's words when `base.spelling` is on, else as asked."""
    if not base.spelling:
        return queries
    speller = Speller.from_texts(served.texts)
    return {n: replace(q, texts=speller.correct_all(q.texts)) for n, q in queries.items()}


def baselines(
    served: Served, queries: QuerySet, settings: Settings, log: Callable[[str], None]
) -> dict[str, SystemResult]:
    """The baselines params ask for (evaluate.baselines), on the same queries and the same
    index questions."""
    task = SearchTask(
        index_texts=served.texts,
        row_to_qid=served.ids.qids,
        queries=queries,
        query_rows=served.ids.to_rows(queries.query_ids),
        k=settings.evaluate.k,
    )
    return run_baselines(
        settings.evaluate.baselines, task, settings, served.vocab, max_len=served.max_len, log=log
    )


def dense_splits(served: Served, queries: dict[str, QuerySet], k: int) -> dict[str, Split]:
    """Each split's query vectors and its dense top k (each query excluded from its own
    results), scored."""
    found = {}
    for name, split in queries.items():
        started = time.perf_counter()
        query_rows = served.ids.to_rows(split.query_ids)
        vectors = query_vectors(served.session, served.vocab, split.texts, max_len=served.max_len)
        ranking = dense(served.index, vectors, k, exclude=query_rows)
        found[name] = (query_rows, vectors, ranking, time.perf_counter() - started)
    out = {}
    for name, (query_rows, vectors, ranking, seconds) in found.items():
        result = score_system(
            "dense" if served.bm25 is not None else "model",
            queries[name],
            ranking.rows,
            ranking.distances,
            served.ids.qids,
            higher_is_better=False,
            seconds=seconds,
        )
        out[name] = Split(queries[name], vectors, query_rows, result)
    return out


def fused_config(
    base: SearchConfig,
    settings: Settings,
    dense_weight: float,
    depth: dict | None = None,
    companion_weight: float | None = None,
) -> SearchConfig:
    """`base` fusing BM25 in at α = dense_weight: BM25's max(k, candidates), the index's
    dense_candidates, and the served depth of the fused searches when chosen; params'
    companion mixed in at companion_weight when that is above 0."""
    lexical, k = settings.index.lexical, settings.evaluate.k
    depth = depth or {}
    mixes = bool(companion_weight)
    return replace(
        base,
        dense_weight=dense_weight,
        lexical_candidates=max(k, lexical.candidates),
        dense_candidates=lexical.dense_candidates,
        fused_nprobe=depth.get("nprobe") or None,
        fused_ef_search=depth.get("ef_search") or None,
        companion=settings.index.companion if mixes else None,
        companion_weight=companion_weight if mixes else None,
    )


def tune_fusion(
    served: Served,
    val: Split,
    base: SearchConfig,
    settings: Settings,
    plot: Path,
    log: Callable[[str], None],
) -> tuple[dict, dict]:
    """(the fusion chosen on val: α and its curve, the served search depth). α is the
    model's, not the index's: chosen over an exact dense search; then the fewest lists
    that reproduce that ranking closely enough are served (and set on the index)."""
    lexical, k = settings.index.lexical, settings.evaluate.k
    exact, served_candidates = fusion_candidates(served, val, base, settings)
    companion_weights = (0.0,) if served.companion is None else settings.index.companion_weights
    fusion = choose_dense_weight(
        exact,
        lexical.dense_weights,
        val.queries,
        served.ids.qids,
        k,
        plot,
        companion_weights,
        rule=lexical.rule,
    )
    if served.companion is not None:
        log(f"companion {settings.index.companion}: weight {fusion['companion_weight']} chosen "
            f"on val (P@1 by weight: {fusion['val_success_1_by_companion']})")  # fmt: skip
    depth = choose_served_depth(
        served.index,
        exact,
        served_candidates,
        fusion["dense_weight"],
        k,
        lexical.served_recall,
        log=log,
        companion_weight=fusion.get("companion_weight") or 0.0,
    )
    probing = "".join(
        f"fused searches at {knob} {depth[knob]} (the dense ranking alone "
        f"{getattr(settings.index, knob)}): "
        for knob in ("nprobe", "ef_search")
        if depth[knob] is not None
    )
    log(
        f"{probing}served recall@{k} {depth['recall']:.4f} against an exact dense search"
        + ("" if depth["reached"] else f", BELOW the target {depth['target']}")
    )
    return fusion, depth


def fusion_candidates(
    served: Served, split: Split, base: SearchConfig, settings: Settings, exact_index: Any = None
) -> tuple[Candidates, Callable[[], Candidates]]:
    """A split's candidates for tuning the fusion (`HybridSearch.candidates`, each query's
    own row left out): found over the index's exact twin, and a function that finds them
    over the served index at the depth it is set to when called. Neither depends on α,
    and BM25's top k is searched once for both. exact_index: that twin when the caller
    keeps one across calls (`exact_twin` copies every vector); None: built here."""
    k = settings.evaluate.k
    probe = fused_config(base, settings, 1.0)
    searcher = served.searcher(probe)
    texts, vectors, rows = split.queries.texts, split.vectors, split.rows
    bm25 = searcher.lexical(texts, k, exclude=rows)
    twin = exact_twin(served.index) if exact_index is None else exact_index
    exact = served.searcher(probe, twin).candidates(texts, vectors, k, exclude=rows, lexical=bm25)
    return exact, lambda: searcher.candidates(texts, vectors, k, exclude=rows, lexical=bm25)


def ranked_result(name: str, queries: QuerySet, ranking: Ranking, ids: IdMap) -> SystemResult:
    """A ranking scored: by the fused score, or by rank once re-ranked (a re-ranked hit
    keeps its first-stage score, and trec_eval orders by score); top1 is the rank-1
    distance, the threshold's unit."""
    scores = ranking.scores
    if ranking.reranked or scores is None:
        ranks = np.arange(ranking.rows.shape[1], 0, -1, dtype=np.float32)
        scores = np.where(ranking.rows >= 0, ranks[None], -np.inf).astype(np.float32)
    result = score_system(
        name, queries, ranking.rows, scores, ids.qids, higher_is_better=True, seconds=0.0
    )
    top1 = np.where(ranking.rows[:, 0] >= 0, ranking.distances[:, 0], np.inf)
    return replace(result, top1=top1.astype(np.float64))


def served_rankings(
    searcher: HybridSearch,
    splits: dict[str, Split],
    held: dict[str, tuple[np.ndarray, np.ndarray]],
    k: int,
) -> tuple[dict[str, dict[str, Ranking]], dict[str, float]]:
    """Per split, the served ranking ("model": `HybridSearch.rank`'s steps, each query's
    own row excluded), with BM25 the bundle's BM25 alone ("lexical", α = 0), and the
    top 1 of the held-out queries with their whole cluster left out ("no_paraphrase");
    and the seconds each split's served search took (both retrievers and the fusion)."""
    out: dict[str, dict[str, Ranking]] = {}
    seconds: dict[str, float] = {}
    for name, split in splits.items():
        started = time.perf_counter()
        texts = split.queries.texts
        if searcher.bm25 is None:
            model = searcher.rank(texts, lambda s=split: s.vectors, k, exclude=split.rows)
            out[name] = {"model": model}
        else:
            # rank() in its two steps, to keep the candidates for BM25 alone.
            found = searcher.candidates(texts, split.vectors, k, exclude=split.rows)
            config = searcher.config
            first = fuse(
                found, config.dense_weight, searcher.depth(k), config.companion_weight or 0
            )
            # α = 0: the bundle's own BM25 (its stemming, k1, b) alone, an honest baseline
            # for what the encoder adds.
            lexical = fuse(found, 0.0, k)
            out[name] = {"model": searcher.reranked(texts, first, k), "lexical": lexical}
        seconds[name] = split.dense.seconds + time.perf_counter() - started
        mask, own = held[name]
        held_texts = [t for t, h in zip(texts, mask, strict=True) if h]
        vectors = split.vectors[mask]
        out[name]["no_paraphrase"] = searcher.rank(held_texts, lambda v=vectors: v, 1, exclude=own)
    return out, seconds


def held_out(
    queries: dict[str, QuerySet], questions: pd.DataFrame, ids: IdMap, settings: Settings
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per split, (bool [Q] the queries of a seeded share of its clusters, int64 [H, E]
    each held-out query's cluster rows): searched as served with the cluster gone from
    the index (`qpr.evaluation.no_answer`), their rank-1 distances are what the threshold
    sees for a question with no paraphrase."""
    row_cluster = row_clusters(ids.qids, questions)
    clustered = questions[questions["cluster_id"] >= 0]
    extra = int(clustered.groupby("cluster_id").size().max())  # the largest cluster
    share = settings.evaluate.no_paraphrase_share
    out = {}
    for position, (name, split) in enumerate(queries.items()):
        clusters = query_clusters(split, questions)
        mask = held_out_mask(clusters, share, settings.seed + position)
        out[name] = (mask, cluster_rows(clusters[mask], row_cluster, extra))
    return out


def unanswerable(mask: np.ndarray, ranking: Ranking) -> Unanswerable:
    """The held-out queries' (bool [Q] mask) served rank-1 distances, inf where nothing
    is left."""
    top1 = np.full(mask.shape, np.inf)
    top1[mask] = np.where(ranking.rows[:, 0] >= 0, ranking.distances[:, 0], np.inf)
    return Unanswerable(mask, top1)


def _log_fusion(
    fusion: dict, results: dict[str, dict[str, SystemResult]], log: Callable[[str], None]
) -> None:
    log(
        f"fusion with BM25 (α = dense weight, chosen on val over an exact dense search): "
        f"α {fusion['dense_weight']:g}, val success@1 "
        f"{fusion['val_success_1'][str(fusion['dense_weight'])]:.4f} there, "
        f"{results['val']['model'].summary['success_1']:.4f} as served, against "
        f"{results['val']['dense'].summary['success_1']:.4f} dense alone"
    )
    best = fusion["best"]
    if fusion["rule"] != "one_se":
        return
    chosen = (fusion["dense_weight"], fusion.get("companion_weight") or 0.0)
    if chosen == (best["dense_weight"], best["companion_weight"]):
        log("fusion rule one_se: the best is served (none within one paired standard error of "
            "it leans less on the trained encoder)")  # fmt: skip
    else:
        log(
            f"fusion rule one_se: the best val success@1 was {best['val_success_1']:.4f} at "
            f"α {best['dense_weight']:g}, companion {best['companion_weight']:g}; served: "
            f"α {chosen[0]:g}, companion {chosen[1]:g}, within one paired standard error "
            f"({fusion['standard_error']:.4f}) and leaning less on the trained encoder"
        )
