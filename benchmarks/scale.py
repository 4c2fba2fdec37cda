"""How QPR's cost grows with the corpus: 134k (Quora), 1M, 3M and 10M questions.

    make bench-scale                    # every size, resumable
    python benchmarks/scale.py --sizes quora,1M --work /data/qpr-scale
    python benchmarks/scale.py --sizes 1M,10M --dense 2 --out docs/results/scale_rerun

For each size: the corpus (Quora's distinct questions, or `qpr.data.scale` shards), an
index built in shards by `qpr.retrieval.indexer.Indexer` (encode, FAISS, BM25: time and
peak RSS, in a child process), the bundle loaded as the service loads it (time, RSS), and
fused queries one at a time in process: p50 / p99, P@1 against the query's cluster, and the
dense search's recall@20 against exact search over the float32 vectors. The cluster stage
has its own benchmark, benchmarks/cluster_scale.py. nprobe is the
smallest of a grid reaching recall@20 0.98 on half of the queries (reported on the other
half). At 1M the refine store and the PQ width are chosen among a few factories by the
same measure. Results: docs/results/scale.{json,md} and scale.png (log-log, with the fitted
growth exponent of each cost).

Every step writes `<work>/<size>/<step>.json`; a killed run resumes at the first step
without one. The encoders are CNNs trained here on 300k synthetic questions and on Quora
(two epochs each, the same weights on any host), exported and served folded, as the
pipeline does.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
# quora: its distinct questions; 134k: a synthetic corpus of the same size, to compare them
SIZES = {"quora": 134_091, "134k": 134_091, "1M": 1_000_000, "3M": 3_000_000, "10M": 10_000_000}
QUORA = ROOT.parent / "shared" / "data" / "quora" / "quora_duplicate_questions.tsv"
QUERIES = 1000
# Up to half the lists: where served recall 0.98 is out of reach, the curve says what it costs
NPROBES = (8, 16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 4096, 8192)
K_FACTORS = (8, 32)  # candidates re-ranked a wanted result (refine factories)
TARGET_RECALL = 0.98
FUSED_TRUTH = "fused_truth.npy"  # the served ranking over an exact dense search
# The CNN here outputs 128 dimensions (docs/models.md: on Quora it tied with 300 once BM25
# is fused in, and searched ~40 % faster): float32 vectors of 10M questions take 5.1 GB.
DIM = 128
# A flat coarse quantizer: an HNSW one (IVF4096_HNSW32) returned poor lists at large nprobe
# (recall@20 of IVF1024_HNSW32,Flat 0.87 at nprobe 512 against 0.995 with a flat one).
CANDIDATES = ("IVF{nlist},PQ{m}x4fs,RFlat", "IVF{nlist},PQ{m}x4fs,Refine(SQ8)",
              "IVF{nlist},PQ{m}x4fs,Refine(SQfp16)")  # fmt: skip
# A 10M index must leave room for BM25 (~1 GB), the texts (~1.5 GB) and the encoder
INDEX_BUDGET_10M = 4e9


def log(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def nlist_for(n: int) -> int:
    """A power of two near 4·sqrt(N) (FAISS's guideline), at most N / 39."""
    want = 2 ** round(np.log2(4 * np.sqrt(n)))
    return int(min(want, 2 ** int(np.log2(max(n // 39, 1)))))


def step(work: Path, name: str, fn: Any, *args: Any) -> dict[str, Any]:
    """fn's result, from `<work>/<name>.json` when a finished run left it."""
    done = work / f"{name}.json"
    if done.is_file():
        return json.loads(done.read_text())
    work.mkdir(parents=True, exist_ok=True)
    result = fn(*args)
    tmp = done.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(done)
    return result


def child(args: list[str]) -> dict[str, Any]:
    """Run this file with `args` in a child process: its JSON line, its peak RSS and time."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    out = []
    for line in proc.stdout:  # type: ignore[union-attr]
        print(line, end="", flush=True)
        out.append(line)
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise RuntimeError(f"{args} failed with status {status}")
    result = json.loads([line for line in out if line.startswith("{")][-1])
    result["peak_rss_gb"] = usage.ru_maxrss / 1024**2
    result["wall_s"] = time.perf_counter() - started
    return result


# ---------------------------------------------------------------- models and corpora


def train_model(work: Path, source: str) -> dict[str, Any]:
    """A CNN trained and exported by the pipeline's own stage functions."""
    import yaml

    from qpr.config import settings_from_dict
    from qpr.data.scale import ScaleSpec, write_scale_corpus
    from qpr.paths import ProjectPaths
    from qpr.pipeline.cluster import run_cluster
    from qpr.pipeline.export import run_export
    from qpr.pipeline.train import run_train

    # The paper's CNN: params.yaml's `auto` keys then take the CNN's values (the product
    # default there is the packaged transformer, too slow to encode 10M questions here)
    raw = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    raw["model"]["encoder"] = "cnn"
    if source == "quora":
        raw["data"].update(source="quora", path=str(QUORA))
    else:
        logs = work / "logs"
        write_scale_corpus(ScaleSpec(300_000, seed=99, shard_rows=100_000), logs, log=log)
        raw["data"].update(source="logs", path=str(logs))
    # Two whole epochs, no time budget: a budget cut where the machine's speed put it, so
    # another host trained another encoder and built another corpus of vectors
    raw["train"].update(time_budget_s=None, max_epochs=2)
    raw["model"].update(output_dim=DIM)
    settings = settings_from_dict(raw)
    paths = ProjectPaths(work)
    started = time.perf_counter()
    run_cluster(settings, out_dir=paths.cluster_dir, report_dir=work / "reports", log=log)
    trained = run_train(settings, paths, progress=False, log=log)
    run_export(settings, paths, log=log)
    return {"seconds": time.perf_counter() - started, "metrics": trained.metrics}


def quora_corpus(work: Path, model: Path) -> dict[str, Any]:
    """Quora's distinct questions, QUERIES of them (from clusters of 2+) held out as queries."""
    from qpr.paths import ProjectPaths
    from qpr.pipeline.handoff import read_cluster_outputs

    questions, _ = read_cluster_outputs(ProjectPaths(model))
    questions = questions.sort_values("question_id").reset_index(drop=True)
    sizes = questions.groupby("cluster_id")["question_id"].transform("size")
    rng = np.random.default_rng(5)
    held = rng.choice(np.flatnonzero(sizes.to_numpy() >= 2), QUERIES, replace=False)
    queries = questions.iloc[held]
    kept = questions.drop(index=held)
    shards = work / "shards"
    shards.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame({"question": kept["text"], "cluster_id": kept["cluster_id"]})
    frame.to_parquet(shards / "logs-00000.parquet", index=False)
    pd.DataFrame({"question": queries["text"], "cluster_id": queries["cluster_id"]}).to_parquet(
        work / "queries.parquet", index=False
    )
    return {"questions": len(kept), "shards": 1, "seconds": 0.0}


def synthetic_corpus(work: Path, n: int) -> dict[str, Any]:
    from qpr.data.scale import ScaleSpec, scale_queries, write_scale_corpus

    spec = ScaleSpec(n, seed=13)
    started = time.perf_counter()
    paths = write_scale_corpus(spec, work / "shards", log=log)
    seconds = time.perf_counter() - started
    queries = scale_queries(spec, QUERIES)
    queries["cluster_id"] = [cluster_number(a) for a in queries["answer_id"]]
    queries[["question", "cluster_id"]].to_parquet(work / "queries.parquet", index=False)
    return {
        "questions": n,
        "shards": len(paths),
        "seconds": seconds,
        "bytes": sum(p.stat().st_size for p in paths),
    }


def cluster_number(answer_id: str) -> int:
    """'s3c17' (shard 3, cluster 17) → 3·10⁷ + 17."""
    shard, cluster = answer_id[1:].split("c")
    return int(shard) * 10_000_000 + int(cluster)


def shard_files(work: Path) -> list[Path]:
    return sorted((work / "shards").glob("logs-*.parquet"))


# ---------------------------------------------------------------- the build (child process)


def vectors_dir(root: Path, size: str) -> Path:
    """Where a size's encoded shards and BM25 counts live while it is built."""
    return root / f"vectors-{size}"


def fresh_build(root: Path, work: Path, size: str) -> bool:
    """Before a size's build: its task files are removed, so the timings are of a whole
    build, unless a killed build of it left them (then it resumes, and says so)."""
    started = work / "build.started"
    if started.is_file():
        return False
    shutil.rmtree(vectors_dir(root, size), ignore_errors=True)
    started.touch()
    return True


def build(work: Path, model: Path, factory: str, engine: str, vectors: Path) -> dict[str, Any]:
    """Index the size's shards into `<work>/models` as a servable bundle."""
    from qpr.artifacts import (
        BM25_FILE,
        ENCODER_FILE,
        INDEX_FILE,
        QUESTIONS_FILE,
        VOCAB_FILE,
        SearchConfig,
    )
    from qpr.config import LexicalSettings
    from qpr.retrieval.dense import IdMap, IndexConfig, save_index
    from qpr.retrieval.indexer import Indexer

    sys.path.insert(0, str(ROOT))
    from flows.engine import mapper

    shards = shard_files(work)
    indexer = Indexer(
        config=IndexConfig(factory, nprobe=64, refine_k_factor=8),
        encoder=model / "models" / ENCODER_FILE,
        vocab=model / "models" / VOCAB_FILE,
        work_dir=vectors,
        engine=mapper(engine, num_cpus=2, log=log),
    )
    made = indexer.index(shards, log=log)
    bundle = work / "models"
    (bundle / "index").mkdir(parents=True, exist_ok=True)
    for name in (ENCODER_FILE, VOCAB_FILE):
        shutil.copy2(model / "models" / name, bundle / name)
    started = time.perf_counter()
    index_path = save_index(made.index, bundle / INDEX_FILE)
    IdMap(np.arange(made.rows, dtype=np.int64)).save(IdMap.path_for(index_path))
    if made.bm25 is not None:
        made.bm25.save(bundle / BM25_FILE)
    write_questions(shards, bundle / QUESTIONS_FILE)
    # The fusion as the pipeline serves it, at the product's depths; α 0.5, not tuned here
    # (cost, not quality)
    lexical = LexicalSettings()
    SearchConfig(
        dense_weight=0.5,
        lexical_candidates=lexical.candidates,
        dense_candidates=lexical.dense_candidates,
    ).write(bundle)
    made.seconds["write"] = time.perf_counter() - started
    return {
        "factory": factory,
        "vectors": [str(p) for p in indexer.vector_files(shards)],  # row order
        "rows": made.rows,
        "seconds": made.seconds,
        "bytes": {p.name: p.stat().st_size for p in (bundle / "index").iterdir()},
    }


def write_questions(shards: list[Path], path: Path) -> None:
    """questions.parquet (question_id = row, text, cluster_id, and answer_id where the
    shards have one, so hits carry it as served), one shard at a time."""
    answers = "answer_id" in pq.read_schema(shards[0]).names
    schema = pa.schema(
        [("question_id", pa.int64()), ("text", pa.string()), ("cluster_id", pa.int64())]
        + ([("answer_id", pa.string())] if answers else [])
    )
    row = 0
    with pq.ParquetWriter(path, schema) as writer:
        for shard in shards:
            table = pq.read_table(shard)
            n = table.num_rows
            if "cluster_id" in table.column_names:
                clusters = table.column("cluster_id").to_numpy()
            else:
                clusters = np.asarray(
                    [cluster_number(a) for a in table.column("answer_id").to_pylist()]
                )
            columns = {
                "question_id": np.arange(row, row + n, dtype=np.int64),
                "text": table.column("question"),
                "cluster_id": clusters.astype(np.int64),
            }
            if answers:
                columns["answer_id"] = table.column("answer_id").cast(pa.string())
            writer.write_table(pa.table(columns, schema=schema))
            row += n


# ---------------------------------------------------------------- exact search and serving


def exact_truth(work: Path, k: int = 20) -> dict[str, Any]:
    """The references recall is measured against, over an exact index (IndexFlatL2) of the
    float32 vectors, filled shard by shard: each query's exact top k (truth.npy) and the
    fused top k the bundle would serve over it (fused_truth.npy): the served ranking,
    `qpr.retrieval.hybrid.HybridSearch`, with the bundle's search config and BM25. The
    exact index holds every vector: N·d·4 bytes, 5.1 GB at 10M."""
    import faiss

    from qpr.artifacts import BM25_FILE
    from qpr.retrieval.bm25 import BM25Index
    from qpr.retrieval.bundle import Bundle
    from qpr.retrieval.hybrid import HybridSearch, dense

    bundle = Bundle.load(work / "models", fold_encoder=True)
    queries = pd.read_parquet(work / "queries.parquet")["question"].tolist()
    vectors = np.vstack([bundle._embed([bundle._tokens(q, 0, 1)]) for q in queries])
    config = bundle.search_config
    del bundle
    exact = faiss.IndexFlatL2(vectors.shape[1])
    for block in built_vectors(work).chunks():
        exact.add(block)
    np.save(work / "truth.npy", dense(exact, vectors, k).rows)
    served = HybridSearch(exact, config, bm25=BM25Index.load(work / "models" / BM25_FILE))
    np.save(work / FUSED_TRUTH, served.rank(queries, lambda: vectors, k).rows)
    return {"queries": len(queries), "k": k, "rows": int(exact.ntotal)}


def built_vectors(work: Path) -> Any:
    """The size's vector shards, in row order, as its build step recorded them."""
    from qpr.retrieval.dense import VectorShards

    return VectorShards(json.loads((work / "build.json").read_text())["vectors"])


def serve(work: Path, threads: int = 1) -> dict[str, Any]:
    """Load the bundle as the service does. The served nprobe: the smallest reaching served
    recall@20 0.98 on half the queries (the fused top 20 against the same fusion over an
    exact dense search, the truth step's, as the evaluate stage measures it); on the other
    half, fused and dense queries one at a time, and the recall."""
    import faiss

    from qpr.artifacts import INDEX_FILE
    from qpr.retrieval.bundle import Bundle
    from qpr.retrieval.dense import (
        nlist_of,
        recall_against,
        save_index,
        search,
        set_nprobe,
        set_refine_k_factor,
    )

    faiss.omp_set_num_threads(1)
    truth = np.load(work / "truth.npy")
    queries = pd.read_parquet(work / "queries.parquet")
    texts = queries["question"].tolist()
    half = len(queries) // 2
    rss0 = _rss_gb()
    started = time.perf_counter()
    bundle = Bundle.load(work / "models", fold_encoder=True, threads=threads)
    load_s = time.perf_counter() - started
    rss_loaded = _rss_gb()
    vectors = np.vstack([bundle._embed([bundle._tokens(q, 0, 1)]) for q in texts])
    reference = [rows[rows >= 0] for rows in np.load(work / FUSED_TRUTH)]
    index = bundle._index

    def served_recall(which: range) -> float:
        got = [[h.question_id for h in bundle.search(texts[i], 20).hits] for i in which]
        return float(np.mean([
            len(set(g) & set(reference[i].tolist())) / max(len(reference[i]), 1)
            for g, i in zip(got, which, strict=True)
        ]))  # fmt: skip

    # Depth: for each refine width, the fewest lists reaching the target on the tuning
    # half; served: the pair with the fastest dense search among those reaching it.
    tried: dict[str, float] = {}
    reached: list[tuple[float, int, int]] = []
    for k_factor in K_FACTORS:
        set_refine_k_factor(index, k_factor)
        for nprobe in (p for p in NPROBES if p <= (nlist_of(index) or 1) // 2):
            set_nprobe(index, nprobe)
            tried[f"{k_factor}/{nprobe}"] = recall = served_recall(range(half))
            if recall >= TARGET_RECALL:
                probe = list(vectors[:200])
                ms = float(np.median(_timed(lambda v: search(index, v[None], 20), probe)))
                reached.append((ms, k_factor, nprobe))
                break
    if reached:
        _, k_factor, chosen = min(reached)
    else:  # the target out of reach: the deepest search tried
        k_factor, chosen = K_FACTORS[-1], max(int(k.split("/")[1]) for k in tried)
    set_refine_k_factor(index, k_factor)
    set_nprobe(index, chosen)
    save_index(index, work / "models" / INDEX_FILE)  # the HTTP step serves the same depth
    recall = tried
    served = served_recall(range(half, len(texts)))
    _, dense_rows = search(index, vectors[half:], 20)
    dense_recall = recall_against(dense_rows, truth[half:])
    dense_ms = _timed(lambda v: search(index, v[None], 20), list(vectors[half:]))
    rss_warm = _rss_gb()
    hits, times = [], []
    for text in texts[half:]:
        t0 = time.perf_counter()
        result = bundle.search(text, 10)
        times.append((time.perf_counter() - t0) * 1e3)
        hits.append(result)
    clusters = queries["cluster_id"].iloc[half:].to_numpy()
    p1 = np.mean([
        bool(r.hits) and int(r.hits[0].cluster_id) == int(c)
        for r, c in zip(hits, clusters, strict=True)
    ])  # fmt: skip
    return {
        "load_s": load_s,
        "rss_before_gb": rss0,
        "rss_loaded_gb": rss_loaded,
        "rss_serving_gb": rss_warm,
        "nprobe": chosen,
        "refine_k_factor": k_factor,
        "tuning_recall": recall,
        "served_recall_at_20": served,
        "dense_recall_at_20": dense_recall,
        "dense_p50_ms": float(np.median(dense_ms)),
        "dense_p99_ms": float(np.percentile(dense_ms, 99)),
        "fused_p50_ms": float(np.median(times)),
        "fused_p99_ms": float(np.percentile(times, 99)),
        "fused_p1": float(p1),
        "queries": len(times),
    }


def _timed(fn: Any, items: list[Any]) -> list[float]:
    out = []
    for item in items:
        t0 = time.perf_counter()
        fn(item)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def _rss_gb(pid: int | str = "self") -> float:
    """A process's resident memory (VmRSS) in GB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024**2
    return float("nan")


def lexical(work: Path, k: int | None = None, blocks: int = 5) -> dict[str, Any]:
    """Our BM25 + MaxScore against bm25s's numba kernel on the same weights (bm25s given
    our term-major matrix, its own layout: CSC data / indices / indptr), top k as the fused
    search asks (None: the product's depth), the queries' blocks alternated side by side."""
    import bm25s

    from qpr.artifacts import BM25_FILE
    from qpr.config import LexicalSettings
    from qpr.retrieval.bm25 import BM25Index
    from qpr.text.words import tokenize

    k = LexicalSettings().candidates if k is None else k
    ours = BM25Index.load(work / "models" / BM25_FILE)
    theirs = bm25s.BM25(k1=ours.k1, b=ours.b, method="lucene", backend="numba")
    theirs.scores = {
        "data": ours.weights,
        "indices": ours.rows,
        "indptr": ours.indptr,
        "num_docs": ours.num_docs,
    }
    theirs.vocab_dict = ours.terms
    theirs.unique_token_ids_set = set(ours.terms.values())
    theirs.nonoccurrence_array = None  # Lucene's BM25 scores absent words 0
    texts = pd.read_parquet(work / "queries.parquet")["question"].tolist()
    words = [tokenize([t], stemmer=ours.stemmer)[0] for t in texts]
    sides = {
        "ours": lambda i: ours.search(texts[i], k),
        "bm25s": lambda i: theirs.retrieve(
            [[w for w in words[i] if w in ours.terms] or ["__none__"]],
            k=k, show_progress=False, n_threads=1,
        ),
    }  # fmt: skip
    for i in range(50):  # compile and warm both
        for fn in sides.values():
            fn(i)
    times: dict[str, list[float]] = {name: [] for name in sides}
    order = np.array_split(np.arange(len(texts)), blocks)
    for b, block in enumerate(order):
        for name in sorted(sides, reverse=bool(b % 2)):
            times[name] += _timed(sides[name], block.tolist())
    # The same top 10 up to the order of equal scores (ties break by row here, not there)
    same = np.mean([
        np.allclose(np.sort(ours.search(texts[i], 10)[0]),
                    np.sort(sides["bm25s"](i).scores[0][:10]), rtol=1e-5)
        for i in range(200)
    ])  # fmt: skip

    out = {name: {"p50_ms": float(np.median(t)), "p99_ms": float(np.percentile(t, 99))}
           for name, t in times.items()}  # fmt: skip
    out["ratio_p50_ours_to_bm25s"] = out["ours"]["p50_ms"] / out["bm25s"]["p50_ms"]
    out["same_top10_share"] = float(same)
    out["k"] = k
    out["shape"] = posting_shape(ours)
    return out


def posting_shape(bm25: Any) -> dict[str, float]:
    """What makes BM25 cost what it costs: postings a question, the share of questions
    holding the terms of document-frequency rank 1, 10, 100, 1000, and the share of all
    postings in lists longer than 1 % of N (the lists MaxScore must read or skip)."""
    df = np.sort(np.diff(bm25.indptr))[::-1]
    n = bm25.num_docs
    out = {"terms": int(df.size), "postings_per_question": float(df.sum() / n)}
    for rank in (1, 10, 100, 1000):
        out[f"df_rank_{rank}"] = float(df[rank - 1] / n) if df.size >= rank else 0.0
    out["postings_in_lists_over_1pct"] = float(df[df > 0.01 * n].sum() / df.sum())
    return out


def http(work: Path, nprobe: int) -> dict[str, Any]:
    """`qpr serve` on the bundle (benchmarks/serve_latency.py's server and client): its RSS
    once ready, sequential p50 / p99 over HTTP, and throughput at a few concurrencies."""
    import serve_latency as sl

    questions = work / "queries.json"
    texts = pd.read_parquet(work / "queries.parquet")["question"].tolist()
    questions.write_text(json.dumps(texts))
    started = time.perf_counter()
    server, port = sl.start_server(work / "models", "nprobe", nprobe, work / "server.log")
    try:
        ready_s = time.perf_counter() - started
        rss = _rss_gb(server.pid)
        out: dict[str, Any] = {"ready_s": ready_s, "server_rss_gb": rss}
        for concurrency in (1, 4, 16):
            got = sl.client(port, questions, concurrency=concurrency, requests=3000, seconds=30)
            out[f"c{concurrency}"] = got
        out["server_rss_after_gb"] = _rss_gb(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=60)
    return out


# ---------------------------------------------------------------- the run


def run_size(args: argparse.Namespace, size: str, factory: str) -> dict[str, Any]:
    work = args.work / size
    model = args.work / ("model-quora" if size == "quora" else "model-synthetic")
    step(model, "model", train_model, model, "quora" if size == "quora" else "synthetic")
    if size == "quora":
        corpus = step(work, "corpus", quora_corpus, work, model)
    elif size.startswith("1M-f"):
        corpus = step(work, "corpus", lambda: synthetic_corpus(work, SIZES["1M"]))
    else:
        corpus = step(work, "corpus", lambda: synthetic_corpus(work, SIZES[size]))
    n = corpus["questions"]
    factory = factory.format(nlist=nlist_for(n), m=DIM // 2)
    fresh = (work / "build.json").is_file() or fresh_build(args.work, work, size)
    built = step(work, "build", child, ["--child", "build", "--size", size,
                                        "--work", str(args.work), "--factory", factory,
                                        "--engine", args.engine])  # fmt: skip
    if "fresh" not in built:  # timings of a whole build, or of a resumed one
        built["fresh"] = fresh
        (work / "build.json").write_text(json.dumps(built, indent=1))
    if not (work / FUSED_TRUTH).is_file():  # a run from before the fused reference was kept
        (work / "truth.json").unlink(missing_ok=True)
    step(work, "truth", child, ["--child", "truth", "--size", size, "--work", str(args.work)])
    served = step(
        work, "serve", child, ["--child", "serve", "--size", size, "--work", str(args.work)]
    )
    row = {"size": size, "questions": n, "corpus": corpus, "build": built, "serve": served}
    if "-f" in size and not size.endswith(f"-f{args.best}"):
        return row  # a 1M candidate not (yet) chosen: its dense index is all that is compared
    row["lexical"] = step(work, "lexical", child, ["--child", "lexical", "--size", size,
                                                   "--work", str(args.work)])  # fmt: skip
    row["http"] = step(work, "http", http, work, served["nprobe"])
    return row


def choose_factory(args: argparse.Namespace) -> tuple[str, list[dict[str, Any]]]:
    """At 1M: each candidate built and served; the fastest fused p50 among those whose
    10M index fits INDEX_BUDGET_10M and that reach the served recall target."""
    rows = []
    for i, candidate in enumerate(CANDIDATES):
        name = f"1M-f{i}"
        work = args.work / name
        if not (work / "corpus.json").is_file():
            (work / "shards").mkdir(parents=True, exist_ok=True)
            for p in shard_files(args.work / "1M"):
                os.link(p, work / "shards" / p.name)
            shutil.copy2(args.work / "1M" / "queries.parquet", work / "queries.parquet")
            shutil.copy2(args.work / "1M" / "corpus.json", work / "corpus.json")
        result = run_size(args, name, candidate)
        per_vector = result["build"]["bytes"]["index.faiss"] / result["questions"]
        rows.append({"factory": result["build"]["factory"], "template": candidate,
                     "bytes_per_vector": per_vector, **result["serve"],
                     "build_s": sum(result["build"]["seconds"].values())})  # fmt: skip
    fits = [r for r in rows if r["bytes_per_vector"] * 10_000_000 < INDEX_BUDGET_10M] or rows
    good = [r for r in fits if r["served_recall_at_20"] >= TARGET_RECALL] or fits
    best = min(good, key=lambda r: r["fused_p50_ms"])
    return CANDIDATES.index(best["template"]), rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="quora,134k,1M,10M,3M")
    parser.add_argument("--work", type=Path, default=Path("/tmp/qpr-scale"))
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    parser.add_argument("--engine", choices=("local", "ray"), default="local")
    parser.add_argument("--child", choices=("build", "truth", "serve", "lexical"))
    parser.add_argument("--size")
    parser.add_argument("--factory")
    parser.add_argument("--dense", type=int, choices=range(len(CANDIDATES)),
                        help="serve CANDIDATES[i], skipping the choice at 1M")  # fmt: skip
    args = parser.parse_args()
    if args.child:
        work = args.work / args.size
        model = args.work / ("model-quora" if args.size == "quora" else "model-synthetic")
        vectors = vectors_dir(args.work, args.size)
        if args.child == "build":
            result = build(work, model, args.factory, args.engine, vectors)
        elif args.child == "truth":
            result = exact_truth(work)
        elif args.child == "lexical":
            result = lexical(work)
        else:
            result = serve(work)
        print(json.dumps(result), flush=True)
        return
    sizes = args.sizes.split(",")
    unknown = set(sizes) - set(SIZES)
    if unknown:
        parser.error(f"unknown sizes {sorted(unknown)}; choose among {list(SIZES)}")
    args.work.mkdir(parents=True, exist_ok=True)
    args.best = -1  # the 1M candidates get the lexical and HTTP steps once one is chosen
    results: list[dict[str, Any]] = []
    chosen: dict[str, Any] | None = None
    if args.dense is not None:  # a factory chosen by an earlier run: no candidates built
        args.best = args.dense
    elif any(size != "quora" for size in sizes):  # the dense index is chosen at 1M, first
        step(args.work / "1M", "corpus", synthetic_corpus, args.work / "1M", SIZES["1M"])
        chosen = step(args.work, "factory", lambda: dict(
            zip(("index", "rows"), choose_factory(args), strict=True)))  # fmt: skip
        args.best = int(chosen["index"])
    template = CANDIDATES[args.best if args.best >= 0 else 1]
    for size in sizes:
        name = f"1M-f{args.best}" if size == "1M" else size
        results.append(run_size(args, name, template) | {"size": size})
        write_report(args, results, chosen)


def write_report(args: argparse.Namespace, results: list[dict[str, Any]], factory: Any) -> None:
    from scale_report import report

    report(args.out, results, factory, machine=_machine(), engine=args.engine)


def _machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    return f"{cpu}, {os.cpu_count()} cores, {memory:.0f} GB RAM, {platform.system()}"


if __name__ == "__main__":
    main()
