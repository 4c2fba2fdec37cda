"""The evaluate stage: TREC-style evaluation of the trained system and of baselines.

Every question of a split's clusters is a query; its relevant documents are the other
questions of its cluster; it searches the full index with itself excluded; top k kept.
Measures are trec_eval's (pytrec_eval), a query that retrieves nothing counts as a miss.
The "no answer" threshold is chosen on the validation split and reported on test.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from qpr.config import Settings
from qpr.evaluation.trec import (
    MEASURE_LABELS,
    Qrels,
    Run,
    bm25_search,
    format_table,
    jaccard_search,
    pick_threshold,
    plot_threshold_curve,
    qrels_from_clusters,
    run_from_search,
    threshold_curve,
    trec_measures,
    write_qrels,
    write_run,
)
from qpr.paths import ProjectPaths
from qpr.pipeline.handoff import MissingInputError
from qpr.pipeline.index import load_index_bundle, onnx_max_len, query_encoder_path
from qpr.quality.checks import Check, require
from qpr.retrieval.bm25 import lexical_search
from qpr.text import load_tokenizer

if TYPE_CHECKING:
    from qpr.text.vocab import Vocabulary
    from qpr.text.wordpiece import WordPieceTokenizer

MEASURES_SHOWN = tuple(MEASURE_LABELS)


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


@dataclass(frozen=True)
class SystemResult:
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
    run = run_from_search(
        queries.query_ids, rows, scores, row_to_qid, higher_is_better=higher_is_better
    )
    per_query, summary = trec_measures(queries.qrels, run)
    first = np.where(rows[:, 0] >= 0, scores[:, 0], np.inf if not higher_is_better else -np.inf)
    top1 = -first if higher_is_better else first
    return SystemResult(name, summary, per_query, run, top1.astype(np.float64), seconds)


@dataclass(frozen=True)
class HybridCandidates:
    """One split's candidates from both retrievers, before fusion."""

    queries: QuerySet
    query_rows: np.ndarray  # int64 [Q] each query's own index row (left out of its results)
    vectors: np.ndarray  # float32 [Q, D] query embeddings
    dense_sims: np.ndarray  # float32 [Q, C] minus the exact L2 distance of every candidate
    dense_rows: np.ndarray  # int64 [Q, C] both retrievers' candidates (candidate_union)
    lexical_scores: np.ndarray  # float32 [Q, Cl] BM25
    lexical_rows: np.ndarray  # int64 [Q, Cl]
    seconds: float


def hybrid_candidates(
    index,
    queries: QuerySet,
    query_rows: np.ndarray,
    vectors: np.ndarray,
    lexical_scores: np.ndarray,
    lexical_rows: np.ndarray,
    dense_candidates: int,
    seconds: float = 0.0,
) -> HybridCandidates:
    """The served candidates: the index's top `dense_candidates` and BM25's, each scored
    by its exact distance (what `Bundle.search` does per question). `index` may be an
    exact twin (`qpr.retrieval.dense.exact_twin`): the reference the served nprobe is chosen against.
    """
    from qpr.retrieval.dense import distances_to
    from qpr.retrieval.fusion import candidate_union

    started = time.perf_counter()
    _, dense_rows = dense_search(index, vectors, query_rows, dense_candidates)
    rows = candidate_union(dense_rows, lexical_rows)
    sims = -distances_to(index, vectors, rows)
    return HybridCandidates(
        queries,
        query_rows,
        vectors,
        sims,
        rows,
        lexical_scores,
        lexical_rows,
        seconds + time.perf_counter() - started,
    )


def load_bm25(index_dir: Path):
    """models/index/bm25.npz, written by the index stage when index.lexical.enabled."""
    from qpr.pipeline.index import BM25_FILE
    from qpr.retrieval.bm25 import BM25Index

    path = index_dir / BM25_FILE
    if not path.is_file():
        raise MissingInputError(
            f"{path} not found: index.lexical.enabled is true but the index stage ran without "
            "it; run the index stage again"
        )
    return BM25Index.load(path)


def fused_result(
    candidates: HybridCandidates, dense_weight: float, index, row_to_qid: np.ndarray, k: int
) -> SystemResult:
    """The served ranking: fusion at α = dense_weight; top1 is the rank-1 question's L2
    distance (the unit of the no-answer threshold), whichever retriever found it."""
    from qpr.retrieval.dense import distances_to
    from qpr.retrieval.fusion import fuse_union

    started = time.perf_counter()
    scores, rows = fuse_union(
        candidates.dense_sims,
        candidates.dense_rows,
        candidates.lexical_scores,
        candidates.lexical_rows,
        dense_weight,
        k,
    )
    result = score_system(
        "model",
        candidates.queries,
        rows,
        scores,
        row_to_qid,
        higher_is_better=True,
        seconds=candidates.seconds + time.perf_counter() - started,
    )
    top1 = distances_to(index, candidates.vectors, rows[:, :1])[:, 0].astype(np.float64)
    return replace(result, top1=top1)


