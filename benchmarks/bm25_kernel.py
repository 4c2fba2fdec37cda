#!/usr/bin/env python
"""The BM25 top-k kernel before and after the MaxScore rewrite, side by side, at scale.

    python benchmarks/bm25_kernel.py                        # 134k, 1M, 3M, 10M; resumable
    python benchmarks/bm25_kernel.py --sizes 1M --fresh     # one size, measured again

For each size: BM25 over a `qpr.data.scale` corpus (seed 13; k1 0.9, b 0.75, english
stems, as params.yaml), built shard by shard as the indexer does and kept under --work;
the 1000 queries of `scale_queries`; top 100, one thread. OLD is main's kernel at commit
7052a2e (term-at-a-time MaxScore), read from git at run time (`git show`) and imported under
another name; NEW is `qpr.retrieval.maxscore` (document-at-a-time MaxScore). Both read the
same arrays (OLD's scratch adds its accumulator). Queries
run in blocks of 50, OLD then NEW or NEW then OLD in turn, for several rounds (the machine
is shared: side by side, load hits both alike); a query's time is its median over rounds.
Every query's top k must be the same, scores bit for bit. Then whole calls against bm25s
(numba backend) on the same weights, side by side the same way.

Per size: <work>/<size>/kernel.json (skipped when present unless --fresh); all sizes:
docs/results/bm25_kernel.{json,md}.
"""

from __future__ import annotations

import argparse
import atexit
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from machine_info import describe  # noqa: E402

from qpr.data.scale import ScaleSpec, parse_count, scale_queries  # noqa: E402
from qpr.retrieval import maxscore as new  # noqa: E402
from qpr.retrieval.bm25 import WORTH_PRUNING, BM25Index, TermCounts, count_terms  # noqa: E402
from qpr.retrieval.indexer import read_texts  # noqa: E402

K, BLOCK = 100, 50
QUORA_SIZE = {"134k": 134_091}  # Quora's distinct questions, as benchmarks/scale.py
OLD_COMMIT = "7052a2e"  # main before the rewrite: term-at-a-time MaxScore


