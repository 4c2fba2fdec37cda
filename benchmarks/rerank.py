"""Cross-encoder re-ranking on Quora: quality per N re-ranked and the latency it adds.

Protocol (benchmarks/quora_qpr.py's): every question of a split's clusters is a query;
relevant = the other questions of its cluster; the index holds every question; the query
is excluded from its own results; top 20; trec_eval measures (success_1 / success_10 =
P@1 / P@10, recip_rank = MRR, nDCG@10) through `qpr.evaluation`.

- first stage: the bundle's served search (dense + BM25 fused as its search.json says, at
  its served depth), computed over whole splits as the evaluate stage does;
- re-ranked: the first N of those 20 re-ordered by the cross-encoder, N in --tops; a
  pair's score does not depend on the other candidates, so the top 20 are scored once per
  query and every N is read from those scores. N is recommended on the validation split;
  nothing is chosen on test;
- int8 against float32: the served re-ranker scores both splits; the other kind scores a
  seeded sample of test queries (--compare), both measured on that sample;
- latency: one question at a time through `Bundle.search` (k 10), the re-ranker off and
  on at each N (int8 and float32), interleaved question by question, ONNX and FAISS on
  one thread each.

First-stage results and cross-encoder scores are cached in --work (keyed by the bundle's
fingerprint and the re-ranker's files), so a second call only measures what is new.

    python benchmarks/rerank.py --bundle MODELS --clusters CLUSTER_DIR --reranker MODELS2
    python benchmarks/rerank.py --bundle MODELS --clusters CLUSTER_DIR --train --max-epochs 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

# Run as scripts (python benchmarks/x.py): their own folder is on sys.path.
from machine_info import describe

REPO = Path(__file__).resolve().parents[1]
K = 20
MEASURES = ("success_1", "success_10", "recip_rank", "ndcg_cut_10")
Log = Callable[[str], None]


def first_stage(models: Path, queries, work: Path, log: Log) -> tuple[np.ndarray, np.ndarray]:
    """(rows int64 [Q, 20], fused or dense scores) of the bundle's served search with each
    query left out of its results; cached in `work`."""
    from dataclasses import replace

    import pandas as pd

    from qpr.artifacts import (
        BM25_FILE,
        IDS_FILE,
        INDEX_FILE,
        QUESTIONS_FILE,
        SearchConfig,
        served_query_encoder,
    )
    from qpr.retrieval.bm25 import BM25Index
    from qpr.retrieval.bundle import Bundle
    from qpr.retrieval.dense import IdMap, load_index
    from qpr.retrieval.encoders import encode, load_session, onnx_max_len
    from qpr.retrieval.hybrid import HybridSearch
    from qpr.text import load_tokenizer

    fingerprint = Bundle.load(models).fingerprint
    cache = work / f"first_stage_{queries.split}_{len(queries.texts)}_{fingerprint[:16]}.npz"
    if cache.is_file():
        with np.load(cache) as data:
            return data["rows"], data["scores"]
    config = SearchConfig.read(models)
    nprobe, ef_search = config.depth()
    index = load_index(models / INDEX_FILE, nprobe=nprobe, ef_search=ef_search)
    ids = IdMap.load(models / IDS_FILE)
    query_rows = ids.to_rows(queries.query_ids)
    session = load_session(served_query_encoder(models), threads=2)
    log(f"{queries.split}: encoding {len(queries.texts):,} queries")
    vectors = encode(
        session,
        load_tokenizer(models / "vocab.json"),
        queries.texts,
        batch_size=64,
        max_len=onnx_max_len(session),
    )
    # The served first stage (qpr.retrieval.hybrid), the re-ranker left out.
    bm25 = BM25Index.load(models / BM25_FILE) if config.fused else None
    texts = pd.read_parquet(models / QUESTIONS_FILE, columns=["text"])["text"].tolist()
    ordered = [texts[r] for r in np.argsort(IdMap.load(models / IDS_FILE).to_rows(
        pd.read_parquet(models / QUESTIONS_FILE, columns=["question_id"])["question_id"]
        .to_numpy(np.int64)))]  # fmt: skip
    searcher = HybridSearch(index, replace(config, rerank_top=None), bm25=bm25, texts=ordered)
    ranking = searcher.rank(queries.texts, lambda: vectors, K, exclude=query_rows)
    rows = ranking.rows
    scores = -ranking.distances if ranking.scores is None else ranking.scores
    work.mkdir(parents=True, exist_ok=True)
    np.savez(cache, rows=rows, scores=scores)
    return rows, scores


def cross_scores(
    reranker, split: str, texts: list[str], candidates: list[list[str]], work: Path, log: Log
) -> np.ndarray:
    """float32 [Q, 20]: the re-ranker's score of each query's first-stage candidates (NaN
    where a query has fewer); cached in `work` per re-ranker file, saved as it goes."""
    from qpr.io import file_sha256

    key = file_sha256(reranker.path)[:16]
    cache = work / f"scores_{split}_{len(texts)}_{key}.npy"
    scores = np.load(cache) if cache.is_file() else np.full((len(texts), K), np.nan, np.float32)
    todo = [i for i in range(len(texts)) if np.isnan(scores[i, 0]) and candidates[i]]
    started, last = time.perf_counter(), time.perf_counter()
    for done, i in enumerate(todo, 1):
        scores[i, : len(candidates[i])] = reranker.scores(texts[i], candidates[i])
        if time.perf_counter() - last > 60 or done == len(todo):
            np.save(cache, scores)
            rate = done * K / (time.perf_counter() - started)
            log(f"{split}: scored {done:,} / {len(todo):,} queries ({rate:,.0f} pairs/s)")
            last = time.perf_counter()
    return scores


def measured(queries, rows: np.ndarray, row_to_qid: np.ndarray) -> dict[str, float]:
    """trec_eval means of rows [Q, 20] in the order given."""
    from qpr.evaluation.queries import score_system

    ranks = np.broadcast_to(-np.arange(rows.shape[1], dtype=np.float64), rows.shape)
    result = score_system("x", queries, rows, ranks, row_to_qid, higher_is_better=True, seconds=0.0)
    return {m: round(result.summary[m], 4) for m in MEASURES} | {
        "queries": int(result.summary["num_queries"])
    }


def reranked_rows(rows: np.ndarray, scores: np.ndarray, top: int) -> np.ndarray:
    """rows with each query's first `top` re-ordered by score (highest first, ties by
    first-stage rank), the rest as they were."""
    out = rows.copy()
    head = np.where(np.isnan(scores[:, :top]), -np.inf, scores[:, :top])
    order = np.argsort(-head, axis=1, kind="stable")
    out[:, :top] = np.take_along_axis(rows[:, :top], order, axis=1)
    return out


def serving_dirs(models: Path, reranker_models: Path, work: Path, tops: list[int]) -> dict:
    """Bundles to time, as symlink folders in `work`: the first stage alone, and with
    rerank_top N for each N, the re-ranker's int8 and float32 models."""
    from qpr.artifacts import RERANK_CONFIG_FILE, RERANK_DIR, SearchConfig

    config = SearchConfig.read(models)
    source = reranker_models / RERANK_DIR
    rerank_config = json.loads((reranker_models / RERANK_CONFIG_FILE).read_text())
    # int8 is timed too when its file is there, served or not (the stage's gate may drop it)
    kinds = ["int8", "float32"] if (source / "model.int8.onnx").is_file() else ["float32"]
    dirs: dict[str, Path] = {}
    for name, top, kind in [("off", None, None)] + [
        (f"N {top} {kind}", top, kind) for top in tops for kind in kinds
    ]:
        folder = work / "bundles" / name.replace(" ", "_")
        folder.mkdir(parents=True, exist_ok=True)
        for item in models.iterdir():
            if item.name not in ("search.json", "rerank") and not (folder / item.name).exists():
                (folder / item.name).symlink_to(item.resolve())
        SearchConfig(**{**config.__dict__, "rerank_top": top}).write(folder)
        if top is not None:
            (folder / "rerank").mkdir(exist_ok=True)
            for item in source.iterdir():
                if item.name != "config.json" and not (folder / "rerank" / item.name).exists():
                    (folder / "rerank" / item.name).symlink_to(item.resolve())
            own = {**rerank_config, "int8": kind == "int8"}
            (folder / RERANK_CONFIG_FILE).write_text(json.dumps(own))
        dirs[name] = folder
    return dirs


