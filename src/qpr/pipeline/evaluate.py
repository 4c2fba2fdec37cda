"""The evaluate stage: TREC-style evaluation of the trained system and of baselines.

Every question of a split's clusters is a query; its relevant documents are the other
questions of its cluster; it searches the full index with itself excluded; top k kept.
Measures are trec_eval's (pytrec_eval), a query that retrieves nothing counts as a miss.
With BM25 in the bundle, the fusion weight and how deep fused searches go are chosen on
the validation split (`qpr.evaluation.fusion_tuning`). The "no answer" threshold is
chosen on the validation split and reported on test (`qpr.evaluation.threshold`); a
seeded share of each split's clusters is held out to make queries with no paraphrase,
which it must refuse (`qpr.evaluation.no_answer`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from qpr.artifacts import RERANK_MODEL_FILE, SearchConfig, served_query_encoder
from qpr.config import Settings
from qpr.evaluation.baselines import run_baselines, untrained_description
from qpr.evaluation.fusion_tuning import (
    HybridCandidates,
    choose_dense_weight,
    choose_served_depth,
    fused_result,
    hybrid_candidates,
    plot_fusion_curve,
)
from qpr.evaluation.no_answer import (
    Unanswerable,
    dense_top1_without_cluster,
    fused_top1_without_cluster,
    held_out_mask,
    query_clusters,
    row_clusters,
)
from qpr.evaluation.queries import QuerySet, SearchTask, SystemResult, query_set, score_system
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
from qpr.retrieval.bm25 import lexical_search
from qpr.text import load_tokenizer

if TYPE_CHECKING:
    from qpr.retrieval.bm25 import BM25Index
    from qpr.retrieval.dense import IdMap
    from qpr.text.vocab import Vocabulary
    from qpr.text.wordpiece import WordPieceTokenizer

SPLITS = ("val", "test")


@dataclass(frozen=True)
class _Inputs:
    """What the stage reads: the index with its questions, the cluster stage's questions,
    the encoder queries go through (and its tokenizer), the bundle's BM25 when enabled."""

    index: Any
    ids: IdMap
    index_questions: pd.DataFrame
    questions: pd.DataFrame
    vocab: Vocabulary | WordPieceTokenizer
    session: Any
    max_len: int
    bm25: BM25Index | None


@dataclass(frozen=True)
class _Searched:
    """One split searched as the service searches: the dense ranking scored, and with BM25
    what fusion needs (query rows, query vectors, BM25 scores and rows)."""

    dense: SystemResult
    vectors: np.ndarray  # float32 [Q, D] the queries' embeddings
    fusion_inputs: tuple[np.ndarray, ...] | None
    seconds: float  # both retrievers' time


def write_search_config(
    paths: ProjectPaths,
    settings: Settings,
    threshold: float | None,
    val_share: float | None,
    fusion: dict[str, float | int] | None = None,
) -> Path:
    """models/search.json (qpr.artifacts.SearchConfig): how the service searches, as
    evaluated here: the no-answer threshold chosen on the validation split, the dense-only
    depth searched with (index.nprobe / index.ef_search) and, when BM25 is fused in, the
    dense weight α, BM25's candidates, the index's (`dense_candidates`) and how deep fused
    searches go (`nprobe` or `ef_search` of `fusion`). It declares the query encoder the
    figures were measured with (`qpr.artifacts.detect_query_encoder`: the student stage's,
    else the index stage's int8 one, else encoder.onnx); loaders serve that one."""
    from qpr.artifacts import detect_query_encoder

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
    # The re-ranker is served when the rerank stage trained one; the figures here are the
    # first stage's (benchmarks/rerank.py measures the re-ranked path).
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
    ).write(paths.models_dir)


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
    # Queries go through the encoder the service runs: the int8 one when the index has it.
    query_encoder = served_query_encoder(paths.models_dir)
    session = load_session(query_encoder, threads=settings.index.threads)
    if query_encoder != paths.encoder_onnx:
        log(f"queries encoded by {query_encoder} against the index vectors of {paths.encoder_onnx}")
    max_len = onnx_max_len(session)
    bm25 = load_bm25(paths) if settings.index.lexical.enabled else None
    return _Inputs(index, ids, index_questions, questions, vocab, session, max_len, bm25)


