#!/usr/bin/env python
"""Latency, recall and throughput of the search service on the Quora index.

    python benchmarks/serve_latency.py              # full run, writes docs/results/
    python benchmarks/serve_latency.py --quick      # ~1 min smoke run on 30k questions,
                                                    # writes reports/benchmarks/
    python benchmarks/serve_latency.py --repeats 5 --out DIR

What it does (every number is measured on this machine, now):

1. Bundle: every distinct question of the Quora copy (../shared/data/quora) is indexed.
   Encoder: the trained one in models/ when that bundle was trained on Quora (its indexed
   questions are Quora questions); otherwise a randomly initialised CNN of the paper's size
   (embedding 300, window 5, 300 channels, output 300; vocabulary = top-50k words of the
   questions + 5k hash bins, max_len 40). Latency does not depend on the weights (same
   shapes, same operations); recall vs exact search does a little (the geometry of the
   vectors decides how well IVF lists separate them). The outputs say which was used.
2. Index: `qpr.retrieval.dense.build_index` with params.yaml's `index.factory` (HNSW32,Flat, built
   with `index.ef_construction`), swept over efSearch; recall@20 against exact (Flat)
   search on "new" questions (sampled questions with one word dropped, so they are not
   stored vectors); the chosen efSearch is the smallest with recall@20 >= 0.98
   (cross-checked with `qpr.retrieval.dense.exact_recall_at_k`). For comparison the paper's
   "IVF2000,Flat" (nlist lowered by `fit_factory` when the corpus is too small) is built
   on the same vectors and swept over nprobe: recall and FAISS time only.
3. In-process latency: `Bundle.search(question, k=10)` one question at a time (tokenise +
   ONNX Runtime with 1 intra-op thread + FAISS with 1 thread), p50/p99 per repeat, and the
   CPU time per question. By part (`InProcess.breakdown`): tokenise, encode, the dense
   search; fused, also BM25 alone and the whole served ranking (`HybridSearch.rank`).
4. HTTP latency: `qpr serve` (uvicorn) in a subprocess on 127.0.0.1; a second process
   sends POST /search one at a time over a keep-alive connection (stdlib http.client);
   bounded in requests and seconds. 3 and 4 run at the chosen efSearch, alternating.
5. Throughput: the second process keeps C requests in flight (C threads, one connection
   each) for a bounded time at the chosen efSearch; requests/s, latency under load,
   errors, and the server's CPU.

--quick indexes a random 30k of the questions (IVF nlist lowered accordingly) and measures
less: a smoke run of the whole procedure in about a minute on an idle machine.

Noise: the machine is shared (other jobs may be training), so each measurement is
repeated, the tables show medians with the range, and the load average and the share of
a core the measurement got (CPU time / wall time) are recorded with every repeat.

Data rules: the Quora file is only read. The bundle (vocabulary, encoder, vectors, index,
question texts) lives in a temporary folder deleted at the end; only numbers reach the
outputs. --quick writes to reports/benchmarks/ unless --out is given, so a smoke run
never overwrites the committed results in docs/results/.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import http.client
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import faiss
import numpy as np
import onnxruntime as ort
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:
    from qpr.artifacts import SearchConfig

# Run as scripts (python benchmarks/x.py): their own folder is on sys.path.
from machine_info import describe
from paper_cnn import ENCODER_KW, HASH_BINS, MAX_LEN, MAX_WORDS

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_QUORA = ROOT.parent / "shared" / "data" / "quora" / "quora_duplicate_questions.tsv"
DEFAULT_OUT = ROOT / "docs" / "results"
QUICK_OUT = ROOT / "reports" / "benchmarks"
NAME = "serve_latency"
SEED = 13

# The index the pipeline builds (params.yaml) and the paper's, measured beside it.
PAPER_FACTORY = "IVF2000,Flat"
# A compressed alternative: IVF over 4-bit PQ codes scanned with SIMD (fast scan), the
# best k·k_factor candidates re-ranked with exact distances (params.yaml refine_k_factor).
FASTSCAN_FACTORY = "IVF1024,PQ150x4fs,RFlat"
FASTSCAN_NPROBES = (16, 32, 64, 96, 128, 192, 256, 384, 512)
FUSION_K = 100  # the most results a request may ask for
RECALL_K = 20
RECALL_TARGET = 0.98
SEARCH_K = 10  # the service's default k
NPROBES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
EF_SEARCHES = (16, 32, 64, 96, 128, 160, 192, 256, 384, 512)
# Targets of issue 6, on 2 cores.
TARGET_INPROC_P50_MS = 1.0
TARGET_INPROC_P99_MS = 5.0
TARGET_HTTP_P50_MS = 5.0


@dataclass(frozen=True)
class Plan:
    repeats: int
    recall_queries: int  # "new" questions for recall@20
    latency_queries: int  # per in-process repeat
    http_requests: int  # per HTTP repeat
    http_max_seconds: float
    load_levels: tuple[int, ...]  # requests in flight
    load_seconds: float
    load_max_requests: int
    nprobes: tuple[int, ...]
    ef_searches: tuple[int, ...]
    fastscan_nprobes: tuple[int, ...] = FASTSCAN_NPROBES
    corpus_limit: int | None = None  # --quick: a random subset, to run in about a minute


FULL = Plan(
    repeats=3,
    recall_queries=2000,
    latency_queries=2000,
    http_requests=2000,
    http_max_seconds=60.0,
    load_levels=(4, 16),
    load_seconds=10.0,
    load_max_requests=100_000,
    nprobes=NPROBES,
    ef_searches=EF_SEARCHES,
)
QUICK = Plan(
    repeats=2,
    recall_queries=500,
    latency_queries=1000,
    http_requests=500,
    http_max_seconds=20.0,
    load_levels=(8,),
    load_seconds=4.0,
    load_max_requests=20_000,
    nprobes=(1, 4, 16, 64, 128, 256, 512),
    ef_searches=(32, 64, 128, 256),
    fastscan_nprobes=(32, 128, 384),
    corpus_limit=30_000,
)


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def percentiles_ms(latencies_s: Sequence[float]) -> dict[str, float]:
    a = np.asarray(latencies_s, dtype=np.float64) * 1e3
    return {
        "p50_ms": round(float(np.percentile(a, 50)), 4),
        "p90_ms": round(float(np.percentile(a, 90)), 4),
        "p99_ms": round(float(np.percentile(a, 99)), 4),
        "mean_ms": round(float(a.mean()), 4),
        "max_ms": round(float(a.max()), 4),
        "n": int(a.size),
    }


def summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
    }


# --------------------------------------------------------------------------------------
# Corpus and bundle
# --------------------------------------------------------------------------------------


@dataclass
class Corpus:
    qids: np.ndarray  # int64 [N]
    texts: list[str]
    clusters: np.ndarray  # int64 [N], -1 = no duplicate
    description: str


def load_corpus(path: Path) -> Corpus:
    from qpr.data.clustering import components
    from qpr.data.loaders import read_quora

    frame, report = read_quora(path)
    questions = pd.concat(
        [
            frame[["qid1", "question1"]].set_axis(["qid", "text"], axis=1),
            frame[["qid2", "question2"]].set_axis(["qid", "text"], axis=1),
        ],
        ignore_index=True,
    ).drop_duplicates("qid")
    dup = frame[frame["is_duplicate"] == 1]
    comp = components(zip(dup["qid1"].tolist(), dup["qid2"].tolist(), strict=True))
    qids = questions["qid"].to_numpy(dtype=np.int64)
    clusters = np.array([comp.get(int(q), -1) for q in qids], dtype=np.int64)
    return Corpus(
        qids=qids,
        texts=questions["text"].tolist(),
        clusters=clusters,
        description=(
            f"Quora copy at ../shared/data/quora ({report.summary()}): {len(qids):,} distinct "
            f"questions indexed, {len(set(comp.values())):,} duplicate clusters"
        ),
    )


def subset(corpus: Corpus, n: int, rng: np.random.Generator) -> Corpus:
    """--quick: n questions drawn at random (fit_factory then lowers nlist to n // 39)."""
    rows = np.sort(rng.choice(len(corpus.texts), size=n, replace=False))
    return Corpus(
        qids=corpus.qids[rows],
        texts=[corpus.texts[int(i)] for i in rows],
        clusters=corpus.clusters[rows],
        description=(
            f"{corpus.description}; --quick: a random {n:,} of them indexed, not all "
            f"{len(corpus.texts):,} (a smoke run: these figures are not the full index's)"
        ),
    )


def trained_quora_bundle(models: Path, texts: list[str]) -> tuple[Path | None, str]:
    """models/ when its bundle indexes Quora questions (= the pipeline ran on Quora)."""
    from qpr.artifacts import QUESTIONS_FILE
    from qpr.retrieval.bundle import Bundle, BundleError

    try:
        Bundle.load(models)
    except (BundleError, ValueError) as exc:
        return None, f"models/ holds no loadable bundle ({str(exc).splitlines()[0][:120]})"
    indexed = pq.read_table(models / QUESTIONS_FILE, columns=["text"]).column("text").to_pylist()
    known = set(texts)
    share = sum(t in known for t in indexed) / max(1, len(indexed))
    if share >= 0.9:
        return models, (
            f"models/ bundle trained on Quora ({share:.0%} of its {len(indexed):,} indexed "
            "questions are Quora questions): its encoder and vocabulary are used"
        )
    return None, (
        f"models/ holds a bundle trained on other data (only {share:.1%} of its "
        f"{len(indexed):,} indexed questions are Quora questions)"
    )


def trained_fusion(models: Path) -> dict[str, Any] | None:
    """The BM25 fusion (α, candidates) the trained bundle's evaluate stage chose, if any,
    with its BM25's settings (stemmer, k1, b) under "bm25"."""
    from qpr.artifacts import BM25_FILE, SearchConfig, SearchConfigError
    from qpr.retrieval.bm25 import BM25Index

    try:
        fusion = SearchConfig.read(models).fusion
    except SearchConfigError:
        return None
    if not fusion:
        return None
    return {**fusion, "bm25": BM25Index.load(models / BM25_FILE).settings}


def make_encoder(out: Path, corpus: Corpus, models: Path) -> dict[str, Any]:
    """vocab.json + encoder.onnx in `out`; says which encoder it is."""
    from qpr.artifacts import ENCODER_FILE, VOCAB_FILE

    trained, why = trained_quora_bundle(models, corpus.texts)
    if trained is not None:
        shutil.copy2(trained / VOCAB_FILE, out / VOCAB_FILE)
        shutil.copy2(trained / ENCODER_FILE, out / ENCODER_FILE)
        return {"kind": "trained", "note": why, "fusion": trained_fusion(trained)}

    import torch

    from qpr.model.cnn import CNNEncoder
    from qpr.model.onnx import export_onnx
    from qpr.text.vocab import Vocabulary

    started = time.perf_counter()
    vocab = Vocabulary.build(corpus.texts, max_words=MAX_WORDS, hash_bins=HASH_BINS)
    vocab.save(out / VOCAB_FILE)
    torch.manual_seed(SEED)
    encoder = CNNEncoder(vocab.size, **ENCODER_KW)
    export_onnx(
        encoder,
        out / ENCODER_FILE,
        metadata={"vocab_sha256": vocab.checksum, "max_len": str(MAX_LEN)},
    )
    return {
        "kind": "random",
        "note": (
            f"{why}; no Quora-trained encoder available, so a RANDOMLY INITIALISED CNN of the "
            "paper's size is used (embedding 300, window 5, 300 channels, output 300; "
            f"vocabulary {vocab.num_words:,} words + {HASH_BINS:,} hash bins from the "
            f"questions; max_len {MAX_LEN}). Nothing was trained. The cost of tokenising and "
            "encoding a question does not depend on the weights; how well IVF lists "
            "separate the vectors, hence the search depth needed for a given recall, does."
        ),
        "vocabulary_words": vocab.num_words,
        "build_seconds": round(time.perf_counter() - started, 2),
        "params": {**ENCODER_KW, "windows": list(ENCODER_KW["windows"]), "max_len": MAX_LEN},
    }


def perturbed(texts: list[str], n: int, rng: np.random.Generator) -> list[str]:
    """ "New" questions: sampled questions with one word dropped (when they have >= 4)."""
    out = []
    for i in rng.choice(len(texts), size=min(n, len(texts)), replace=False):
        words = texts[int(i)].split()
        if len(words) >= 4:
            del words[int(rng.integers(len(words)))]
        out.append(" ".join(words))
    return out


def recall_at_k(approx: np.ndarray, exact: np.ndarray) -> float:
    """Mean |approx ∩ exact| / k, the definition of qpr.retrieval.dense.exact_recall_at_k."""
    k = exact.shape[1]
    hits = [
        len(set(a[a >= 0].tolist()) & set(e.tolist())) for a, e in zip(approx, exact, strict=True)
    ]
    return float(np.mean(hits) / k)


def pipeline_index_params() -> dict[str, Any]:
    """params.yaml's index section: the index the pipeline builds and serves."""
    from qpr.config import load_settings

    cfg = load_settings(ROOT / "params.yaml").index
    return {
        "factory": cfg.factory,
        "ef_construction": cfg.ef_construction,
        "refine_k_factor": cfg.refine_k_factor,
    }


def set_knob(index: faiss.Index, knob: str, value: int) -> None:
    from qpr.retrieval.dense import set_ef_search, set_nprobe

    done = set_nprobe(index, value) if knob == "nprobe" else set_ef_search(index, value)
    if not done:
        raise ValueError(f"this index has no {knob} to set")


def bench_index(
    vectors: np.ndarray,
    queries: np.ndarray,
    self_queries: np.ndarray,
    *,
    factory: str,
    knob: str,
    values: Sequence[int],
    ef_construction: int = 200,
    refine_k_factor: float = 8.0,
) -> tuple[faiss.Index, dict[str, Any]]:
    """Build `factory` on the vectors; recall@20 vs exact and FAISS time per knob value."""
    from qpr.retrieval.dense import IndexConfig, build_index, exact_recall_at_k, search

    notes: list[str] = []
    faiss.omp_set_num_threads(2)  # building: both cores (HNSW inserts on one, see build_index)
    started = time.perf_counter()
    index = build_index(
        vectors,
        IndexConfig(
            factory,
            nprobe=16,
            use_gpu=False,
            ef_construction=ef_construction,
            refine_k_factor=refine_k_factor,
        ),
        seed=SEED,
        log=notes.append,
    )
    build_s = time.perf_counter() - started
    try:
        nlist = int(faiss.extract_index_ivf(index).nlist)
    except RuntimeError:  # not IVF
        nlist = 0
    say(f"index: {' / '.join(n for n in notes if not n.startswith('  graph'))}")

    flat = faiss.IndexFlatL2(vectors.shape[1])
    flat.add(vectors)
    _, exact_new = flat.search(queries, RECALL_K)
    _, exact_self = flat.search(self_queries, RECALL_K)
    sweep = []
    probe_rows = queries[:300]
    for value in values:
        if knob == "nprobe" and value > nlist:
            continue
        set_knob(index, knob, value)
        faiss.omp_set_num_threads(2)
        _, approx_new = search(index, queries, RECALL_K)
        _, approx_self = search(index, self_queries, RECALL_K)
        faiss.omp_set_num_threads(1)  # per-query timing as the service does it
        times, times_fused = [], []
        for row in probe_rows:
            t0 = time.perf_counter()
            search(index, row[None, :], SEARCH_K)
            t1 = time.perf_counter()
            search(index, row[None, :], FUSION_K)
            times.append(t1 - t0)
            times_fused.append(time.perf_counter() - t1)
        sweep.append(
            {
                "value": value,
                "recall_at_20_new": round(recall_at_k(approx_new, exact_new), 4),
                "recall_at_20_indexed": round(recall_at_k(approx_self, exact_self), 4),
                "faiss_p50_ms": round(float(np.median(times)) * 1e3, 4),
                "faiss_p50_ms_k100": round(float(np.median(times_fused)) * 1e3, 4),
            }
        )
        say(
            f"  {factory} {knob} {value:>4}: recall@20 {sweep[-1]['recall_at_20_new']:.4f}, "
            f"FAISS p50 {sweep[-1]['faiss_p50_ms']:.3f} ms"
        )
    good = [row for row in sweep if row["recall_at_20_new"] >= RECALL_TARGET]
    chosen = (good[0] if good else sweep[-1])["value"]
    set_knob(index, knob, chosen)
    faiss.omp_set_num_threads(2)
    library = exact_recall_at_k(index, vectors, queries, RECALL_K)  # the library's figure
    return index, {
        "factory": factory,
        "knob": knob,
        "nlist": nlist,
        "ef_construction": ef_construction if knob == "ef_search" else None,
        "refine_k_factor": refine_k_factor if "RFlat" in factory else None,
        "build_notes": [n for n in notes if not n.startswith("  graph")],
        "build_seconds": round(build_s, 2),
        "index_bytes": _index_bytes(index),
        "recall_queries": int(queries.shape[0]),
        "sweep": sweep,
        "chosen": chosen,
        "chosen_meets_target": bool(good),
        "chosen_recall_exact_recall_at_k": round(library, 4),
    }


def served_sweep(
    index: faiss.Index,
    vectors: np.ndarray,
    queries: np.ndarray,
    questions: list[str],
    bm25: Any,
    fusion: dict[str, Any],
    *,
    knob: str,
    values: Sequence[int],
) -> dict[str, Any]:
    """Recall@20 of the served (fused) ranking against the same fusion over an exact dense
    search, per knob value: what a user of a fused bundle gets from the approximate index.

    Both rankings are the served one (`qpr.retrieval.hybrid.HybridSearch`, the search
    config `write_bundle` writes): BM25's candidates and the index's top max(k,
    dense_candidates), every candidate scored by its exact distance, fused; the reference
    over an IndexFlatL2 of the vectors. BM25's half is found once: no index changes it.
    """
    from qpr.retrieval.dense import recall_against
    from qpr.retrieval.hybrid import HybridSearch, fuse

    faiss.omp_set_num_threads(2)
    config = fused_config(fusion)
    assert config.dense_weight is not None
    flat = faiss.IndexFlatL2(vectors.shape[1])
    flat.add(vectors)
    exact = HybridSearch(flat, config, bm25=bm25)
    lexical = exact.lexical(questions, RECALL_K)
    served = HybridSearch(index, config, bm25=bm25)

    def fused_top(search: HybridSearch) -> np.ndarray:
        found = search.candidates(questions, queries, RECALL_K, lexical=lexical)
        return fuse(found, config.dense_weight, RECALL_K).rows

    reference = fused_top(exact)
    sweep = []
    for value in values:
        set_knob(index, knob, value)
        sweep.append(
            {
                "value": value,
                "served_recall_at_20": round(recall_against(fused_top(served), reference), 4),
            }
        )
        say(f"  served (fused) {knob} {value:>4}: recall@20 {sweep[-1]['served_recall_at_20']:.4f}")
    good = [row for row in sweep if row["served_recall_at_20"] >= RECALL_TARGET]
    chosen = (good[0] if good else sweep[-1])["value"]
    return {"sweep": sweep, "chosen": chosen, "chosen_meets_target": bool(good)}


def _index_bytes(index: faiss.Index) -> int:
    return int(faiss.serialize_index(index).size)


def fused_config(fusion: dict[str, Any] | None) -> SearchConfig:
    """The `SearchConfig` of a bundle served with `fusion` (None: dense only). No threshold
    chosen (nothing was evaluated): every query with a hit is "answered"."""
    from qpr.artifacts import SearchConfig

    if fusion is None:
        return SearchConfig(threshold=None)
    return SearchConfig(
        threshold=None,
        dense_weight=fusion["dense_weight"],
        lexical_candidates=fusion["candidates"],
        dense_candidates=fusion.get("dense_candidates"),
        fused_nprobe=fusion.get("nprobe"),
        fused_ef_search=fusion.get("ef_search"),
    )


def write_bundle(
    out: Path, corpus: Corpus, index: faiss.Index, fusion: dict[str, Any] | None = None
) -> None:
    """The served bundle; with `fusion`, BM25 weights of the corpus and α beside it."""
    from qpr.artifacts import BM25_FILE, IDS_FILE, INDEX_FILE, QUESTIONS_FILE
    from qpr.retrieval.dense import IdMap, save_index

    save_index(index, out / INDEX_FILE)
    IdMap(corpus.qids).save(out / IDS_FILE)
    table = pa.table(
        {
            "question_id": pa.array(corpus.qids, pa.int64()),
            "text": pa.array(corpus.texts, pa.string()),
            "cluster_id": pa.array(corpus.clusters, pa.int64()),
        }
    )
    pq.write_table(table, out / QUESTIONS_FILE)
    fused_config(fusion).write(out)
    if fusion is not None:
        from qpr.retrieval.bm25 import BM25Index

        settings = fusion.get("bm25", {})  # the trained bundle's words, k1 and b
        BM25Index.build(corpus.texts, **settings).save(out / BM25_FILE)


def dense_twin(bundle_dir: Path, out: Path) -> Path:
    """The same bundle without BM25 (links to its files, fusion null): the dense path."""
    from dataclasses import replace

    from qpr.artifacts import (
        ENCODER_FILE,
        IDS_FILE,
        INDEX_FILE,
        QUESTIONS_FILE,
        VOCAB_FILE,
        SearchConfig,
        detect_query_encoder,
    )

    (out / "index").mkdir(parents=True, exist_ok=True)
    for rel in (VOCAB_FILE, ENCODER_FILE, INDEX_FILE, IDS_FILE, QUESTIONS_FILE):
        (out / rel).symlink_to(bundle_dir / rel)
    dense = {
        name: None
        for name in (
            "dense_weight",
            "lexical_candidates",
            "dense_candidates",
            "fused_nprobe",
            "fused_ef_search",
        )
    }
    # The twin links encoder.onnx alone: it declares what its files say (not bundle_dir's).
    config = replace(
        SearchConfig.read(bundle_dir), **dense, query_encoder=detect_query_encoder(out)
    )
    config.write(out)
    return out


# --------------------------------------------------------------------------------------
# In-process latency
# --------------------------------------------------------------------------------------


class InProcess:
    """`Bundle.search` one question at a time, as the service's worker threads call it."""

    def __init__(
        self, bundle_dir: Path, knob: str, value: int, queries: list[str], plan: Plan
    ) -> None:
        from qpr.retrieval.bundle import Bundle
        from qpr.serve.settings import ServeSettings

        faiss.omp_set_num_threads(1)  # as the service sets it (QPR_SERVE_FAISS_THREADS)
        started = time.perf_counter()
        # as the server it starts, which inherits the environment (QPR_SERVE_FOLD_ENCODER)
        fold = ServeSettings.from_env().fold_encoder
        self.bundle = Bundle.load(bundle_dir, threads=1, fold_encoder=fold, **{knob: value})
        self.load_seconds = time.perf_counter() - started
        self.bundle_dir, self.queries, self.plan = bundle_dir, queries, plan
        self.knob, self.value = knob, value
        for q in queries[:200]:  # warm-up
            self.bundle.search(q, k=SEARCH_K)
        self.repeats: list[dict[str, Any]] = []

    def repeat(self) -> dict[str, Any]:
        before_load = loadavg()
        lat = []
        cpu0, wall0 = cpu_seconds(), time.perf_counter()
        for q in self.queries[: self.plan.latency_queries]:
            t0 = time.perf_counter()
            self.bundle.search(q, k=SEARCH_K)
            lat.append(time.perf_counter() - t0)
        wall = time.perf_counter() - wall0
        stats: dict[str, Any] = percentiles_ms(lat)
        cpu = cpu_seconds() - cpu0
        stats.update(
            loadavg=before_load,
            cores_used=round(cpu / wall, 2),
            # CPU time per question: close to the latency on an idle core (a mean, and
            # memory stalls count as CPU time), the steadiest figure on a busy machine.
            cpu_ms_per_query=round(cpu / len(lat) * 1e3, 4),
        )
        self.repeats.append(stats)
        say(
            f"in-process ({self.knob} {self.value}) repeat {len(self.repeats)}: p50 "
            f"{stats['p50_ms']:.3f} ms, p99 {stats['p99_ms']:.3f} ms, "
            f"{stats['cores_used']:.2f} of a core"
        )
        return stats

    def breakdown(self) -> dict[str, float]:
        """Where the time of one question goes (same files, 1 thread), p50 of each part:

        - tokenise: the vocabulary's ``encode``;
        - encode: the bundle's query encoder (folded CNN or ONNX Runtime);
        - search: the dense half alone, FAISS (`qpr.retrieval.hybrid.dense` at the depth
          the served ranking asks the index for: k, or max(k, dense_candidates) fused);
        - bm25 (fused bundles): BM25's half alone (`HybridSearch.lexical`);
        - ranking (fused bundles): the whole served ranking after encoding
          (`HybridSearch.rank`, what `Bundle.search` calls): BM25 on its worker thread
          beside the dense search, the union scored exactly, fused. Its halves overlap
          (and the worker thread adds a hop): it is not search + bm25 + a fusion time.

        A dense bundle's ranking is its search: `HybridSearch.rank` is timed as search."""
        from qpr.artifacts import (
            BM25_FILE,
            ENCODER_FILE,
            INDEX_FILE,
            INPUT_NAME,
            OUTPUT_NAME,
            QUERY_ENCODER_FILE,
            VOCAB_FILE,
        )
        from qpr.retrieval.bm25 import BM25Index
        from qpr.retrieval.dense import load_index
        from qpr.retrieval.encoders import load_session
        from qpr.retrieval.folded import fold_cnn
        from qpr.retrieval.hybrid import HybridSearch, dense
        from qpr.text import load_tokenizer

        vocab = load_tokenizer(self.bundle_dir / VOCAB_FILE)
        folded = session = None
        if self.bundle.encoder_kernel == "folded":  # encode as the bundle does
            folded = fold_cnn(self.bundle_dir / ENCODER_FILE)
        elif self.bundle.encoder_kernel == "onnx-int8":
            session = load_session(self.bundle_dir / QUERY_ENCODER_FILE, threads=1)
        else:
            session = load_session(self.bundle_dir / ENCODER_FILE, threads=1)
        index = load_index(self.bundle_dir / INDEX_FILE, nprobe=None)  # as Bundle.load does
        set_knob(index, self.knob, self.value)
        config = self.bundle.search_config
        bm25 = BM25Index.load(self.bundle_dir / BM25_FILE) if config.fused else None
        ranker = HybridSearch(index, config, bm25=bm25, size=self.bundle.size)
        parts: dict[str, list[float]] = {"tokenise": [], "encode": [], "search": []}
        dense_k = ranker.depth(SEARCH_K)
        if config.fused:
            assert config.dense_candidates is not None
            dense_k = min(max(dense_k, config.dense_candidates), ranker.size)
            parts |= {"bm25": [], "ranking": []}
        for q in self.queries[: min(1000, self.plan.latency_queries)]:
            t0 = time.perf_counter()
            ids = vocab.encode(q)[: self.bundle.max_len] or [1]
            t1 = time.perf_counter()
            if folded is not None:
                vec = folded.encode([ids])
            else:
                assert session is not None
                vec = session.run([OUTPUT_NAME], {INPUT_NAME: np.asarray([ids], dtype=np.int64)})[0]
            t2 = time.perf_counter()
            if config.fused:
                dense(index, vec, dense_k)
            else:
                ranker.rank([q], lambda vec=vec: vec, SEARCH_K)
            t3 = time.perf_counter()
            parts["tokenise"].append(t1 - t0)
            parts["encode"].append(t2 - t1)
            parts["search"].append(t3 - t2)
            if config.fused:
                ranker.lexical([q], SEARCH_K)
                t4 = time.perf_counter()
                ranker.rank([q], lambda vec=vec: vec, SEARCH_K)
                parts["bm25"].append(t4 - t3)
                parts["ranking"].append(time.perf_counter() - t4)
        return {k: round(float(np.median(v)) * 1e3, 4) for k, v in parts.items()}

    def report(self) -> dict[str, Any]:
        return {
            "k": SEARCH_K,
            self.knob: self.value,
            "encoder_kernel": self.bundle.encoder_kernel,
            "load_seconds": round(self.load_seconds, 2),
            "repeats": self.repeats,
            "p50_ms": summary([r["p50_ms"] for r in self.repeats]),
            "p99_ms": summary([r["p99_ms"] for r in self.repeats]),
            "cpu_ms_per_query": summary([r["cpu_ms_per_query"] for r in self.repeats]),
            "breakdown_p50_ms": self.breakdown(),
        }


# --------------------------------------------------------------------------------------
# HTTP: server subprocess, client subprocess
# --------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(
    bundle_dir: Path, knob: str, value: int, log_path: Path
) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = {
        **os.environ,
        f"QPR_SERVE_{knob.upper()}": str(value),
        "QPR_SERVE_POLL_SECONDS": "0",
        "QPR_SERVE_ACCESS_LOG": "false",
        "QPR_SERVE_THREADS": "1",
        "QPR_SERVE_FAISS_THREADS": "1",
    }
    command = [sys.executable, "-m", "qpr.cli", "serve", "--models-dir", str(bundle_dir)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--threads", "1"]
    log_file = open(log_path, "w", encoding="utf-8")  # noqa: SIM115 - lives with the process
    server = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"server exited: {log_path.read_text()[-2000:]}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                conn.close()
                return server, port
            conn.close()
        except OSError:
            pass
        time.sleep(0.25)
    server.kill()
    raise RuntimeError("server not ready within 300 s")


def process_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_client(config: dict[str, Any]) -> dict[str, Any]:
    """Runs in the client process: sequential or concurrent POST /search requests."""
    questions: list[str] = json.loads(Path(config["questions"]).read_text(encoding="utf-8"))
    port, k = config["port"], config["k"]
    bodies = [json.dumps({"question": q, "k": k}).encode() for q in questions]
    headers = {"Content-Type": "application/json"}
    deadline = 0.0  # set after the warm-up
    budget = config["max_requests"]
    lock = threading.Lock()
    latencies: list[float] = []
    errors: list[str] = []
    issued = 0

    def take() -> int | None:
        nonlocal issued
        with lock:
            if issued >= budget or time.monotonic() >= deadline:
                return None
            issued += 1
            return issued

    def worker(offset: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        local: list[float] = []
        i = offset
        while take() is not None:
            body = bodies[i % len(bodies)]
            i += 7
            t0 = time.perf_counter()
            try:
                conn.request("POST", "/search", body=body, headers=headers)
                response = conn.getresponse()
                payload = response.read()
                if response.status != 200:
                    # the status and error code only: a message may quote the question,
                    # and nothing derived from the data may reach the outputs
                    code = json.loads(payload).get("error", "?") if payload[:1] == b"{" else "?"
                    errors.append(f"HTTP {response.status} {code}")
            except (OSError, http.client.HTTPException) as exc:
                errors.append(repr(exc))
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                continue
            local.append(time.perf_counter() - t0)
        conn.close()
        with lock:
            latencies.extend(local)

    # warm-up on one connection (not counted)
    warm = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for body in bodies[: config["warmup"]]:
        warm.request("POST", "/search", body=body, headers=headers)
        warm.getresponse().read()
    warm.close()

    deadline = time.monotonic() + config["max_seconds"]
    cpu0 = cpu_seconds()
    started = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(config["concurrency"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    stats = percentiles_ms(latencies) if latencies else {}
    return {
        **stats,
        "requests": len(latencies),
        "errors": len(errors),
        "error_examples": errors[:3],
        "seconds": round(wall, 3),
        "requests_per_s": round(len(latencies) / wall, 1) if wall > 0 else 0.0,
        "client_cpu_ms_per_request": round((cpu_seconds() - cpu0) / max(1, issued) * 1e3, 4),
    }


def client(
    port: int, questions_file: Path, *, concurrency: int, requests: int, seconds: float
) -> dict:
    config = {
        "port": port,
        "questions": str(questions_file),
        "k": SEARCH_K,
        "concurrency": concurrency,
        "max_requests": requests,
        "max_seconds": seconds,
        "warmup": 100,
    }
    done = subprocess.run(
        [sys.executable, __file__, "client", json.dumps(config)],
        capture_output=True,
        text=True,
        timeout=seconds + 120,
        cwd=ROOT,
    )
    if done.returncode != 0:
        raise RuntimeError(f"client failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


class HttpPoint:
    """One `qpr serve` subprocess at a given efSearch / nprobe, and its measurements."""

    def __init__(
        self, bundle_dir: Path, knob: str, value: int, queries_file: Path, tmp: Path
    ) -> None:
        started = time.perf_counter()
        self.server, self.port = start_server(
            bundle_dir, knob, value, tmp / f"server-{knob}-{value}.log"
        )
        self.ready_seconds = time.perf_counter() - started
        self.knob, self.value, self.queries_file = knob, value, queries_file
        self.sequential: list[dict[str, Any]] = []
        say(
            f"server ({knob} {value}) ready on 127.0.0.1:{self.port} after "
            f"{self.ready_seconds:.1f} s"
        )

    def measure(self, *, concurrency: int, requests: int, seconds: float) -> dict[str, Any]:
        before = loadavg()
        cpu0, wall0 = process_cpu_seconds(self.server.pid), time.perf_counter()
        result = client(
            self.port,
            self.queries_file,
            concurrency=concurrency,
            requests=requests,
            seconds=seconds,
        )
        server_cpu = process_cpu_seconds(self.server.pid) - cpu0
        result.update(
            concurrency=concurrency,
            loadavg=before,
            server_cores=round(server_cpu / (time.perf_counter() - wall0), 2),
            # the client's 100 warm-up requests are in the server's CPU time: counted in
            server_cpu_ms_per_request=round(server_cpu / (result["requests"] + 100) * 1e3, 4),
        )
        return result

    def repeat(self, plan: Plan) -> dict[str, Any]:
        result = self.measure(
            concurrency=1, requests=plan.http_requests, seconds=plan.http_max_seconds
        )
        self.sequential.append(result)
        say(
            f"HTTP ({self.knob} {self.value}) repeat {len(self.sequential)}: p50 "
            f"{result['p50_ms']:.3f} ms, p99 {result['p99_ms']:.3f} ms "
            f"({result['requests']} requests)"
        )
        return result

    def stop(self) -> tuple[str, dict[str, Any]]:
        """Stop the server; returns its /metrics text and /version."""
        try:
            metrics_text = _get(self.port, "/metrics")
            version = json.loads(_get(self.port, "/version"))
        finally:
            self.server.send_signal(signal.SIGTERM)
            try:
                self.server.wait(30)
            except subprocess.TimeoutExpired:
                self.server.kill()
        return metrics_text, version

    def report(self) -> dict[str, Any]:
        seq = self.sequential
        return {
            self.knob: self.value,
            "ready_seconds": round(self.ready_seconds, 2),
            "sequential": seq,
            "p50_ms": summary([r["p50_ms"] for r in seq]),
            "p99_ms": summary([r["p99_ms"] for r in seq]),
            "server_cpu_ms_per_request": summary([r["server_cpu_ms_per_request"] for r in seq]),
            "client_cpu_ms_per_request": summary([r["client_cpu_ms_per_request"] for r in seq]),
        }


def bench_latency(
    bundle_dir: Path,
    knob: str,
    value: int,
    questions: list[str],
    queries_file: Path,
    tmp: Path,
    plan: Plan,
    dense_value: int | None = None,
) -> dict[str, Any]:
    """In-process and HTTP repeats at the chosen operating point, alternated; then the load.

    Alternating puts a busy spell of the shared machine on both paths alike, so their
    difference (HTTP minus in-process) is not an artefact of timing. A fused bundle's
    encoder alone is measured beside it at `dense_value` (the dense ranking's own point).
    """
    server: HttpPoint | None = None
    stopped: tuple[str, dict[str, Any]] | None = None
    try:
        server = HttpPoint(bundle_dir, knob, value, queries_file, tmp)
        inproc = InProcess(bundle_dir, knob, value, questions, plan)
        dense = None
        if inproc.bundle.fusion is not None:
            dense = InProcess(
                dense_twin(bundle_dir, tmp / "dense"),
                knob,
                value if dense_value is None else dense_value,
                questions,
                plan,
            )
        for _ in range(plan.repeats):
            inproc.repeat()
            if dense is not None:
                dense.repeat()
            server.repeat(plan)
        load = []
        for level in plan.load_levels:
            result = server.measure(
                concurrency=level, requests=plan.load_max_requests, seconds=plan.load_seconds
            )
            load.append(result)
            say(
                f"load x{level}: {result['requests_per_s']:.0f} req/s, p50 "
                f"{result['p50_ms']:.2f} ms, p99 {result['p99_ms']:.2f} ms, "
                f"{result['errors']} errors"
            )
    finally:
        if server is not None:
            stopped = server.stop()
    assert stopped is not None
    metrics_text, version = stopped
    served_5xx = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics_text.splitlines()
        if line.startswith("qpr_http_requests_total") and 'status="5' in line
    )
    return {
        "server": "qpr serve (uvicorn, h11, 1 worker process; ORT 1 thread, FAISS 1 thread)",
        "client": "a second Python process, http.client keep-alive connections",
        "points": [
            {
                "knob": knob,
                "value": value,
                "dense_value": value if dense_value is None else dense_value,
                "served": version["model"].get(knob),
                "in_process": inproc.report(),
                "http": server.report(),
                "fusion": inproc.bundle.fusion,
                "in_process_dense": None if dense is None else dense.report(),
            }
        ],
        "load": load,
        "server_5xx": served_5xx,
    }


def _get(port: int, path: str) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path)
    text = conn.getresponse().read().decode()
    conn.close()
    return text


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    import fastapi
    import uvicorn

    return describe(
        ROOT,
        {
            "onnxruntime": ort.__version__,
            "faiss": faiss.__version__,
            "numpy": np.__version__,
            "fastapi": fastapi.__version__,
            "uvicorn": uvicorn.__version__,
        },
    )


def chosen_point(report: dict[str, Any]) -> dict[str, Any]:
    return report["latency"]["points"][0]


def chosen_row(idx: dict[str, Any]) -> dict[str, Any]:
    return next(row for row in idx["sweep"] if row["value"] == idx["chosen"])


def served_row(idx: dict[str, Any]) -> dict[str, Any]:
    """The served (fused) sweep's row at the value the fused bundle is served at."""
    served = idx["served"]
    return next(row for row in served["sweep"] if row["value"] == served["chosen"])


def overhead(p: dict[str, Any]) -> dict[str, float]:
    """HTTP p50 − in-process p50, per repeat (the two alternate within a repeat)."""
    pairs = zip(p["http"]["sequential"], p["in_process"]["repeats"], strict=True)
    return summary([h["p50_ms"] - i["p50_ms"] for h, i in pairs])


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    index = report["index"]
    chosen = chosen_point(report)
    inproc, http_ = chosen["in_process"], chosen["http"]
    rows = []
    served = index.get("served")
    if served is not None:
        rows.append(
            (
                f"recall@20 of the served (fused) results vs exact, {index['knob']} "
                f"{served['chosen']}",
                ">=",
                RECALL_TARGET,
                served_row(index)["served_recall_at_20"],
            )
        )
    rows += [
        (
            f"recall@20 vs exact{' (encoder alone)' if served else ''} at the chosen "
            f"{index['knob']} {index['chosen']}",
            ">=",
            RECALL_TARGET,
            chosen_row(index)["recall_at_20_new"],
        ),
        ("in-process p50 (ms)", "<=", TARGET_INPROC_P50_MS, inproc["p50_ms"]["median"]),
        ("in-process p99 (ms)", "<=", TARGET_INPROC_P99_MS, inproc["p99_ms"]["median"]),
        ("HTTP p50 (ms)", "<=", TARGET_HTTP_P50_MS, http_["p50_ms"]["median"]),
    ]
    out = []
    for what, op, bound, value in rows:
        met = value >= bound if op == ">=" else value <= bound
        out.append({"target": what, "bound": f"{op} {bound}", "measured": value, "met": met})
    return out


def contention_note(repeats: list[dict[str, Any]]) -> str:
    """Say so when the single-threaded measurement did not get a whole core."""
    cores = [r["cores_used"] for r in repeats]
    best = max(repeats, key=lambda r: r["cores_used"])
    least = (
        f" The least contended repeat ({best['cores_used']:.2f} of a core) had p50 "
        f"{best['p50_ms']:.3f} ms and p99 {best['p99_ms']:.3f} ms."
    )
    if min(cores) >= 0.9:
        return f"The in-process measurement got {min(cores):.2f}-{max(cores):.2f} of a core."
    return (
        f"**Contended**: the single-threaded in-process measurement got only "
        f"{min(cores):.2f}-{max(cores):.2f} of a core (CPU time / wall time; load average "
        f"{repeats[0]['loadavg']} on {os.cpu_count()} cores): other jobs held the CPU, so "
        "these latencies are higher than on an idle machine." + least
    )


def nlist_note(idx: dict[str, Any], n: int) -> str:
    lowered = [note for note in idx["build_notes"] if "using IVF" in note]
    if lowered:
        return "lowered by `fit_factory`: " + lowered[0]
    return (
        f"{idx['nlist']} lists need {39 * idx['nlist']:,} training vectors and {n:,} are "
        "there, so `fit_factory` keeps the paper's nlist"
    )


def encoder_words(in_process: dict[str, Any]) -> str:
    """How the measured bundle encoded (runs written before the choice existed: ONNX)."""
    if in_process.get("encoder_kernel", "onnx") == "folded":
        return "the CNN folded into lookup tables, `qpr.retrieval.folded`"
    if in_process.get("encoder_kernel") == "onnx-int8":
        return "ONNX Runtime, the int8 query encoder (`qpr.model.quantize`)"
    return "ONNX Runtime"


def reading(report: dict[str, Any]) -> str:
    """What the figures say, in words, for the encoder that was measured."""
    idx, paper = report["index"], report["paper_index"]
    chosen = chosen_point(report)
    steps = chosen["in_process"]["breakdown_p50_ms"]
    fixed = steps["tokenise"] + steps["encode"]
    ivf = chosen_row(paper)
    text = (
        f"**Reading it.** Tokenising and encoding one question cost {fixed:.2f} ms (p50) "
        f"whatever the index; FAISS adds {steps['search']:.2f} ms at {idx['knob']} "
        f"{chosen['value']}. "
        "An HNSW search visits a few thousand vectors along a graph, so its cost grows "
        "with efSearch and only logarithmically with the corpus; an IVF-Flat search reads "
        "every vector of the probed lists, a share of the whole corpus. For recall@20 >= "
        f"{RECALL_TARGET} the paper's `{paper['factory']}` "
        + (
            f"needs nprobe {paper['chosen']} ({ivf['faiss_p50_ms']:.2f} ms of FAISS per "
            f"question), the served `{idx['factory']}` {chosen_row(idx)['faiss_p50_ms']:.2f} ms."
            if paper["chosen_meets_target"]
            else f"does not get there within nprobe {paper['chosen']} "
            f"(recall {ivf['recall_at_20_new']:.3f}, {ivf['faiss_p50_ms']:.2f} ms)."
        )
    )
    if report["encoder"]["kind"] == "random":
        text += (
            " The encoder here has random weights: its vectors reflect shared words, not "
            "meaning. A trained encoder's vectors have another geometry, so the efSearch "
            "needed for a given recall differs; the benchmark uses models/ automatically "
            "once it holds a Quora-trained bundle."
        )
    return text


def breakdown_words(steps: dict[str, float]) -> str:
    """The in-process p50 by part (`InProcess.breakdown`). A fused bundle's ranking is
    named apart: it holds the search and BM25, overlapped, and the fusion."""
    text = ", ".join(f"{k} {v:.3f} ms" for k, v in steps.items() if k != "ranking")
    if "ranking" in steps:
        text += (
            f"; the whole fused ranking after encoding (search and bm25 overlapped, the "
            f"union scored exactly, fused) {steps['ranking']:.3f} ms"
        )
    return text


def fmt_range(s: dict[str, float], digits: int = 3) -> str:
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def latency_rows(report: dict[str, Any]) -> list[str]:
    rows = []
    for p in report["latency"]["points"]:
        if "served" in report["index"]:
            recall = served_row(report["index"])["served_recall_at_20"]
            label = f"{p['knob']} {p['value']} (served recall@20 {recall:.3f})"
        else:
            recall = chosen_row(report["index"])["recall_at_20_new"]
            label = f"{p['knob']} {p['value']} (recall@20 {recall:.3f})"
        inproc, http_ = p["in_process"], p["http"]
        rows.append(
            f"| in-process `Bundle.search`, {label} | {fmt_range(inproc['p50_ms'])} | "
            f"{fmt_range(inproc['p99_ms'])} | {fmt_range(inproc['cpu_ms_per_query'])} | "
            f"{len(inproc['repeats'])} × {inproc['repeats'][0]['n']} |"
        )
        rows.append(
            f"| HTTP POST /search, {label} | {fmt_range(http_['p50_ms'])} | "
            f"{fmt_range(http_['p99_ms'])} | server "
            f"{fmt_range(http_['server_cpu_ms_per_request'])} + client "
            f"{fmt_range(http_['client_cpu_ms_per_request'])} | {len(http_['sequential'])} × "
            f"{http_['sequential'][0]['requests']} |"
        )
    return rows


def sweep_table(idx: dict[str, Any]) -> list[str]:
    served = {row["value"]: row for row in idx.get("served", {}).get("sweep", [])}
    lines = [
        f"| {idx['knob']} | recall@20, new questions | recall@20, indexed questions "
        "| FAISS p50 (ms), k = 10 | k = 100 |" + (" served (fused) recall@20 |" if served else ""),
        "|---:|---:|---:|---:|---:|" + ("---:|" if served else ""),
    ]
    for row in idx["sweep"]:
        mark = " ←" if row["value"] == idx["chosen"] else ""
        k100 = row.get("faiss_p50_ms_k100")
        line = (
            f"| {row['value']}{mark} | {row['recall_at_20_new']:.4f} | "
            f"{row['recall_at_20_indexed']:.4f} | {row['faiss_p50_ms']:.3f} | "
            f"{'—' if k100 is None else f'{k100:.3f}'} |"
        )
        if served:
            fused = served[row["value"]]["served_recall_at_20"]
            mark = " ←" if row["value"] == idx["served"]["chosen"] else ""
            line += f" {fused:.4f}{mark} |"
        lines.append(line)
    return lines


def chosen_sentence(idx: dict[str, Any]) -> str:
    return (
        f"Chosen: **{idx['knob']} {idx['chosen']}**, the smallest with recall@20 >= "
        f"{RECALL_TARGET} (`qpr.retrieval.dense.exact_recall_at_k` gives "
        f"{idx['chosen_recall_exact_recall_at_k']:.4f} for it)."
        + ("" if idx["chosen_meets_target"] else f" No tested {idx['knob']} reached the target.")
        + served_sentence(idx)
    )


def served_sentence(idx: dict[str, Any]) -> str:
    served = idx.get("served")
    if served is None:
        return ""
    return (
        f" That is the encoder alone. The fused bundle is served at **{idx['knob']} "
        f"{served['chosen']}**, the smallest whose served results (BM25's candidates and "
        "the index's top 20, every candidate scored by its exact distance, fused) keep "
        f"recall@20 >= {RECALL_TARGET} against the same fusion over an exact dense search "
        "(last column"
        + ("" if served["chosen_meets_target"] else f"; no tested {idx['knob']} reached it")
        + ")."
    )


def fusion_lines(chosen: dict[str, Any], bm25: dict[str, Any] | None = None) -> list[str]:
    dense = chosen.get("in_process_dense")
    if not chosen.get("fusion") or not dense:
        return []
    fused = chosen["in_process"]
    words = ""
    if bm25:
        from qpr.retrieval.bm25 import describe_bm25

        words = f"; {describe_bm25(bm25)} like the trained bundle's"
    f = chosen["fusion"]
    sides = (
        f"BM25's {f['candidates']} candidates and the index's top max(k, "
        f"{f['dense_candidates']}), every candidate scored by its exact distance"
        if "dense_candidates" in f
        else f"{f['candidates']} candidates per side"
    )
    dense_at = chosen.get("dense_value", chosen["value"])
    return [
        f"BM25 is fused in (α = {f['dense_weight']:g}{words}, {sides}, as the trained "
        "bundle's evaluate stage chose): the figures above include BM25 and the fusion. The "
        f"same bundle ranking by its encoder alone ({chosen['knob']} {dense_at}), measured "
        f"alternately: p50 {fmt_range(dense['p50_ms'])} ms, p99 {fmt_range(dense['p99_ms'])} "
        f"ms (fused: p50 {fmt_range(fused['p50_ms'])} ms).",
        "",
    ]


def fastscan_lines(report: dict[str, Any]) -> list[str]:
    fs = report.get("fastscan_index")
    if fs is None:  # reports written before this comparison existed
        return []
    hnsw, ivf = chosen_row(report["index"]), chosen_row(fs)
    versus = (
        " It is the served index itself (the table above), built again."
        if fs["factory"] == report["index"]["factory"]
        else f" At the chosen points: {fs['factory']} {ivf['faiss_p50_ms_k100']:.3f} ms against "
        f"{report['index']['factory']} {hnsw['faiss_p50_ms_k100']:.3f} ms at k = 100 "
        f"(recall@20 {ivf['recall_at_20_new']:.4f} vs {hnsw['recall_at_20_new']:.4f}). "
        "Its cost grows linearly with the corpus at a fixed share of lists probed, HNSW's "
        "about logarithmically: the ratio holds at this corpus size, not at every size."
    )
    return [
        f"### IVF over 4-bit PQ codes with exact re-ranking, `{fs['factory']}`, same vectors",
        "",
        f"**nlist {fs['nlist']}** ({nlist_note(fs, report['questions'])}); the best "
        f"{fs['refine_k_factor']:g}·k candidates by PQ "
        "distance are re-ranked with exact distances (params.yaml `index.refine_k_factor`); "
        f"built in {fs['build_seconds']} s, {fs['index_bytes'] / 2**20:.0f} MiB. Set "
        f"`index.factory: {fs['factory']}` and `index.nprobe` to serve it. "
        "The k = 100 column is the most a request may ask for.",
        "",
        *sweep_table(fs),
        "",
        chosen_sentence(fs) + versus,
        "",
    ]


def render_markdown(report: dict[str, Any]) -> str:
    m, idx, paper = report["machine"], report["index"], report["paper_index"]
    chosen = chosen_point(report)
    dim = report["dim"]
    lines = [
        "# Search service latency, recall and throughput",
        "",
        f"Measured {report['finished_at']} by `benchmarks/serve_latency.py"
        f"{' --quick' if report['quick'] else ''}` (working tree of commit "
        f"{str(m['git_commit'])[:12]}{', with uncommitted changes' if m['dirty'] else ''}).",
        "",
        f"**Machine**: {m['cpu_model']}, {m['cpus_usable']} usable cores, {m['memory_gib']} GiB, "
        f"{m['platform']}, Python {m['python']}; onnxruntime {m['versions']['onnxruntime']}, "
        f"faiss {m['versions']['faiss']}, fastapi {m['versions']['fastapi']}, uvicorn "
        f"{m['versions']['uvicorn']}. Shared machine: load average (1/5/15 min) "
        f"{report['loadavg']['start']} at start, {report['loadavg']['end']} at the end; "
        "each repeat's load and the share of a core it got are in the JSON.",
        "",
        f"**Corpus**: {report['corpus']}.",
        "",
        f"**Encoder**: {report['encoder']['note']}",
        "",
        "## Targets (issue 6, 2 cores)",
        "",
        "| target | bound | measured (median of repeats) | met |",
        "|---|---|---|---|",
    ]
    for t in report["targets"]:
        met = "yes" if t["met"] else "**no**"
        lines.append(f"| {t['target']} | {t['bound']} | {t['measured']} | {met} |")
    lines += [
        "",
        "Steadier on a busy machine: in-process CPU time per question (mean) "
        f"{fmt_range(chosen['in_process']['cpu_ms_per_query'])} ms (see below).",
        "",
        "## The index: recall@20 against exact search",
        "",
        f"`{idx['factory']}` ({report.get('index_source', 'params.yaml `index.factory`')}"
        + (
            f", efConstruction {idx['ef_construction']}"
            if idx.get("ef_construction")
            else f", nlist {idx['nlist']}"
        )
        + f") on {report['questions']:,} vectors of {dim} dims; built "
        f"in {idx['build_seconds']} s"
        + (
            " (graph insertion on one thread, for a reproducible index)"
            if idx.get("ef_construction")
            else ""
        )
        + f", {idx['index_bytes'] / 2**20:.0f} MiB. recall@20 = mean |approximate "
        "top-20 ∩ exact top-20| / 20 over "
        f"{idx['recall_queries']:,} new questions (sampled questions with one word dropped) "
        "and over the same number of indexed questions; FAISS time is one query per call, "
        "1 thread, k = 10, measured during the sweep.",
        "",
        *sweep_table(idx),
        "",
        chosen_sentence(idx),
        "",
        f"### The paper's `{paper['factory']}`, same vectors",
        "",
        f"**nlist {paper['nlist']}** ({nlist_note(paper, report['questions'])}); built in "
        f"{paper['build_seconds']} s, {paper['index_bytes'] / 2**20:.0f} MiB.",
        "",
        *sweep_table(paper),
        "",
        chosen_sentence(paper),
        "",
        *fastscan_lines(report),
        "## Single-question latency (k = 10)",
        "",
        f"At the chosen {idx['knob']}, with one `qpr serve` process; in every repeat the "
        "in-process and the HTTP measurement run one after the other, so a busy spell of "
        "the machine hits both alike.",
        "",
        "| path | p50 (ms) | p99 (ms) | CPU ms / question (mean) | repeats × questions |",
        "|---|---:|---:|---:|---:|",
        *latency_rows(report),
        "",
        contention_note(chosen["in_process"]["repeats"]),
        "",
        "Median over repeats (range in brackets). CPU ms / question = the process's CPU "
        "time over the questions it answered: about what the mean latency would be with a "
        "core to itself, so it is the steadier figure when the machine is busy (for HTTP: "
        "the server process's and the client process's CPU per request). In-process p50 by "
        f"step (encoder: {encoder_words(chosen['in_process'])}): "
        + breakdown_words(chosen["in_process"]["breakdown_p50_ms"])
        + ". HTTP adds parsing, validation, a worker-thread hop, JSON of 10 hits, and the "
        "client's own time (Python `http.client`) over a keep-alive connection: HTTP p50 − "
        f"in-process p50 = {fmt_range(overhead(chosen))} ms.",
        "",
        *fusion_lines(chosen, (report["encoder"].get("fusion") or {}).get("bm25")),
        reading(report),
        "",
        f"## Throughput under concurrent load ({idx['knob']} {chosen['value']}, second process, "
        "loopback)",
        "",
        "| requests in flight | requests/s | p50 (ms) | p99 (ms) | errors | server cores used "
        "| seconds |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["latency"]["load"]:
        lines.append(
            f"| {r['concurrency']} | {r['requests_per_s']:.0f} | {r['p50_ms']:.2f} | "
            f"{r['p99_ms']:.2f} | {r['errors']} | {r['server_cores']:.2f} | {r['seconds']:.1f} |"
        )
    lines += [
        "",
        "The client and the server share the machine's cores (and other jobs share them "
        "too), so requests/s is a floor for a server with the cores to itself. One uvicorn "
        "process; searches run in its worker threads (ONNX Runtime and FAISS release the "
        f"GIL). Server 5xx responses during the whole run: {report['latency']['server_5xx']:.0f}.",
        "",
        f"Total run time {report['seconds']:.0f} s.",
        "",
    ]
    return "\n".join(lines)


def write_atomic(path: Path, text: str) -> None:
    # qpr is imported inside functions here, as everywhere in this benchmark.
    from qpr.io import write_text_atomic

    write_text_atomic(path, text)


# --------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quora", type=Path, default=DEFAULT_QUORA)
    parser.add_argument("--models-dir", type=Path, default=ROOT / "models")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--quick", action="store_true", help="~1 min smoke run on a 30k-question subset"
    )
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument(
        "--factory",
        default=None,
        help="serve this FAISS factory instead of params.yaml's index.factory "
        "(e.g. IVF1024,PQ150x4fs,RFlat; its knob, efSearch or nprobe, is swept)",
    )
    parser.add_argument("--name", default=NAME, help="output file stem")
    parser.add_argument(
        "--render",
        type=Path,
        default=None,
        help="only rewrite the Markdown page from an existing serve_latency.json",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render is not None:
        report = json.loads(args.render.read_text(encoding="utf-8"))
        write_atomic(args.render.with_suffix(".md"), render_markdown(report))
        return 0
    plan = QUICK if args.quick else FULL
    if args.repeats:
        plan = dataclasses.replace(plan, repeats=args.repeats)
    out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    if not args.quora.is_file():
        say(f"Quora file not found at {args.quora}: this benchmark measures on it only")
        return 2
    started = time.perf_counter()
    load_start = loadavg()
    say(f"load average at start: {load_start}")
    rng = np.random.default_rng(SEED)
    with tempfile.TemporaryDirectory(prefix="qpr-serve-bench-") as tmp_name:
        tmp = Path(tmp_name)
        bundle_dir = tmp / "models"
        (bundle_dir / "index").mkdir(parents=True)
        corpus = load_corpus(args.quora)
        # the vocabulary and the "trained on Quora?" check see every question
        encoder = make_encoder(bundle_dir, corpus, args.models_dir)
        say(f"encoder: {encoder['kind']}")
        if plan.corpus_limit is not None and plan.corpus_limit < len(corpus.texts):
            corpus = subset(corpus, plan.corpus_limit, rng)
        say(corpus.description)

        from qpr.artifacts import ENCODER_FILE, VOCAB_FILE
        from qpr.retrieval.encoders import encode, load_session
        from qpr.text import load_tokenizer

        vocab = load_tokenizer(bundle_dir / VOCAB_FILE)
        session = load_session(bundle_dir / ENCODER_FILE, threads=2)
        t0 = time.perf_counter()
        vectors = encode(session, vocab, corpus.texts, batch_size=1024, max_len=MAX_LEN)
        encode_s = time.perf_counter() - t0
        say(f"encoded {len(corpus.texts):,} questions in {encode_s:.1f} s")
        new_questions = perturbed(corpus.texts, plan.recall_queries, rng)
        query_vectors = encode(session, vocab, new_questions, max_len=MAX_LEN)
        self_rows = rng.choice(len(corpus.texts), size=plan.recall_queries, replace=False)
        pipeline = pipeline_index_params()
        if args.factory:
            pipeline["factory"] = args.factory
        # The serving knob of the pipeline's index: efSearch for a graph, nprobe for lists.
        knob = "ef_search" if "HNSW" in pipeline["factory"] else "nprobe"
        paper, paper_report = bench_index(
            vectors,
            query_vectors,
            vectors[self_rows],
            factory=PAPER_FACTORY,
            knob="nprobe",
            values=plan.nprobes,
        )
        del paper
        fastscan, fastscan_report = bench_index(
            vectors,
            query_vectors,
            vectors[self_rows],
            factory=FASTSCAN_FACTORY,
            knob="nprobe",
            values=plan.fastscan_nprobes,
            refine_k_factor=pipeline["refine_k_factor"],
        )
        del fastscan
        index, index_report = bench_index(
            vectors,
            query_vectors,
            vectors[self_rows],
            factory=pipeline["factory"],
            knob=knob,
            values=plan.ef_searches if knob == "ef_search" else plan.fastscan_nprobes,
            ef_construction=pipeline["ef_construction"],
            refine_k_factor=pipeline["refine_k_factor"],
        )
        chosen = index_report["chosen"]
        served = chosen  # the knob value the latency is measured at
        dim = int(vectors.shape[1])
        fusion = encoder.get("fusion")
        if fusion is not None and "dense_candidates" in fusion:
            from qpr.retrieval.bm25 import BM25Index

            say("served (fused) recall against the same fusion over an exact dense search")
            bm25 = BM25Index.build(corpus.texts, **fusion.get("bm25", {}))
            index_report["served"] = served_sweep(
                index,
                vectors,
                query_vectors,
                new_questions,
                bm25,
                fusion,
                knob=knob,
                values=[row["value"] for row in index_report["sweep"]],
            )
            served = index_report["served"]["chosen"]
            set_knob(index, knob, served)
            # as the evaluate stage stores it for the service
            depths = ("nprobe", "ef_search")
            fusion = {**{k: v for k, v in fusion.items() if k not in depths}, knob: served}
            del bm25
        write_bundle(bundle_dir, corpus, index, fusion)
        if fusion is not None:
            say(f"BM25 fused in as the trained bundle serves it: {fusion}")
        del index, vectors, session

        latency_questions = perturbed(
            corpus.texts, max(plan.latency_queries, plan.http_requests), rng
        )
        queries_file = tmp / "queries.json"
        queries_file.write_text(json.dumps(latency_questions), encoding="utf-8")
        latency = bench_latency(
            bundle_dir,
            knob,
            served,
            latency_questions,
            queries_file,
            tmp,
            plan,
            dense_value=chosen,
        )

    report: dict[str, Any] = {
        "quick": args.quick,
        "finished_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "loadavg": {"start": load_start, "end": loadavg()},
        "plan": dataclasses.asdict(plan),
        "corpus": corpus.description,
        "questions": len(corpus.texts),
        "encoder": {**encoder, "encode_seconds": round(encode_s, 2)},
        "dim": dim,
        "index": index_report,
        "paper_index": paper_report,
        "index_source": "`--factory`" if args.factory else "params.yaml `index.factory`",
        "fastscan_index": fastscan_report,
        "latency": latency,
        "seconds": round(time.perf_counter() - started, 1),
    }
    report["targets"] = targets(report)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / f"{args.name}.json", json.dumps(report, indent=2) + "\n")
    write_atomic(out / f"{args.name}.md", render_markdown(report))
    say(f"wrote {out / args.name}.json and .md in {report['seconds']:.0f} s")
    for t in report["targets"]:
        say(f"  {t['target']}: {t['measured']} ({t['bound']}) {'met' if t['met'] else 'NOT met'}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "client":
        print(json.dumps(run_client(json.loads(sys.argv[2]))))
        sys.exit(0)
    sys.exit(main())