def load_old_kernel() -> ModuleType:
    """qpr.retrieval.maxscore at OLD_COMMIT, written from git to a temporary folder (numba
    caches beside it) and imported as maxscore_<commit>, so the repository keeps one copy."""
    name = f"maxscore_{OLD_COMMIT}"
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{OLD_COMMIT}:src/qpr/retrieval/maxscore.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    folder = Path(tempfile.mkdtemp(prefix="qpr-old-kernel-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # registered before it runs, as importlib's recipe does
    spec.loader.exec_module(module)
    return module


def build_bm25(size: str, corpus: Path, work: Path) -> Path:
    """BM25 of <corpus>/<size>/shards, counted shard by shard (counts kept for reruns)."""
    out = work / size
    path = out / "bm25.npz"
    if path.is_file():
        return path
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    for shard in sorted((corpus / size / "shards").glob("logs-*.parquet")):
        counts = out / f"counts-{shard.stem}.npz"
        if not counts.is_file():
            count_terms(read_texts(shard, "question"), stemmer="english").save(counts)
        parts.append(TermCounts.load(counts))
    BM25Index.from_counts(parts, k1=0.9, b=0.75).save(path)
    return path


def _ms(values: np.ndarray) -> dict[str, float]:
    return {
        "p50_ms": round(float(np.median(values)) * 1e3, 3),
        "p99_ms": round(float(np.percentile(values, 99)) * 1e3, 3),
        "mean_ms": round(float(values.mean()) * 1e3, 3),
    }


def measure(size: str, corpus: Path, work: Path, rounds: int, queries: int) -> dict[str, Any]:
    path = build_bm25(size, corpus, work)
    old = sys.modules.get(f"maxscore_{OLD_COMMIT}") or load_old_kernel()
    started = time.perf_counter()
    index = BM25Index.load(path)
    loaded = time.perf_counter()
    by_document = index.by_document
    doc_major = time.perf_counter()
    postings = new.Postings(index.indptr, index.rows, index.weights, *by_document)
    old_postings = old.Postings(*postings)
    bounds = index.upper_bounds
    spec = ScaleSpec(QUORA_SIZE.get(size) or parse_count(size), seed=13)
    texts = scale_queries(spec, queries)["question"].tolist()
    prepared = []
    for text in texts:
        counts = Counter(index.query_terms(text).tolist())
        if counts:
            prepared.append(new.Query.of(counts, bounds))
    scratch = new.thread_scratch(index.num_docs, len(index.terms))
    # OLD needs an accumulator and a touched list of N (NEW's touched holds only its seeds)
    old_scratch = old.Scratch(
        np.zeros(index.num_docs, np.float32),
        scratch.state,
        np.zeros(index.num_docs, np.int32),
        scratch.position,
    )

    def run_old(q: new.Query) -> tuple[np.ndarray, np.ndarray, int]:
        return old._top_k(*old_postings, *q, K, -1, WORTH_PRUNING, *old_scratch)

    def run_new(q: new.Query) -> tuple[np.ndarray, np.ndarray, int]:
        return new._top_k(*postings, *q, K, -1, WORTH_PRUNING, *scratch)

    identical = 0
    for q in prepared:  # compiles both, and checks every top k
        a, b = run_old(q), run_new(q)
        identical += bool(
            np.array_equal(a[0].view(np.int32), b[0].view(np.int32)) and np.array_equal(a[1], b[1])
        )
    times = {"old": np.zeros((rounds, len(prepared))), "new": np.zeros((rounds, len(prepared)))}
    sides = {"old": run_old, "new": run_new}
    for r in range(rounds):
        for n, start in enumerate(range(0, len(prepared), BLOCK)):
            names = ("old", "new") if (n + r) % 2 == 0 else ("new", "old")
            for name in names:
                call = sides[name]
                for i in range(start, min(start + BLOCK, len(prepared))):
                    t = time.perf_counter()
                    call(prepared[i])
                    times[name][r, i] = time.perf_counter() - t
        print(f"{size}: round {r + 1}/{rounds}", flush=True)
    per_query = {name: np.median(v, axis=0) for name, v in times.items()}
    result = {name: _ms(v) for name, v in per_query.items()}
    result.update(against_bm25s(index, texts, rounds))
    postings_bytes = sum(a.nbytes for a in old_postings)
    return {
        "size": size,
        "num_docs": index.num_docs,
        "terms": len(index.terms),
        "postings": int(index.rows.size),
        "queries": len(prepared),
        "k": K,
        "rounds": rounds,
        "worth_pruning": WORTH_PRUNING,
        "old": result["old"],
        "new": result["new"],
        "search": result["search"],
        "bm25s": result["bm25s"],
        "same_top10_as_bm25s": result["same_top10_as_bm25s"],
        "ratio_p50_old_to_new": round(result["old"]["p50_ms"] / result["new"]["p50_ms"], 2),
        "ratio_p99_old_to_new": round(result["old"]["p99_ms"] / result["new"]["p99_ms"], 2),
        "median_per_query_ratio": round(float(np.median(per_query["old"] / per_query["new"])), 2),
        "identical_share": identical / len(prepared),
        "load_s": round(loaded - started, 2),
        "by_document_s": round(doc_major - loaded, 2),
        "postings_mb": round(postings_bytes / 1e6, 1),
    }


def against_bm25s(index: BM25Index, texts: list[str], rounds: int) -> dict[str, Any]:
    """Whole calls, words in and top k out: `BM25Index.search` (tokenising, stemming, the
    NEW kernel) against bm25s's numba kernel given our weights (its CSC layout) and the
    same stemmed words. Blocks alternated as above; bm25s breaks ties otherwise, so the
    top 10 scores are compared as sorted values."""
    import bm25s

    from qpr.text.words import tokenize

    theirs = bm25s.BM25(k1=index.k1, b=index.b, method="lucene", backend="numba")
    theirs.scores = {"data": index.weights, "indices": index.rows, "indptr": index.indptr,
                     "num_docs": index.num_docs}  # fmt: skip
    theirs.vocab_dict = index.terms
    theirs.unique_token_ids_set = set(index.terms.values())
    theirs.nonoccurrence_array = None  # Lucene's BM25 scores an absent word 0

    def bm25s_call(text: str) -> Any:
        words = [w for w in tokenize([text], stemmer=index.stemmer)[0] if w in index.terms]
        return theirs.retrieve([words or ["__none__"]], k=K, show_progress=False, n_threads=1)

    sides = {"search": lambda t: index.search(t, K), "bm25s": bm25s_call}
    for text in texts[:50]:  # compile and warm both
        for call in sides.values():
            call(text)
    times = {name: np.zeros((rounds, len(texts))) for name in sides}
    for r in range(rounds):
        for n, start in enumerate(range(0, len(texts), BLOCK)):
            for name in sorted(sides, reverse=(n + r) % 2 == 1):
                for i in range(start, min(start + BLOCK, len(texts))):
                    t = time.perf_counter()
                    sides[name](texts[i])
                    times[name][r, i] = time.perf_counter() - t
    same = np.mean([
        np.allclose(np.sort(index.search(t, 10)[0]), np.sort(bm25s_call(t).scores[0][:10]),
                    rtol=1e-5)
        for t in texts[:200]
    ])  # fmt: skip
    out: dict[str, Any] = {name: _ms(np.median(v, axis=0)) for name, v in times.items()}
    return out | {"same_top10_as_bm25s": float(same)}


def write_report(results: list[dict[str, Any]]) -> None:
    out = ROOT / "docs" / "results"
    versions = {"numba": __import__("numba").__version__, "numpy": np.__version__,
                "bm25s": __import__("bm25s").__version__}  # fmt: skip
    machine = describe(ROOT, versions)
    (out / "bm25_kernel.json").write_text(
        json.dumps({"machine": machine, "sizes": results}, indent=2) + "\n"
    )
    lines = [
        "# BM25 top-k kernel: main's term-at-a-time MaxScore against document-at-a-time",
        "",
        "`python benchmarks/bm25_kernel.py`. Synthetic corpora (`qpr.data.scale`, seed 13),",
        "BM25 k1 0.9, b 0.75, english stems; the 1000 `scale_queries`; top 100, one thread.",
        f"OLD: main's kernel at {OLD_COMMIT} (read from git); NEW: `qpr.retrieval.maxscore`. Same",
        "arrays, query blocks of 50 alternated side by side, a query's time its median over",
        f"rounds. Machine: {machine['cpu_model']}, {machine['cpus_usable']} cores,",
        f"{machine['memory_gib']} GiB, shared with other work while measuring.",
        "",
        "| size | postings | old p50 | new p50 | old p99 | new p99 | p50 ratio | p99 ratio "
        "| identical | load + doc-major |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['size']} | {r['postings'] / 1e6:.1f}M | {r['old']['p50_ms']} ms "
            f"| {r['new']['p50_ms']} ms | {r['old']['p99_ms']} ms | {r['new']['p99_ms']} ms "
            f"| {r['ratio_p50_old_to_new']}× | {r['ratio_p99_old_to_new']}× "
            f"| {r['identical_share']:.0%} | {r['load_s']} + {r['by_document_s']} s |"
        )
    targets = {"1M": (1.0, None), "10M": (2.0, 10.0)}  # the fused search's (p50, p99) in ms
    verdicts = []
    for r in results:
        if r["size"] in targets:
            p50, p99 = targets[r["size"]]
            met = r["new"]["p50_ms"] <= p50 and (p99 is None or r["new"]["p99_ms"] <= p99)
            goal = f"p50 <= {p50} ms" + (f", p99 <= {p99} ms" if p99 else "")
            verdicts.append(f"{r['size']} {'meets' if met else 'misses'} {goal}")
    lines += [
        "",
        "Verdict: every top k identical (scores bit for bit); p50 old / new "
        + ", ".join(f"{r['ratio_p50_old_to_new']}× ({r['size']})" for r in results)
        + " (above 1: the new kernel is faster); the kernel alone "
        + "; ".join(verdicts)
        + " (the fused search's BM25 targets).",
        "",
        "## Against bm25s",
        "",
        "Whole calls, question in, top 100 out: `BM25Index.search` (tokenising, stemming,",
        "the NEW kernel) against bm25s's numba kernel given our weights and the same stemmed",
        "words, one thread, blocks alternated as above. Same top 10: sorted scores equal",
        "(bm25s breaks ties otherwise), over 200 queries.",
        "",
        "| size | ours p50 | bm25s p50 | ours p99 | bm25s p99 | bm25s / ours p50 | same top 10 |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "bm25s" not in r:
            continue
        lines.append(
            f"| {r['size']} | {r['search']['p50_ms']} ms | {r['bm25s']['p50_ms']} ms "
            f"| {r['search']['p99_ms']} ms | {r['bm25s']['p99_ms']} ms "
            f"| {r['bm25s']['p50_ms'] / r['search']['p50_ms']:.2f}× "
            f"| {r['same_top10_as_bm25s']:.0%} |"
        )
    faster = [r["size"] for r in results if "bm25s" in r
              and r["search"]["p50_ms"] <= r["bm25s"]["p50_ms"]]  # fmt: skip
    lines += ["", f"Ours is faster at p50 at: {', '.join(faster) or 'no size'}.", ""]
    (out / "bm25_kernel.md").write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="134k,1M,3M,10M")
    parser.add_argument("--corpus", type=Path, default=Path("/tmp/qpr-scale"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/qpr-bm25"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--fresh", action="store_true", help="measure sizes already measured")
    args = parser.parse_args()
    results = []
    for size in args.sizes.split(","):
        path = args.work / size / "kernel.json"
        if args.fresh or not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(
                json.dumps(measure(size, args.corpus, args.work, args.rounds, args.queries))
            )
        results.append(json.loads(path.read_text()))
        print(json.dumps(results[-1]), flush=True)
        write_report(results)


if __name__ == "__main__":
    main()
