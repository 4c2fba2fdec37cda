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

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from qpr.artifacts import (
    RERANK_MODEL_FILE,
    SearchConfig,
    detect_query_encoder,
    served_query_encoder,
)
from qpr.config import Settings
from qpr.evaluation.baselines import untrained_description
from qpr.evaluation.measure import Measured, measure_served
from qpr.evaluation.no_answer import Unanswerable
from qpr.evaluation.queries import SystemResult, judged_questions
from qpr.evaluation.threshold import threshold_report
from qpr.evaluation.trec import MEASURE_LABELS, format_table, write_qrels, write_run
from qpr.io import write_text_atomic
from qpr.paths import ProjectPaths
from qpr.pipeline.handoff import load_served, read_cluster_outputs
from qpr.quality.checks import Check, require

if TYPE_CHECKING:
    from qpr.retrieval.bm25 import BM25Index


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
        spelling=settings.index.spelling,
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


def _fusion_metrics(measured: Measured, settings: Settings, bm25: BM25Index) -> dict:
    """metrics.json's "fusion": α and its validation curve, the candidates, the served
    depth, and the dense ranking and BM25 alone on both splits."""
    results = measured.results
    return {
        **measured.fusion,
        "candidates": measured.config.lexical_candidates,
        "dense_candidates": settings.index.lexical.dense_candidates,
        "served": measured.depth,
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
    served, indexed = load_served(paths, settings)
    questions, _ = read_cluster_outputs(paths)
    if served_query_encoder(paths.models_dir) != paths.encoder_onnx:
        log(f"queries encoded by {served_query_encoder(paths.models_dir)} against the index "
            f"vectors of {paths.encoder_onnx}")  # fmt: skip
    out_dir = paths.evaluation_dir
    out_dir.mkdir(parents=True, exist_ok=True)

    # Val and test through the served ranking, the fusion with BM25 tuned on val, and the
    # baselines on test.
    fusion_plot = paths.plots_dir / "evaluate" / "fusion.png"
    base = search_config(paths, settings, None, None)
    judged = judged_questions(questions, indexed)
    measured = measure_served(served, judged, base, settings, fusion_plot, log)
    results = measured.results
    for name, split in measured.splits.items():
        write_qrels(out_dir / f"{name}.qrels", split.queries.qrels)
        for system, result in results[name].items():
            write_run(out_dir / f"{name}.{system}.run", result.run, tag=f"qpr-{system}")

    # The no-answer threshold, chosen on val; the search config the service reads.
    val, test = results["val"]["model"], results["test"]["model"]
    chosen, threshold = _threshold(settings, paths, val, test, measured.no_paraphrase, log)
    replace(
        measured.config, threshold=chosen, val_answered_share=threshold["val_answered_share"]
    ).write(paths.models_dir)

    metrics = _metrics(
        results,
        threshold,
        None if measured.fusion is None else _fusion_metrics(measured, settings, served.bm25),
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