def choose_dense_weight(
    val: HybridCandidates,
    weights: Sequence[float],
    index,
    row_to_qid: np.ndarray,
    k: int,
    plot: Path,
) -> dict:
    """The α of `weights` with the best validation success@1 (ties: the larger α, the
    ranking closer to the dense one); the curve is plotted."""
    by_weight: dict[str, float] = {}
    for weight in sorted(set(weights)):
        by_weight[str(weight)] = fused_result(val, weight, index, row_to_qid, k).summary[
            "success_1"
        ]
    best = max(by_weight.items(), key=lambda item: (item[1], float(item[0])))
    plot_fusion_curve(by_weight, float(best[0]), plot)
    return {"dense_weight": float(best[0]), "val_success_1": by_weight, "chosen_on": "val"}


# How deep a fused search may go, tried from the shallowest up: inverted lists probed
# (IVF, qpr.retrieval.dense.set_nprobe) or graph candidates kept (HNSW, qpr.retrieval.dense.set_ef_search).
# Steps of about 1.5x: a search's cost grows with its depth, so doubling would often
# serve up to twice the lists the target needs.
SERVED_DEPTHS = {
    "nprobe": (
        *(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768),
        *(1024, 1536, 2048, 3072, 4096, 6144, 8192),
    ),
    "ef_search": (16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024),
}


def choose_served_depth(
    index,
    exact: HybridCandidates,
    dense_weight: float,
    dense_candidates: int,
    k: int,
    target: float,
    log: Callable[[str], None] = print,
) -> dict:
    """The shallowest search (fewest IVF lists, or fewest HNSW candidates kept) whose
    fused top k keeps `target` of the top k fused from an exact dense search (`exact`: the
    validation candidates from the index's exact twin, `hybrid_candidates(exact_twin(index),
    ...)`).

    A fused ranking takes only a few candidates from the index and scores every candidate
    exactly, so it needs a far shallower search than the dense ranking alone. Depths are
    tried from SERVED_DEPTHS below the index's own, then its own; the first to reach the
    target is chosen (the index's own when none does: `reached` is False), and the index is
    left set to it. Returns {"nprobe", "ef_search" (the one chosen, the other None),
    "recall", "target", "reached", "by_nprobe" / "by_ef_search" (recall per depth tried)};
    a Flat index gets its recall measured as it stands, both depths None.
    """
    import faiss

    from qpr.retrieval.dense import (
        ef_search_of,
        nlist_of,
        recall_against,
        set_ef_search,
        set_nprobe,
    )
    from qpr.retrieval.fusion import fuse_union

    def fused_rows(candidates: HybridCandidates) -> np.ndarray:
        return fuse_union(
            candidates.dense_sims,
            candidates.dense_rows,
            candidates.lexical_scores,
            candidates.lexical_rows,
            dense_weight,
            k,
        )[1]

    def served_at(searched) -> float:
        candidates = hybrid_candidates(
            searched,
            exact.queries,
            exact.query_rows,
            exact.vectors,
            exact.lexical_scores,
            exact.lexical_rows,
            dense_candidates,
        )
        return recall_against(fused_rows(candidates), reference)

    reference = fused_rows(exact)
    out: dict = {"nprobe": None, "ef_search": None, "by_nprobe": {}, "by_ef_search": {}}
    if nlist_of(index) is not None:
        knob, own, set_depth = "nprobe", int(faiss.extract_index_ivf(index).nprobe), set_nprobe
    elif ef_search_of(index) is not None:
        knob, own, set_depth = "ef_search", int(ef_search_of(index)), set_ef_search
    else:
        recall = served_at(index)
        return {**out, "recall": recall, "target": target, "reached": recall >= target}
    tried: dict[str, float] = {}
    chosen = own
    for depth in [d for d in SERVED_DEPTHS[knob] if d < own] + [own]:
        set_depth(index, depth)
        tried[str(depth)] = served_at(index)
        log(f"served recall@{k} of the fusion at {knob} {depth}: {tried[str(depth)]:.4f}")
        if tried[str(depth)] >= target:
            chosen = depth
            break
    set_depth(index, chosen)
    recall = tried[str(chosen)]
    return {
        **out,
        knob: chosen,
        f"by_{knob}": tried,
        "recall": recall,
        "target": target,
        "reached": recall >= target,
    }