def _search_split(inputs: _Inputs, queries: QuerySet, k: int, candidates: int) -> _Searched:
    """The dense top k of `queries` (each excluded from its own results), scored; with
    BM25 also its top `candidates`, for the fusion."""
    from qpr.retrieval.dense import search
    from qpr.retrieval.encoders import encode

    query_rows = inputs.ids.to_rows(queries.query_ids)
    started = time.perf_counter()
    vectors = encode(
        inputs.session, inputs.vocab, queries.texts, batch_size=256, max_len=inputs.max_len
    )
    distances, rows = search(inputs.index, vectors, k, exclude=query_rows)
    dense_seconds = time.perf_counter() - started
    dense = score_system(
        "dense" if inputs.bm25 is not None else "model",
        queries,
        rows[:, :k],
        distances[:, :k],
        inputs.ids.qids,
        higher_is_better=False,
        seconds=dense_seconds,
    )
    if inputs.bm25 is None:
        return _Searched(dense, vectors, None, dense_seconds)
    started = time.perf_counter()
    lex_scores, lex_rows = lexical_search(
        inputs.bm25, queries.texts, candidates, exclude_rows=query_rows
    )
    seconds = dense_seconds + time.perf_counter() - started
    return _Searched(dense, vectors, (query_rows, vectors, lex_scores, lex_rows), seconds)


def _tune_fusion(
    settings: Settings,
    inputs: _Inputs,
    val: tuple[QuerySet, _Searched],
    dense_candidates: int,
    plot: Path,
    log: Callable[[str], None],
) -> tuple[dict, dict]:
    """(the fusion chosen on val: α and its curve, the served search depth). α is the
    model's, not the index's: chosen over an exact dense search; then the fewest lists
    that reproduce that ranking closely enough are served (and set on the index)."""
    from qpr.retrieval.dense import exact_twin

    lexical, k = settings.index.lexical, settings.evaluate.k
    queries, searched = val
    exact_val = hybrid_candidates(
        exact_twin(inputs.index), queries, *searched.fusion_inputs, dense_candidates
    )
    fusion = choose_dense_weight(
        exact_val, lexical.dense_weights, inputs.index, inputs.ids.qids, k, plot
    )
    served = choose_served_depth(
        inputs.index,
        exact_val,
        fusion["dense_weight"],
        dense_candidates,
        k,
        lexical.served_recall,
        log=log,
    )
    probing = "".join(
        f"fused searches at {knob} {served[knob]} (the dense ranking alone "
        f"{getattr(settings.index, knob)}): "
        for knob in ("nprobe", "ef_search")
        if served[knob] is not None
    )
    log(
        f"{probing}served recall@{k} {served['recall']:.4f} against an exact dense search"
        + ("" if served["reached"] else f", BELOW the target {served['target']}")
    )
    return fusion, served


def _fused_results(
    inputs: _Inputs,
    splits: dict[str, tuple[QuerySet, _Searched]],
    dense_weight: float,
    dense_candidates: int,
    k: int,
) -> dict[str, dict[str, SystemResult]]:
    """Per split, the served ranking ("model": fusion at α) and BM25 alone ("lexical")."""
    hybrid: dict[str, HybridCandidates] = {}
    for split, (queries, searched) in splits.items():  # as served
        hybrid[split] = hybrid_candidates(
            inputs.index, queries, *searched.fusion_inputs, dense_candidates, searched.seconds
        )
    results: dict[str, dict[str, SystemResult]] = {}
    for split, candidates in hybrid.items():
        model = fused_result(candidates, dense_weight, inputs.index, inputs.ids.qids, k)
        # α = 0: the bundle's own BM25 (its stemming, k1, b) alone, an honest baseline
        # for what the encoder adds.
        lexical_alone = fused_result(candidates, 0.0, inputs.index, inputs.ids.qids, k)
        results[split] = {"model": model, "lexical": replace(lexical_alone, name="lexical")}
    return results