def latency(dirs: dict[str, Path], questions: list[str], log: Log) -> dict[str, dict]:
    """p50 / p99 ms of Bundle.search(k 10), one question at a time, every bundle in turn
    for each question (so load drifts hit all alike); 30 warm-up questions."""
    import faiss

    from qpr.retrieval.bundle import Bundle

    faiss.omp_set_num_threads(1)
    bundles = {name: Bundle.load(folder, threads=1) for name, folder in dirs.items()}
    times: dict[str, list[float]] = {name: [] for name in bundles}
    for position, question in enumerate(questions):
        for name, bundle in bundles.items():
            started = time.perf_counter()
            bundle.search(question, k=10)
            if position >= 30:
                times[name].append(time.perf_counter() - started)
    log(f"latency: {len(questions) - 30} questions x {len(bundles)} bundles")
    out = {}
    for name, values in times.items():
        values.sort()
        out[name] = {
            "p50_ms": round(statistics.median(values) * 1e3, 2),
            "p99_ms": round(values[int(0.99 * (len(values) - 1))] * 1e3, 2),
            "questions": len(values),
        }
    return out


def train(
    clusters: Path, work: Path, epochs: int, max_teacher_cosine: float | None, log: Log
) -> tuple[Path, dict]:
    """The rerank stage with params.yaml's rerank section (enabled, `epochs` at most,
    `max_teacher_cosine` when given) on the cluster outputs; returns its models folder
    and metrics."""
    from qpr.config import load_settings, settings_from_dict
    from qpr.paths import ProjectPaths
    from qpr.pipeline.rerank import run_rerank

    root = work / "train"
    (root / "artifacts").mkdir(parents=True, exist_ok=True)
    link = root / "artifacts" / "cluster"
    if not link.exists():
        link.symlink_to(clusters.resolve())
    raw = load_settings(REPO / "params.yaml").model_dump(mode="json")
    raw["rerank"] |= {"enabled": True, "max_epochs": epochs}
    if max_teacher_cosine is not None:
        raw["rerank"]["max_teacher_cosine"] = max_teacher_cosine
    metrics = run_rerank(settings_from_dict(raw), ProjectPaths(root), log=log)
    return root / "models", metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, required=True, help="a models/ folder")
    parser.add_argument("--clusters", type=Path, required=True, help="cluster outputs")
    parser.add_argument("--reranker", type=Path, help="a models/ folder holding rerank/")
    parser.add_argument("--train", action="store_true", help="train one into --work first")
    parser.add_argument("--max-epochs", type=int, default=1, help="training passes")
    parser.add_argument(
        "--max-teacher-cosine",
        type=float,
        help="with --train: no negative the packaged encoder puts this close to its question",
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/qpr-rerank-benchmark"))
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "results")
    parser.add_argument("--tops", default="3,5,10,20")
    parser.add_argument("--compare", type=int, default=2000, help="test queries, other kind")
    parser.add_argument("--latency-questions", type=int, default=300)
    parser.add_argument("--val-queries", type=int, help="a seeded sample (default: all)")
    parser.add_argument("--test-queries", type=int, help="a seeded sample (default: all)")
    args = parser.parse_args()
    if args.train == (args.reranker is not None):
        raise SystemExit("give --reranker or --train, one of the two")

    def log(message: str) -> None:
        print(f"[{datetime.now(UTC):%H:%M:%S}] {message}", flush=True)

    trained = None
    reranker_models = args.reranker
    if args.train:
        reranker_models, trained = train(
            args.clusters, args.work, args.max_epochs, args.max_teacher_cosine, log
        )
    tops = [int(t) for t in args.tops.split(",")]
    results = measure(args, reranker_models, tops, log)
    results["training"] = trained or _training_note(reranker_models)
    write(args.out, results)
    log(f"wrote {args.out / 'rerank.json'} and rerank.md")