def plot_fusion_curve(by_weight: dict[str, float], chosen: float | None, path: Path) -> Path:
    """Validation P@1 against α; without fusion (empty by_weight) a figure that says so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    if by_weight and chosen is not None:
        ax.plot([float(w) for w in by_weight], list(by_weight.values()), marker="o")
        ax.axvline(chosen, color="grey", linestyle="--", label=f"chosen α = {chosen:g}")
        ax.legend()
    else:
        ax.text(
            0.5,
            0.5,
            "index.lexical.enabled is false:\nthe dense ranking alone is served",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
    ax.set_xlabel("dense weight α (0 = BM25 alone, 1 = dense alone)")
    ax.set_ylabel("validation P@1")
    ax.set_title("Fusion of the dense ranking with BM25")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def dense_search(index, vectors: np.ndarray, query_rows: np.ndarray, k: int):
    from qpr.retrieval.dense import search

    return search(index, vectors, k, exclude=query_rows)


def untrained_description(settings: Settings) -> str:
    """What the "untrained" baseline is for model.encoder (said beside its numbers)."""
    if settings.model.encoder == "transformer":
        transformer = settings.model.transformer
        what = f"{transformer.package} as packaged: pretrained, not fine-tuned"
        if transformer.projection_dim:
            what += f" (projection to {transformer.projection_dim} at its seeded initial weights)"
        return what
    return "the same CNN with its seeded random initial weights"


def untrained_encoder_search(
    settings: Settings,
    vocab: Vocabulary | WordPieceTokenizer,
    index_texts: Sequence[str],
    queries: QuerySet,
    query_rows: np.ndarray,
    *,
    max_len: int,
    k: int,
):
    """Seed 001's first baseline: the same encoder before training, exact search. Shows how
    much of the result training earned. For the CNN that is its random initial weights; for
    the transformer the pretrained model as packaged (not fine-tuned), a projection at its
    seeded initial weights (see untrained_description)."""
    from qpr.pipeline.train import build_encoder_and_loss
    from qpr.retrieval.dense import build_index
    from qpr.training.loop import encode_texts

    encoder, _ = build_encoder_and_loss(settings, vocab.size)
    if settings.model.encoder == "transformer":
        # ONNX Runtime encodes the transformer about twice as fast as torch on CPU (the
        # whole index is encoded again here); the CNN's torch path is fast enough.
        import tempfile

        from qpr.model.onnx import export_onnx
        from qpr.retrieval.encoders import encode, load_session

        with tempfile.TemporaryDirectory(prefix="qpr-untrained-") as tmp:
            path = export_onnx(encoder, Path(tmp) / "untrained.onnx", opset=settings.export.opset)
            session = load_session(path, threads=settings.index.threads)
            batch = settings.index.encode_batch_size
            index_vectors = encode(session, vocab, index_texts, batch_size=batch, max_len=max_len)
            query_vectors = encode(session, vocab, queries.texts, batch_size=batch, max_len=max_len)
    else:
        index_vectors = encode_texts(encoder, vocab, index_texts, max_len=max_len)
        query_vectors = encode_texts(encoder, vocab, queries.texts, max_len=max_len)
    flat = build_index(index_vectors, "Flat", nprobe=1, seed=settings.seed, log=lambda _: None)
    return dense_search(flat, query_vectors, query_rows, k)


def write_threshold(
    path: Path,
    threshold: float | None,
    target: float,
    val_share: float | None,
    *,
    fusion: dict[str, float | int] | None = None,
) -> Path:
    """models/threshold.json: what the service decides with, chosen on the validation
    split: the no-answer threshold and, when BM25 is fused in, the dense weight α, BM25's
    candidates, the index's (`dense_candidates`) and how deep fused searches go (`nprobe`
    or `ef_search`) (null: the dense ranking alone)."""
    payload = {
        "threshold": threshold,
        "target_precision": target,
        "metric": "l2",
        "chosen_on": "val",
        "val_answered_share": val_share,
        "fusion": fusion,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return path


def threshold_report(
    val: SystemResult, test: SystemResult, target: float, out_dir: Path, plot: Path
) -> tuple[float | None, dict[str, float | None], pd.DataFrame]:
    """Choose the no-answer threshold on val; measure what it gives on test."""

    def correct(result: SystemResult) -> np.ndarray:
        return np.array([result.per_query[q]["success_1"] > 0 for q in result.per_query])

    val_curve = threshold_curve(val.top1, correct(val))
    chosen = pick_threshold(val_curve, target)
    plot_threshold_curve(val_curve, plot, chosen)
    test_correct = correct(test)
    summary: dict[str, float | None] = {
        "value": chosen,
        "target_precision": target,
        "val_answered_share": None,
        "test_answered_share": None,
        "test_precision_at_1": None,
    }
    if chosen is not None:
        answered_val = val.top1 <= chosen
        answered = test.top1 <= chosen
        summary["val_answered_share"] = float(answered_val.mean())
        summary["test_answered_share"] = float(answered.mean())
        summary["test_precision_at_1"] = (
            float(test_correct[answered].mean()) if answered.any() else None
        )
    table = val_curve.iloc[:: max(1, len(val_curve) // 10)]
    (out_dir / "threshold.md").write_text(
        "# No-answer threshold (validation split)\n\n"
        + format_table(
            table.to_dict("records"),
            ["threshold", "answered_share", "answered", "precision_at_1"],
        )
        + f"\n\nChosen for P@1 ≥ {target}: {chosen}\n",
        encoding="utf-8",
    )
    return chosen, summary, val_curve


def run_baselines(
    settings: Settings,
    vocab: Vocabulary | WordPieceTokenizer,
    index_questions: pd.DataFrame,
    queries: QuerySet,
    query_rows: np.ndarray,
    row_to_qid: np.ndarray,
    into: dict[str, SystemResult],
    *,
    max_len: int,
    log: Callable[[str], None],
) -> None:
    """The baselines params ask for, on the same queries and the same index questions."""
    cfg = settings.evaluate
    index_texts = index_questions["text"].tolist()
    for baseline in cfg.baselines:
        started = time.perf_counter()
        if baseline == "bm25":
            scores, rows = bm25_search(index_texts, queries.texts, cfg.k, exclude_rows=query_rows)
        elif baseline == "jaccard":
            scores, rows = jaccard_search(
                index_texts, queries.texts, cfg.k, exclude_rows=query_rows
            )
        else:
            scores, rows = untrained_encoder_search(
                settings, vocab, index_texts, queries, query_rows, max_len=max_len, k=cfg.k
            )
        into[baseline] = score_system(
            baseline,
            queries,
            rows,
            scores,
            row_to_qid,
            higher_is_better=baseline in ("bm25", "jaccard"),
            seconds=time.perf_counter() - started,
        )
        what = f" [{untrained_description(settings)}]" if baseline == "untrained" else ""
        log(
            f"baseline {baseline}{what}: success@1 "
            f"{into[baseline].summary['success_1']:.4f} ({into[baseline].seconds:.1f} s)"
        )


def run_evaluate(
    settings: Settings, paths: ProjectPaths, *, log: Callable[[str], None] = print
) -> dict:
    """The whole stage. Raises GateFailed when the model is below the quality floor."""
    from qpr.retrieval.encoders import encode, load_session

    cfg = settings.evaluate
    if not paths.encoder_onnx.is_file():
        raise MissingInputError(f"{paths.encoder_onnx} not found: run the export stage first")
    index, ids, index_questions = load_index_bundle(
        paths.index_dir, nprobe=settings.index.nprobe, ef_search=settings.index.ef_search
    )
    questions = pd.read_parquet(paths.cluster_dir / "questions.parquet")
    vocab = load_tokenizer(paths.vocab)
    # Queries go through the encoder the service runs: the int8 one when the index has it.
    query_encoder = query_encoder_path(paths.encoder_onnx, paths.index_dir)
    session = load_session(query_encoder, threads=settings.index.threads)
    if query_encoder != paths.encoder_onnx:
        log(f"queries encoded by {query_encoder} (int8) against the float32 index vectors")
    max_len = onnx_max_len(session)
    out_dir = paths.evaluation_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    k = cfg.k

    lexical = settings.index.lexical
    bm25 = load_bm25(paths.index_dir) if lexical.enabled else None
    candidates = max(k, lexical.candidates) if bm25 is not None else k
    # Bundle.search takes max(its k, dense_candidates) too: with dense_candidates >= k (the
    # default) the service ranks any k up to evaluate.k exactly as evaluated here.
    dense_candidates = max(k, lexical.dense_candidates)

    results: dict[str, dict[str, SystemResult]] = {"val": {}, "test": {}}
    hybrid: dict[str, HybridCandidates] = {}
    lexical_inputs: dict[str, tuple[np.ndarray, ...]] = {}
    retrieval_seconds: dict[str, float] = {}
    splits = {split: query_set(questions, split) for split in ("val", "test")}
    for split, queries in splits.items():
        query_rows = ids.to_rows(queries.query_ids)
        started = time.perf_counter()
        vectors = encode(session, vocab, queries.texts, batch_size=256, max_len=max_len)
        distances, rows = dense_search(index, vectors, query_rows, k)
        dense_seconds = time.perf_counter() - started
        results[split]["dense" if bm25 is not None else "model"] = score_system(
            "dense" if bm25 is not None else "model",
            queries,
            rows[:, :k],
            distances[:, :k],
            ids.qids,
            higher_is_better=False,
            seconds=dense_seconds,
        )
        if bm25 is not None:
            started = time.perf_counter()
            lex_scores, lex_rows = lexical_search(
                bm25, queries.texts, candidates, exclude_rows=query_rows
            )
            lexical_inputs[split] = (query_rows, vectors, lex_scores, lex_rows)
            retrieval_seconds[split] = dense_seconds + time.perf_counter() - started
        write_qrels(out_dir / f"{split}.qrels", queries.qrels)
    fusion = None
    fusion_plot = paths.plots_dir / "evaluate" / "fusion.png"
    if bm25 is None:
        plot_fusion_curve({}, None, fusion_plot)
    else:
        from qpr.retrieval.dense import exact_twin

        # α is the model's, not the index's: chosen over an exact dense search; then the
        # fewest lists that reproduce that ranking closely enough are served.
        exact_val = hybrid_candidates(
            exact_twin(index), splits["val"], *lexical_inputs["val"], dense_candidates
        )
        fusion = choose_dense_weight(
            exact_val, lexical.dense_weights, index, ids.qids, k, fusion_plot
        )
        served = choose_served_depth(
            index,
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
        for split in ("val", "test"):  # as served
            hybrid[split] = hybrid_candidates(
                index,
                splits[split],
                *lexical_inputs[split],
                dense_candidates,
                retrieval_seconds[split],
            )
        for split in ("val", "test"):
            results[split]["model"] = fused_result(
                hybrid[split], fusion["dense_weight"], index, ids.qids, k
            )
            # α = 0: the bundle's own BM25 (its stemming, k1, b) alone, an honest baseline
            # for what the encoder adds.
            lexical_alone = fused_result(hybrid[split], 0.0, index, ids.qids, k)
            results[split]["lexical"] = replace(lexical_alone, name="lexical")
        log(
            f"fusion with BM25 (α = dense weight, chosen on val over an exact dense search): "
            f"α {fusion['dense_weight']:g}, val success@1 "
            f"{fusion['val_success_1'][str(fusion['dense_weight'])]:.4f} there, "
            f"{results['val']['model'].summary['success_1']:.4f} as served, against "
            f"{results['val']['dense'].summary['success_1']:.4f} dense alone"
        )
    test_queries = splits["test"]
    run_baselines(
        settings,
        vocab,
        index_questions,
        test_queries,
        ids.to_rows(test_queries.query_ids),
        ids.qids,
        results["test"],
        max_len=max_len,
        log=log,
    )
    for split in ("val", "test"):
        for name, result in results[split].items():
            write_run(out_dir / f"{split}.{name}.run", result.run, tag=f"qpr-{name}")

    val, test = results["val"]["model"], results["test"]["model"]
    chosen, threshold, _ = threshold_report(
        val,
        test,
        cfg.target_precision,
        out_dir,
        paths.plots_dir / "evaluate" / "threshold.png",
    )
    write_threshold(
        paths.threshold,
        chosen,
        cfg.target_precision,
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
        metrics["fusion"] = {
            **fusion,
            "candidates": candidates,
            "dense_candidates": lexical.dense_candidates,
            "served": served,
            "dense_test": dict(results["test"]["dense"].summary),
            "dense_val": dict(results["val"]["dense"].summary),
            "lexical_test": dict(results["test"]["lexical"].summary),
            "lexical_val": dict(results["val"]["lexical"].summary),
            "lexical": bm25.settings,  # what the index file holds
        }
    rows_table = [
        {"system": name, **{m: r.summary[m] for m in MEASURES_SHOWN}}
        for name, r in results["test"].items()
    ]
    (out_dir / "results.md").write_text(
        f"# Test split ({test.summary['num_queries']:.0f} queries, k = {k})\n\n"
        + format_table(rows_table, ["system", *MEASURES_SHOWN])
        + "\n"
        + (
            f"\nuntrained: {untrained_description(settings)}.\n"
            if "untrained" in results["test"]
            else ""
        ),
        encoding="utf-8",
    )
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