def _no_paraphrase(
    settings: Settings,
    inputs: _Inputs,
    splits: dict[str, tuple[QuerySet, _Searched]],
    dense_weight: float | None,
    candidates: int,
    dense_candidates: int,
) -> dict[str, Unanswerable]:
    """Per split, the queries of a seeded share of its clusters, each searched as served
    with its own cluster gone from the index (`qpr.evaluation.no_answer`): their rank-1
    distances are what the threshold sees for a question with no paraphrase."""
    from qpr.retrieval.bm25 import lexical_search

    questions = inputs.questions
    row_cluster = row_clusters(inputs.ids.qids, questions)
    clustered = questions[questions["cluster_id"] >= 0]
    extra = int(clustered.groupby("cluster_id").size().max())  # the largest cluster
    out: dict[str, Unanswerable] = {}
    for position, (split, (queries, searched)) in enumerate(splits.items()):
        clusters = query_clusters(queries, questions)
        held = held_out_mask(
            clusters, settings.evaluate.no_paraphrase_share, settings.seed + position
        )
        vectors, own = searched.vectors[held], clusters[held]
        top1 = np.full(held.shape, np.inf)
        if held.any() and (inputs.bm25 is None or dense_weight is None):
            top1[held] = dense_top1_without_cluster(
                inputs.index, vectors, row_cluster, own, 1 + extra
            )
        elif held.any():
            texts = [t for t, h in zip(queries.texts, held, strict=True) if h]
            top1[held] = fused_top1_without_cluster(
                inputs.index,
                vectors,
                lexical_search(inputs.bm25, texts, candidates + extra),
                row_cluster,
                own,
                dense_candidates=dense_candidates,
                extra=extra,
                dense_weight=dense_weight,
            )
        out[split] = Unanswerable(held, top1)
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
    cfg, lexical, k = settings.evaluate, settings.index.lexical, settings.evaluate.k
    inputs = _read_inputs(settings, paths, log)
    out_dir = paths.evaluation_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    bm25 = inputs.bm25
    candidates = max(k, lexical.candidates) if bm25 is not None else k
    # Bundle.search takes max(its k, dense_candidates) too: with dense_candidates >= k (the
    # default) the service ranks any k up to evaluate.k exactly as evaluated here.
    dense_candidates = max(k, lexical.dense_candidates)

    # The dense ranking of each split (and BM25's candidates, when fused).
    results: dict[str, dict[str, SystemResult]] = {"val": {}, "test": {}}
    splits: dict[str, tuple[QuerySet, _Searched]] = {}
    for split in SPLITS:
        queries = query_set(inputs.questions, split)
        searched = _search_split(inputs, queries, k, candidates)
        splits[split] = (queries, searched)
        results[split][searched.dense.name] = searched.dense
        write_qrels(out_dir / f"{split}.qrels", queries.qrels)

    # The fusion with BM25, tuned on val, then measured as served.
    fusion = served = None
    fusion_plot = paths.plots_dir / "evaluate" / "fusion.png"
    if bm25 is None:
        plot_fusion_curve({}, None, fusion_plot)
    else:
        fusion, served = _tune_fusion(
            settings, inputs, splits["val"], dense_candidates, fusion_plot, log
        )
        fused = _fused_results(inputs, splits, fusion["dense_weight"], dense_candidates, k)
        for split in SPLITS:
            results[split].update(fused[split])
        log(
            f"fusion with BM25 (α = dense weight, chosen on val over an exact dense search): "
            f"α {fusion['dense_weight']:g}, val success@1 "
            f"{fusion['val_success_1'][str(fusion['dense_weight'])]:.4f} there, "
            f"{results['val']['model'].summary['success_1']:.4f} as served, against "
            f"{results['val']['dense'].summary['success_1']:.4f} dense alone"
        )

    results["test"].update(_baselines(settings, inputs, splits["test"][0], log))
    for split in SPLITS:
        for name, result in results[split].items():
            write_run(out_dir / f"{split}.{name}.run", result.run, tag=f"qpr-{name}")

    # The no-answer threshold, chosen on val; the search config the service reads.
    val, test = results["val"]["model"], results["test"]["model"]
    weight = None if fusion is None else fusion["dense_weight"]
    no_paraphrase = _no_paraphrase(settings, inputs, splits, weight, candidates, dense_candidates)
    chosen, threshold = _threshold(settings, paths, val, test, no_paraphrase, log)
    write_search_config(
        paths,
        settings,
        chosen,
        threshold["val_answered_share"],
        fusion=None
        if fusion is None
        else {
            "dense_weight": fusion["dense_weight"],
            "candidates": candidates,
            "dense_candidates": lexical.dense_candidates,
            **{knob: served[knob] for knob in ("nprobe", "ef_search") if served[knob]},
        },
    )

    metrics = _metrics(
        results,
        threshold,
        None
        if fusion is None
        else _fusion_metrics(fusion, served, candidates, settings, results, bm25),
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