def measure(args, reranker_models: Path, tops: list[int], log: Log) -> dict[str, Any]:
    """Quality per split and N, int8 against float32 on a test sample, and latency."""
    from qpr.evaluation.queries import query_set
    from qpr.retrieval.dense import IdMap
    from qpr.retrieval.reranker import Reranker

    questions = pd.read_parquet(args.clusters / "questions.parquet")
    row_to_qid = IdMap.load(args.bundle / "index" / "index.ids.npy").qids
    texts = pd.read_parquet(args.bundle / "index" / "questions.parquet")
    text_of = dict(zip(texts["question_id"], texts["text"], strict=True))
    served = Reranker.load(reranker_models, threads=2)
    quality: dict[str, Any] = {}
    compare: dict[str, Any] = {}
    for split in ("val", "test"):
        wanted = args.val_queries if split == "val" else args.test_queries
        queries = _sampled(query_set(questions, split), wanted)
        rows, _ = first_stage(args.bundle, queries, args.work, log)
        candidates = [[text_of[row_to_qid[r]] for r in q if r >= 0] for q in rows]
        scores = cross_scores(served, split, queries.texts, candidates, args.work, log)
        quality[split] = {"first stage": measured(queries, rows, row_to_qid)} | {
            f"N {top}": measured(queries, reranked_rows(rows, scores, top), row_to_qid)
            for top in tops
        }
        if split == "test" and args.compare:
            compare = _compare_kinds(
                args,
                reranker_models,
                served,
                queries,
                rows,
                scores,
                tops,
                candidates,
                row_to_qid,
                log,
            )
    best = max(tops, key=lambda t: (quality["val"][f"N {t}"]["success_1"], -t))
    rng = np.random.default_rng(13)
    test = query_set(questions, "test").texts
    sample = [test[i] for i in rng.permutation(len(test))[: args.latency_questions + 30]]
    dirs = serving_dirs(args.bundle, reranker_models, args.work, tops)
    return {
        "quality": quality,
        "recommended_top": best,
        "served_kind": "int8" if served.int8 else "float32",
        "int8_vs_float32": compare,
        "latency": latency(dirs, sample, log),
        "load_after_latency": [round(v, 2) for v in os.getloadavg()],
        "split_queries": {s: len(query_set(questions, s).texts) for s in ("val", "test")},
        "bundle": str(args.bundle),
        "reranker": str(reranker_models),
        "machine": describe(REPO, _versions()),
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _sampled(queries, size: int | None, seed: int = 13):
    """A seeded sample of `size` queries of a QuerySet, in their order (all with None)."""
    from dataclasses import replace

    if size is None or size >= len(queries.texts):
        return queries
    pick = np.sort(np.random.default_rng(seed).permutation(len(queries.texts))[:size])
    kept = queries.query_ids[pick]
    return replace(
        queries,
        query_ids=kept,
        texts=[queries.texts[i] for i in pick],
        qrels={str(q): queries.qrels[str(q)] for q in kept},
    )


def _compare_kinds(
    args, reranker_models, served, queries, rows, scores, tops, candidates, row_to_qid, log: Log
) -> dict[str, Any]:
    """Both kinds on a seeded sample of test queries: measures, top-1 agreement."""
    from dataclasses import replace

    other_path = reranker_models / "rerank" / ("model.onnx" if served.int8 else "model.int8.onnx")
    if not other_path.is_file():
        return {"note": f"{other_path.name} absent: the int8 copy was not kept"}
    from qpr.retrieval.encoders import load_session

    other = replace(
        served, session=load_session(other_path, threads=2), path=other_path, int8=not served.int8
    )
    pick = np.sort(np.random.default_rng(7).permutation(len(queries.texts))[: args.compare])
    sub_queries = replace(
        queries,
        query_ids=queries.query_ids[pick],
        texts=[queries.texts[i] for i in pick],
        qrels={str(q): queries.qrels[str(q)] for q in queries.query_ids[pick]},
    )
    other_scores = cross_scores(
        other, "test-sample", sub_queries.texts, [candidates[i] for i in pick], args.work, log
    )
    kinds = {
        "int8" if served.int8 else "float32": scores[pick],
        "float32" if served.int8 else "int8": other_scores,
    }
    out: dict[str, Any] = {"queries": len(pick)}
    for kind, kind_scores in kinds.items():
        out[kind] = {
            f"N {t}": measured(sub_queries, reranked_rows(rows[pick], kind_scores, t), row_to_qid)
            for t in tops
        }
    a, b = (np.where(np.isnan(s), -np.inf, s) for s in kinds.values())
    out["top1_agreement_at_20"] = round(float((a.argmax(1) == b.argmax(1)).mean()), 4)
    return out


def _training_note(reranker_models: Path) -> dict:
    config = json.loads((reranker_models / "rerank" / "config.json").read_text())
    metrics = reranker_models.parent / "metrics.json"
    return config | (json.loads(metrics.read_text()) if metrics.is_file() else {})


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    return {p: md.version(p) for p in ("onnxruntime", "torch", "tokenizers", "faiss-cpu")}


def write(out: Path, results: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "rerank.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    (out / "rerank.md").write_text(markdown(results))


def markdown(results: dict[str, Any]) -> str:
    from qpr.evaluation.trec import format_table

    machine = results["machine"]
    lines = [
        "# Cross-encoder re-ranking on Quora",
        "",
        "Written by `benchmarks/rerank.py`. Protocol: every question of a split's clusters is "
        "a query, relevant = the other questions of its cluster, the query left out of its "
        "own results, top 20, trec_eval measures (P@N = success@N, MRR = recip_rank). The "
        "first stage is the bundle's served search; `N n` re-orders its first n hits by the "
        "cross-encoder. N is recommended on validation; nothing is chosen on test.",
        "",
        f"Machine: {machine['cpu_model']}, {machine['cpus_usable']} usable cores (shared with "
        f"other jobs while measured), commit {str(machine['git_commit'])[:10]}, "
        f"{results['measured_at']}. Bundle `{results['bundle']}`; re-ranker "
        f"`{results['reranker']}` (served: {results['served_kind']}).",
        "",
    ]
    for split in ("val", "test"):
        table = [{"system": name, **values} for name, values in results["quality"][split].items()]
        lines += [
            f"## {split}: {results['quality'][split]['first stage']['queries']:,} of the "
            f"{results['split_queries'][split]:,} queries (a seeded sample where fewer)",
            "",
            format_table(table, ["system", *MEASURES, "queries"], floatfmt=".4f"),
            "",
        ]
    lines += [f"Recommended on validation: N {results['recommended_top']}.", ""]
    latency = [{"bundle": name, **values} for name, values in results["latency"].items()]
    lines += [
        "## Latency (Bundle.search, k 10, one question at a time, 1 thread)",
        "",
        format_table(latency, ["bundle", "p50_ms", "p99_ms", "questions"], floatfmt=".2f"),
        "",
    ]
    if "load_after_latency" in results:
        lines += [f"Load average (1, 5, 15 min) after timing: {results['load_after_latency']}.", ""]
    compare = results["int8_vs_float32"]
    if compare.get("queries"):
        lines += [f"## int8 against float32 ({compare['queries']} test queries, seeded)", ""]
        rows = [
            {"kind": kind, "N": top, **values}
            for kind in ("float32", "int8")
            for top, values in compare[kind].items()
        ]
        lines += [
            format_table(rows, ["kind", "N", *MEASURES], floatfmt=".4f"),
            "",
            f"Same top candidate of 20: {compare['top1_agreement_at_20']}.",
            "",
        ]
    lines += ["## Training", "", "```json", json.dumps(results["training"], indent=2), "```", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
