"""The evaluate stage: TREC-style evaluation of the trained system and of baselines.

Every question of a split's clusters is a query; its relevant documents are the other
questions of its cluster (a question the index absorbed from a delta counts by its
answer, `qpr.evaluation.queries.judged_questions`); it searches the full index with
itself excluded; top k kept. Measures are trec_eval's (pytrec_eval), a query that
retrieves nothing counts as a miss. With BM25 in the bundle, the fusion weight and how
deep fused searches go are chosen on the validation split (`qpr.evaluation.fusion_tuning`).
Val and test are then measured through the served ranking itself
(`qpr.retrieval.hybrid.HybridSearch.rank`, the call `Bundle.search` makes), re-ranker and
query student included: ``metrics.json`` describes what the service serves. The "no
answer" threshold is chosen on the validation split and reported on test
(`qpr.evaluation.threshold`); a seeded share of each split's clusters is held out to make
queries with no paraphrase, which it must refuse (`qpr.evaluation.no_answer`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from qpr.artifacts import (
    RERANK_MODEL_FILE,
    SearchConfig,
    detect_query_encoder,
    served_query_encoder,
)
from qpr.config import Settings
from qpr.evaluation.baselines import run_baselines, untrained_description
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
    top1_without_cluster,
)
from qpr.evaluation.queries import (
    QuerySet,
    SearchTask,
    SystemResult,
    judged_questions,
    query_set,
    score_system,
)
from qpr.evaluation.threshold import threshold_report
from qpr.evaluation.trec import MEASURE_LABELS, format_table, write_qrels, write_run
from qpr.io import write_text_atomic
from qpr.paths import ProjectPaths
from qpr.pipeline.handoff import (
    load_bm25,
    load_index_bundle,
    read_cluster_outputs,
    require_exported_encoder,
)
from qpr.quality.checks import Check, require
from qpr.retrieval.hybrid import HybridSearch, Ranking, fuse
from qpr.text import load_tokenizer

if TYPE_CHECKING:
    from qpr.retrieval.bm25 import BM25Index
    from qpr.retrieval.dense import IdMap
    from qpr.retrieval.reranker import Reranker
    from qpr.text.vocab import Vocabulary
    from qpr.text.wordpiece import WordPieceTokenizer

SPLITS = ("val", "test")


@dataclass(frozen=True)
class _Inputs:
    """What the stage reads: the index with its questions, the questions relevance is
    judged on, the encoder queries go through (and its tokenizer), the bundle's BM25 when
    enabled, the re-ranker when one was trained and enabled."""

    index: Any
    ids: IdMap
    index_questions: pd.DataFrame
    questions: pd.DataFrame
    vocab: Vocabulary | WordPieceTokenizer
    session: Any
    max_len: int
    bm25: BM25Index | None
    reranker: Reranker | None = None


@dataclass(frozen=True)
class _Split:
    """One split's queries: their vectors (the served query encoder's), their own index
    rows (left out of their results), and their dense ranking scored."""

    queries: QuerySet
    vectors: np.ndarray  # float32 [Q, D]
    rows: np.ndarray  # int64 [Q]
    dense: SystemResult


def search_config(
    paths: ProjectPaths,
    settings: Settings,
    threshold: float | None,
    val_share: float | None,
    fusion: dict[str, float | int] | None = None,
) -> SearchConfig:
    """models/search.json's content (qpr.artifacts.SearchConfig): how the service searches,
    as evaluated here: the no-answer threshold chosen on the validation split, the
    dense-only depth searched with (index.nprobe / index.ef_search) and, when BM25 is fused
    in, the dense weight α, BM25's candidates, the index's (`dense_candidates`) and how deep
    fused searches go (`nprobe` or `ef_search` of `fusion`); the re-ranker's depth when
    the rerank stage trained one. It declares the query encoder the figures were measured
    with (`qpr.artifacts.detect_query_encoder`: the student stage's, else the index
    stage's int8 one, else encoder.onnx); loaders serve that one."""
    fused = (
        {}
        if fusion is None
        else {
            "dense_weight": fusion["dense_weight"],
            "lexical_candidates": fusion["candidates"],
            "dense_candidates": fusion["dense_candidates"],
            "fused_nprobe": fusion.get("nprobe"),
            "fused_ef_search": fusion.get("ef_search"),
        }
    )
    trained = (paths.models_dir / RERANK_MODEL_FILE).is_file()
    return SearchConfig(
        threshold=threshold,
        target_precision=settings.evaluate.target_precision,
        val_answered_share=val_share,
        nprobe=settings.index.nprobe,
        ef_search=settings.index.ef_search,
        rerank_top=settings.rerank.top if settings.rerank.enabled and trained else None,
        query_encoder=detect_query_encoder(paths.models_dir),
        **fused,
    )


def write_search_config(
    paths: ProjectPaths,
    settings: Settings,
    threshold: float | None,
    val_share: float | None,
    fusion: dict[str, float | int] | None = None,
) -> Path:
    """models/search.json: `search_config`, written for the service."""
    return search_config(paths, settings, threshold, val_share, fusion).write(paths.models_dir)


def _read_inputs(settings: Settings, paths: ProjectPaths, log: Callable[[str], None]) -> _Inputs:
    """Everything the stage reads, through the hand-off module; the index searched at
    params' depth (index.nprobe / index.ef_search)."""
    from qpr.retrieval.encoders import load_session, onnx_max_len

    require_exported_encoder(paths)
    index, ids, index_questions = load_index_bundle(
        paths, nprobe=settings.index.nprobe, ef_search=settings.index.ef_search
    )
    questions, _ = read_cluster_outputs(paths)
    vocab = load_tokenizer(paths.vocab)
    # Queries go through the encoder the service runs: the int8 one or the query student
    # when the bundle has it.
    query_encoder = served_query_encoder(paths.models_dir)
    session = load_session(query_encoder, threads=settings.index.threads)
    if query_encoder != paths.encoder_onnx:
        log(f"queries encoded by {query_encoder} against the index vectors of {paths.encoder_onnx}")
    max_len = onnx_max_len(session)
    bm25 = load_bm25(paths) if settings.index.lexical.enabled else None
    return _Inputs(
        index,
        ids,
        index_questions,
        judged_questions(questions, index_questions),
        vocab,
        session,
        max_len,
        bm25,
        _reranker(settings, paths),
    )


def _reranker(settings: Settings, paths: ProjectPaths) -> Reranker | None:
    """The re-ranker the service will load: the rerank stage's, when enabled and trained."""
    from qpr.retrieval.reranker import Reranker

    if not (settings.rerank.enabled and (paths.models_dir / RERANK_MODEL_FILE).is_file()):
        return None
    return Reranker.load(paths.models_dir, threads=settings.index.threads)


def _query_vectors(inputs: _Inputs, texts: list[str]) -> np.ndarray:
    """float32 [Q, D]: the texts as `Bundle.search` encodes them (the same tokens, cut to
    max_len, through the same chunked ONNX calls)."""
    from qpr.retrieval.encoders import embed_sequences, embedding_dim

    sequences = [inputs.vocab.encode(text)[: inputs.max_len] for text in texts]
    if not sequences:
        return np.empty((0, embedding_dim(inputs.session)), np.float32)
    return embed_sequences(
        inputs.session, sequences, max_len=inputs.max_len, dim=embedding_dim(inputs.session)
    )


def _search_split(inputs: _Inputs, queries: QuerySet, k: int) -> _Split:
    """The split's query vectors and its dense top k (each query excluded from its own
    results), scored."""
    from qpr.retrieval.hybrid import dense

    query_rows = inputs.ids.to_rows(queries.query_ids)
    started = time.perf_counter()
    vectors = _query_vectors(inputs, queries.texts)
    ranking = dense(inputs.index, vectors, k, exclude=query_rows)
    result = score_system(
        "dense" if inputs.bm25 is not None else "model",
        queries,
        ranking.rows,
        ranking.distances,
        inputs.ids.qids,
        higher_is_better=False,
        seconds=time.perf_counter() - started,
    )
    return _Split(queries, vectors, query_rows, result)


def _searcher(inputs: _Inputs, config: SearchConfig, index: Any = None) -> HybridSearch:
    """The served ranking over the stage's index (or `index`, e.g. its exact twin)."""
    return HybridSearch(
        inputs.index if index is None else index,
        config,
        bm25=inputs.bm25,
        texts=inputs.index_questions["text"].tolist(),
        reranker=inputs.reranker,
    )


def _tune_fusion(
    settings: Settings,
    paths: ProjectPaths,
    inputs: _Inputs,
    val: _Split,
    log: Callable[[str], None],
) -> tuple[dict, dict]:
    """(the fusion chosen on val: α and its curve, the served search depth). α is the
    model's, not the index's: chosen over an exact dense search; then the fewest lists
    that reproduce that ranking closely enough are served (and set on the index)."""
    from qpr.retrieval.dense import exact_twin

    lexical, k = settings.index.lexical, settings.evaluate.k
    # Any α: step 1 (the candidates) does not depend on it.
    probe = search_config(paths, settings, None, None, _fused_config(settings, {"dense_weight": 1}))
    served = _searcher(inputs, probe)
    bm25 = served.lexical(val.queries.texts, k, exclude=val.rows)
    exact = _searcher(inputs, probe, exact_twin(inputs.index)).candidates(
        val.queries.texts, val.vectors, k, exclude=val.rows, lexical=bm25
    )
    plot = paths.plots_dir / "evaluate" / "fusion.png"
    fusion = choose_dense_weight(
        exact, lexical.dense_weights, val.queries, inputs.ids.qids, k, plot
    )
    depth = choose_served_depth(
        inputs.index,
        exact,
        lambda: served.candidates(
            val.queries.texts, val.vectors, k, exclude=val.rows, lexical=bm25
        ),
        fusion["dense_weight"],
        k,
        lexical.served_recall,
        log=log,
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


def _fused_config(settings: Settings, fusion: dict[str, Any]) -> dict[str, Any]:
    """write_search_config's ``fusion`` for α and the served depth of `fusion`."""
    lexical, k = settings.index.lexical, settings.evaluate.k
    return {
        "dense_weight": fusion["dense_weight"],
        "candidates": max(k, lexical.candidates),
        "dense_candidates": lexical.dense_candidates,
        **{knob: fusion[knob] for knob in ("nprobe", "ef_search") if fusion.get(knob)},
    }


def _served_result(name: str, split: _Split, ranking: Ranking, inputs: _Inputs) -> SystemResult:
    """A split's ranking scored: by the fused score, or by rank once re-ranked (a re-ranked
    hit keeps its first-stage score, and trec_eval orders by score); top1 is the rank-1
    distance, the threshold's unit."""
    scores = ranking.scores
    if ranking.reranked or scores is None:
        ranks = np.arange(ranking.rows.shape[1], 0, -1, dtype=np.float32)
        scores = np.where(ranking.rows >= 0, ranks[None], -np.inf).astype(np.float32)
    result = score_system(
        name,
        split.queries,
        ranking.rows,
        scores,
        inputs.ids.qids,
        higher_is_better=True,
        seconds=0.0,
    )
    top1 = np.where(ranking.rows[:, 0] >= 0, ranking.distances[:, 0], np.inf)
    return replace(result, top1=top1.astype(np.float64))


def _served_results(
    searcher: HybridSearch, inputs: _Inputs, splits: dict[str, _Split], k: int
) -> dict[str, dict[str, SystemResult]]:
    """Per split, the served ranking ("model": `HybridSearch.rank`, each query's own row
    excluded) and, when fused, the bundle's BM25 alone ("lexical", α = 0)."""
    results: dict[str, dict[str, SystemResult]] = {}
    for name, split in splits.items():
        started = time.perf_counter()
        texts = split.queries.texts
        if searcher.bm25 is None:
            ranking = searcher.rank(texts, lambda s=split: s.vectors, k, exclude=split.rows)
            model = _served_result("model", split, ranking, inputs)
            results[name] = {"model": replace(model, seconds=time.perf_counter() - started)}
            continue
        # rank() in its two steps, to keep the candidates for BM25 alone.
        found = searcher.candidates(texts, split.vectors, k, exclude=split.rows)
        weight = searcher.config.dense_weight
        first = fuse(found, weight, searcher.depth(k))
        model = _served_result("model", split, searcher.reranked(texts, first, k), inputs)
        seconds = split.dense.seconds + time.perf_counter() - started
        # α = 0: the bundle's own BM25 (its stemming, k1, b) alone, an honest baseline
        # for what the encoder adds.
        lexical = _served_result("lexical", split, fuse(found, 0.0, k), inputs)
        results[name] = {"model": replace(model, seconds=seconds), "lexical": lexical}
    return results


def _no_paraphrase(
    settings: Settings, inputs: _Inputs, searcher: HybridSearch, splits: dict[str, _Split]
) -> dict[str, Unanswerable]:
    """Per split, the queries of a seeded share of its clusters, each searched as served
    with its own cluster gone from the index (`qpr.evaluation.no_answer`): their rank-1
    distances are what the threshold sees for a question with no paraphrase."""
    questions = inputs.questions
    row_cluster = row_clusters(inputs.ids.qids, questions)
    clustered = questions[questions["cluster_id"] >= 0]
    extra = int(clustered.groupby("cluster_id").size().max())  # the largest cluster
    out: dict[str, Unanswerable] = {}
    for position, (name, split) in enumerate(splits.items()):
        clusters = query_clusters(split.queries, questions)
        held = held_out_mask(
            clusters, settings.evaluate.no_paraphrase_share, settings.seed + position
        )
        top1 = np.full(held.shape, np.inf)
        if held.any():
            texts = [t for t, h in zip(split.queries.texts, held, strict=True) if h]
            own = cluster_rows(clusters[held], row_cluster, extra)
            top1[held] = top1_without_cluster(searcher, texts, split.vectors[held], own)
        out[name] = Unanswerable(held, top1)
    return out


def _baselines(
    settings: Settings, inputs: _Inputs, queries: QuerySet, log: Callable[[str], None]
) -> dict[str, SystemResult]:
    """The baselines params ask for, on the same queries and the same index questions."""
    task = SearchTask(
        index_texts=inputs.index_questions["text"].tolist(),
        row_to_qid=inputs.ids.qids,
        queries=queries,
        query_rows=inputs.ids.to_rows(queries.query_ids),
        k=settings.evaluate.k,
    )
    return run_baselines(
        settings.evaluate.baselines,
        task,
        settings,
        inputs.vocab,
        max_len=inputs.max_len,
        log=log,
    )


def _metrics(
    results: dict[str, dict[str, SystemResult]],
    threshold: dict[str, float | None],
    fusion: dict | None,
) -> dict:
    """metrics.json: the served system's test measures, its val measures, the baselines',
    the threshold's and (with BM25) the fusion's."""
    val, test = results["val"]["model"], results["test"]["model"]
    metrics: dict = {key: test.summary[key] for key in test.summary}
    metrics["query_ms"] = 1000.0 * test.seconds / max(len(test.run), 1)
    metrics["val"] = dict(val.summary)
    metrics["baselines"] = {
        name: {**result.summary, "seconds": result.seconds}
        for name, result in results["test"].items()
        if name not in ("model", "dense")
    }
    metrics["threshold"] = threshold
    if fusion is not None:
        metrics["fusion"] = fusion
    return metrics


def _fusion_metrics(
    fusion: dict,
    served: dict,
    candidates: int,
    settings: Settings,
    results: dict[str, dict[str, SystemResult]],
    bm25: BM25Index,
) -> dict:
    """metrics.json's "fusion": α and its validation curve, the candidates, the served
    depth, and the dense ranking and BM25 alone on both splits."""
    return {
        **fusion,
        "candidates": candidates,
        "dense_candidates": settings.index.lexical.dense_candidates,
        "served": served,
        "dense_test": dict(results["test"]["dense"].summary),
        "dense_val": dict(results["val"]["dense"].summary),
        "lexical_test": dict(results["test"]["lexical"].summary),
        "lexical_val": dict(results["val"]["lexical"].summary),
        "lexical": bm25.settings,  # what the index file holds
    }


def _write_results_table(
    out_dir: Path, test: dict[str, SystemResult], k: int, settings: Settings
) -> Path:
    """results.md: every system's test measures in one table."""
    model = test["model"]
    rows_table = [
        {"system": name, **{m: r.summary[m] for m in MEASURE_LABELS}} for name, r in test.items()
    ]
    return write_text_atomic(
        out_dir / "results.md",
        f"# Test split ({model.summary['num_queries']:.0f} queries, k = {k})\n\n"
        + format_table(rows_table, ["system", *MEASURE_LABELS])
        + "\n"
        + (f"\nuntrained: {untrained_description(settings)}.\n" if "untrained" in test else ""),
    )


def _threshold(
    settings: Settings,
    paths: ProjectPaths,
    val: SystemResult,
    test: SystemResult,
    no_paraphrase: dict[str, Unanswerable],
    log: Callable[[str], None],
) -> tuple[float | None, dict]:
    """The no-answer threshold chosen on val, its report and plot, logged loudly when it
    answers too little or too much: (threshold or None, metrics.json's "threshold")."""
    chosen, threshold, _ = threshold_report(
        val,
        test,
        paths.evaluation_dir,
        paths.plots_dir / "evaluate" / "threshold.png",
        target=settings.evaluate.target_precision,
        max_false_answer_rate=settings.evaluate.max_false_answer_rate,
        no_paraphrase=no_paraphrase,
    )
    _log_threshold(threshold, log)
    return chosen, threshold


def _log_threshold(threshold: dict, log: Callable[[str], None]) -> None:
    """One line on the chosen no-answer threshold; a loud one per warning."""

    def num(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    log(
        f"no-answer threshold {num(threshold['value'], '.4f')} (rule {threshold['rule']}): "
        f"on test it answers {num(threshold['test_answered_share'], '.1%')} of the "
        f"answerable queries at P@1 {num(threshold['test_precision_at_1'], '.4f')} and "
        f"{num(threshold['test_false_answer_rate'], '.1%')} of the "
        f"{threshold['test_unanswerable']} with no paraphrase"
    )
    for warning in threshold["warnings"]:
        log(f"WARNING: no-answer threshold: {warning}")


def run_evaluate(
    settings: Settings, paths: ProjectPaths, *, log: Callable[[str], None] = print
) -> dict:
    """The whole stage. Raises GateFailed when the model is below the quality floor."""
    cfg, k = settings.evaluate, settings.evaluate.k
    inputs = _read_inputs(settings, paths, log)
    out_dir = paths.evaluation_dir
    out_dir.mkdir(parents=True, exist_ok=True)

    # The dense ranking of each split.
    results: dict[str, dict[str, SystemResult]] = {"val": {}, "test": {}}
    splits: dict[str, _Split] = {}
    for name in SPLITS:
        split = _search_split(inputs, query_set(inputs.questions, name), k)
        splits[name] = split
        results[name][split.dense.name] = split.dense
        write_qrels(out_dir / f"{name}.qrels", split.queries.qrels)

    # The fusion with BM25 tuned on val; then both splits measured as served.
    fusion = served = None
    fusion_plot = paths.plots_dir / "evaluate" / "fusion.png"
    if inputs.bm25 is None:
        plot_fusion_curve({}, None, fusion_plot)
    else:
        fusion, served = _tune_fusion(settings, paths, inputs, splits["val"], log)
    fused = None if fusion is None else _fused_config(settings, {**fusion, **served})
    searcher = _searcher(inputs, search_config(paths, settings, None, None, fused))
    for name, measured in _served_results(searcher, inputs, splits, k).items():
        results[name].update(measured)
    if fusion is not None:
        _log_fusion(fusion, results, log)

    results["test"].update(_baselines(settings, inputs, splits["test"].queries, log))
    for name in SPLITS:
        for system, result in results[name].items():
            write_run(out_dir / f"{name}.{system}.run", result.run, tag=f"qpr-{system}")

    # The no-answer threshold, chosen on val; the search config the service reads.
    val, test = results["val"]["model"], results["test"]["model"]
    no_paraphrase = _no_paraphrase(settings, inputs, searcher, splits)
    chosen, threshold = _threshold(settings, paths, val, test, no_paraphrase, log)
    write_search_config(paths, settings, chosen, threshold["val_answered_share"], fused)

    metrics = _metrics(
        results,
        threshold,
        None
        if fusion is None
        else _fusion_metrics(fusion, served, fused["candidates"], settings, results, inputs.bm25),
    )
    _write_results_table(out_dir, results["test"], k, settings)
    log(
        f"test: success@1 {test.summary['success_1']:.4f}, success@10 "
        f"{test.summary['success_10']:.4f}, MRR {test.summary['recip_rank']:.4f} over "
        f"{test.summary['num_queries']:.0f} queries"
    )
    require(
        "quality_floor",
        [
            Check(
                "val_success_1",
                val.summary["success_1"],
                ">=",
                cfg.min_success_1,
                "evaluate.min_success_1: below it the model must not be registered",
            )
        ],
        paths.gate_reports("evaluate"),
    )
    return metrics


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
