#!/usr/bin/env python
"""Dense indexes for millions of questions: graph indexes against the IVF the bundle serves.

    python benchmarks/graph_index.py --size /tmp/qpr-scale/1M-f2
    python benchmarks/graph_index.py --size ... --candidates "faiss:HNSW32,Flat:200,usearch:f16:32"

On a size `benchmarks/scale.py` built (its vector shards, its 1000 queries and their exact
top 20, `truth.npy`), each candidate is built over the same float32 vectors and searched
one query at a time on one thread, k 20, at a grid of depths:

- `ivf`: the size's own bundle index (IVF, 4-bit PQ fast scan, SQfp16 re-ranking), at a
  grid of nprobe, refine width 32: the baseline, not rebuilt.
- `faiss:FACTORY:EFC`: a FAISS HNSW factory ("HNSW32,Flat", "HNSW32,SQ8"), efConstruction
  EFC, inserted on 2 threads (FAISS's parallel insertion; the pipeline inserts on one, for
  the same graph every run), at a grid of efSearch.
- `usearch:DTYPE:M`: usearch's HNSW (`f16`, `i8`), connectivity M, expansion_add 128,
  2 threads, at a grid of expansion_search.
- `scann:LEAVES:BLOCK:REORDER`: ScaNN's partitioned search, the IVF's nearest rival: a
  k-means tree of LEAVES leaves, 4-bit asymmetric hashing of BLOCK dimensions per code
  (2: 64 codes for 128 dimensions, as the IVF's PQ64x4), its best REORDER re-ranked
  exactly; trained on 2 threads, at a grid of leaves_to_search.

For each: build seconds, bytes (its serialised size), and per depth the dense recall@20
against exact search and p50 / p99. Then the IVF and each kept FAISS graph as served:
`Bundle.search` fused with BM25, served recall@20 and fused p50 / p99 at each depth
(`served`), at each BM25 depth of --lexical-depths (default: the bundle's own), each
against the same fusion over an exact dense search. Each candidate's result is kept under
`<size>/graph/<name>.json`, each served pass's under `served-L<depth>.json`: a killed run
resumes at the first one without its file.
`--dense-only` skips the served passes (a ScaNN index cannot stand in a bundle).
Results: docs/results/graph_index_<label>.{json,md,png}. usearch and ScaNN come from the
`bench` extra (`pip install -e .[bench]`).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.metadata
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from machine_info import describe  # noqa: E402

from qpr.io import save_numpy_atomic, write_text_atomic  # noqa: E402

DEFAULT = "ivf,faiss:HNSW32,Flat:40,faiss:HNSW32,SQ8:40,faiss:HNSW32,Flat:200,usearch:f16:32"
NPROBES = (64, 128, 256, 384, 512, 768, 1024, 1536)
EFS = (32, 64, 128, 256, 384, 512, 768, 1024)
BUILD_THREADS = 2
SIDE_BY_SIDE = (0.94, 0.95)  # recall targets the candidates are timed at, alternated
# The fused search as served: depths tried, and the served recall@20 it must keep against
# the same fusion over an exact dense search (the evaluate stage's measure)
SERVED_DEPTHS = {
    "nprobe": (256, 384, 512, 768, 1024, 1536),
    "ef_search": (96, 128, 192, 256, 384, 512),
}
SERVED_TARGET = 0.98
LEAF_SHARES = (1 / 32, 1 / 16, 1 / 8, 3 / 16, 1 / 4, 3 / 8, 1 / 2)  # ScaNN's depth grid


def candidates(spec: str) -> list[str]:
    """ "ivf,faiss:HNSW32,Flat:40" → ["ivf", "faiss:HNSW32,Flat:40"] (factories hold commas)."""
    out: list[str] = []
    for part in spec.split(","):
        if part.startswith(("ivf", "faiss:", "usearch:", "scann:")) or not out:
            out.append(part)
        else:
            out[-1] += "," + part
    return out


def vectors(size: Path) -> np.ndarray:
    """The size's float32 vectors in row order, as its build step encoded them."""
    files = json.loads((size / "build.json").read_text())["vectors"]
    return np.vstack([np.load(f) for f in files]).astype(np.float32, copy=False)


def queries(size: Path) -> np.ndarray:
    """The 1000 queries encoded as the service encodes them (cached beside the truth)."""
    cached = size / "graph" / "queries.npy"
    if not cached.is_file():
        import pandas as pd

        from qpr.retrieval.bundle import Bundle

        bundle = Bundle.load(size / "models", fold_encoder=True)
        texts = pd.read_parquet(size / "queries.parquet")["question"].tolist()
        encoded = np.vstack([bundle._embed([bundle._tokens(q, 0, 1)]) for q in texts])
        cached.parent.mkdir(parents=True, exist_ok=True)
        np.save(cached, encoded)
    return np.load(cached)


def recall(rows: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(r.tolist()) & set(t.tolist())) / 20
                          for r, t in zip(rows, truth, strict=True)]))  # fmt: skip


def curve(search: Any, qv: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """recall@20 of one batch search, and p50 / p99 of one query at a time."""
    rows = search(qv)
    times = []
    for q in qv:
        started = time.perf_counter()
        search(q[None])
        times.append((time.perf_counter() - started) * 1e3)
    return {
        "recall_at_20": recall(rows, truth),
        "p50_ms": float(np.median(times)),
        "p99_ms": float(np.percentile(times, 99)),
    }


def measure_ivf(size: Path, qv: np.ndarray, truth: np.ndarray, log: Any) -> dict[str, Any]:
    import faiss

    from qpr.artifacts import INDEX_FILE
    from qpr.retrieval.dense import load_index, nlist_of, set_nprobe, set_refine_k_factor

    index = load_index(size / "models" / INDEX_FILE, nprobe=None)
    set_refine_k_factor(index, 32)
    faiss.omp_set_num_threads(1)
    built = json.loads((size / "build.json").read_text())["seconds"]["faiss"]  # scale.py's
    out: dict[str, Any] = {"bytes": (size / "models" / INDEX_FILE).stat().st_size,
                           "build_s": built, "knob": "nprobe", "curve": {}}  # fmt: skip
    for nprobe in (p for p in NPROBES if p <= (nlist_of(index) or 1) // 2):
        set_nprobe(index, nprobe)
        out["curve"][nprobe] = curve(lambda x: index.search(x, 20)[1], qv, truth)
        log(f"ivf nprobe {nprobe}: {out['curve'][nprobe]}")
    return out


def saved(size: Path, spec: str) -> Path:
    """Where a candidate's built index is kept (`side_by_side` reloads it)."""
    return size / "graph" / (spec.replace("/", "_").replace(":", "_") + ".index")


def measure_faiss(
    spec: str, size: Path, x: np.ndarray, qv: np.ndarray, truth: np.ndarray, log: Any
) -> dict:
    import faiss

    factory, ef_construction = spec.split(":", 1)[1].rsplit(":", 1)
    index = faiss.index_factory(x.shape[1], factory)
    index.hnsw.efConstruction = int(ef_construction)
    faiss.omp_set_num_threads(BUILD_THREADS)
    started = time.perf_counter()
    if not index.is_trained:
        index.train(x)
    for lo in range(0, x.shape[0], 100_000):
        index.add(x[lo : lo + 100_000])
        log(f"{spec}: {index.ntotal:,} vectors, {time.perf_counter() - started:.0f} s")
    built = time.perf_counter() - started
    faiss.write_index(index, str(saved(size, spec)))  # for the side-by-side and served passes
    out: dict[str, Any] = {"build_s": built, "knob": "efSearch",
                           "bytes": saved(size, spec).stat().st_size, "curve": {}}  # fmt: skip
    faiss.omp_set_num_threads(1)
    for ef in EFS:
        index.hnsw.efSearch = ef
        out["curve"][ef] = curve(lambda q: index.search(q, 20)[1], qv, truth)
        log(f"{spec} efSearch {ef}: {out['curve'][ef]}")
    return out


def measure_usearch(spec: str, x: np.ndarray, qv: np.ndarray, truth: np.ndarray, log: Any) -> dict:
    import tempfile

    from usearch.index import Index

    _, dtype, connectivity = spec.split(":")
    index = Index(ndim=x.shape[1], metric="l2sq", dtype=dtype,
                  connectivity=int(connectivity), expansion_add=128)  # fmt: skip
    started = time.perf_counter()
    for lo in range(0, x.shape[0], 100_000):
        keys = np.arange(lo, min(lo + 100_000, x.shape[0]), dtype=np.uint64)
        index.add(keys, x[lo : lo + 100_000], threads=BUILD_THREADS)
        log(f"{spec}: {len(index):,} vectors, {time.perf_counter() - started:.0f} s")
    built = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as tmp:
        index.save(f"{tmp}/index.usearch")
        size = Path(f"{tmp}/index.usearch").stat().st_size
    out: dict[str, Any] = {"build_s": built, "bytes": size, "knob": "expansion_search",
                           "curve": {}}  # fmt: skip
    for ef in EFS:
        index.expansion_search = ef
        out["curve"][ef] = curve(
            lambda q: index.search(q, 20, threads=1).keys.astype(np.int64).reshape(-1, 20),
            qv,
            truth,
        )
        log(f"{spec} expansion_search {ef}: {out['curve'][ef]}")
    return out


def scann_search(searcher: Any, spec: str, leaves: int) -> Any:
    """rows int64 [Q, 20] of queries float32 [Q, D] through a ScaNN searcher, reading
    `leaves` leaves and re-ranking the spec's REORDER best; one query takes the
    single-query call, as a service would."""
    reorder = int(spec.split(":")[3])

    def search(q: np.ndarray) -> np.ndarray:
        if q.shape[0] == 1:
            rows, _ = searcher.search(q[0], final_num_neighbors=20,
                                      pre_reorder_num_neighbors=reorder,
                                      leaves_to_search=leaves)  # fmt: skip
            return np.asarray(rows, np.int64)[None]
        rows, _ = searcher.search_batched(q, final_num_neighbors=20,
                                          pre_reorder_num_neighbors=reorder,
                                          leaves_to_search=leaves)  # fmt: skip
        return np.asarray(rows, np.int64)

    return search


def measure_scann(
    spec: str, size: Path, x: np.ndarray, qv: np.ndarray, truth: np.ndarray, log: Any
) -> dict:
    import scann

    leaves, block, reorder = (int(v) for v in spec.split(":")[1:])
    started = time.perf_counter()
    builder = scann.scann_ops_pybind.builder(x, 20, "squared_l2")
    builder.set_n_training_threads(BUILD_THREADS)
    sample = min(x.shape[0], 250_000)
    builder = builder.tree(num_leaves=leaves, num_leaves_to_search=leaves // 8,
                           training_sample_size=sample)  # fmt: skip
    # nan: plain (not anisotropic) quantization, the form for squared L2
    builder = builder.score_ah(block, anisotropic_quantization_threshold=float("nan"))
    searcher = builder.reorder(reorder).build()
    built = time.perf_counter() - started
    log(f"{spec}: built in {built:.0f} s")
    folder = saved(size, spec)
    folder.mkdir(parents=True, exist_ok=True)
    searcher.serialize(str(folder))  # for the side-by-side pass
    out: dict[str, Any] = {"build_s": built, "knob": "leaves_to_search", "curve": {},
                           "bytes": sum(f.stat().st_size for f in folder.iterdir())}  # fmt: skip
    for share in LEAF_SHARES:
        depth = round(leaves * share)
        out["curve"][depth] = curve(scann_search(searcher, spec, depth), qv, truth)
        log(f"{spec} leaves_to_search {depth}: {out['curve'][depth]}")
    return out


def measure(spec: str, size: Path, qv: np.ndarray, truth: np.ndarray, log: Any) -> dict:
    """One candidate's result, from `<size>/graph/<spec>.json` when a run left it."""
    done = size / "graph" / (spec.replace("/", "_").replace(":", "_") + ".json")
    if done.is_file():
        return json.loads(done.read_text())
    load = [round(v, 2) for v in os.getloadavg()]
    if spec == "ivf":
        result = measure_ivf(size, qv, truth, log)
    else:
        x = vectors(size)
        if spec.startswith("faiss:"):
            result = measure_faiss(spec, size, x, qv, truth, log)
        elif spec.startswith("scann:"):
            result = measure_scann(spec, size, x, qv, truth, log)
        else:
            result = measure_usearch(spec, x, qv, truth, log)
    result |= {"candidate": spec, "load_before": load,
               "load_after": [round(v, 2) for v in os.getloadavg()]}  # fmt: skip
    done.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(done, json.dumps(result, indent=1))
    return result


def side_by_side(
    size: Path, results: list[dict], qv: np.ndarray, target: float, rounds: int = 5
) -> dict[str, Any]:
    """The IVF and each kept FAISS graph or ScaNN index at its fastest depth reaching
    `target`, timed in blocks of queries alternated between them (the machine is shared:
    load hits all alike). Returns {candidate: {depth, p50_ms, p99_ms}}."""
    import faiss

    from qpr.artifacts import INDEX_FILE
    from qpr.retrieval.dense import load_index, set_nprobe, set_refine_k_factor

    faiss.omp_set_num_threads(1)
    sides: dict[str, tuple[Any, str]] = {}
    for r in results:
        reach = fastest_reaching(r, target)
        if reach is None:
            continue
        if r["candidate"] == "ivf":
            index = load_index(size / "models" / INDEX_FILE, nprobe=None)
            set_refine_k_factor(index, 32)
            set_nprobe(index, int(reach[0]))
        elif r["candidate"].startswith("scann:") and saved(size, r["candidate"]).is_dir():
            import scann

            searcher = scann.scann_ops_pybind.load_searcher(str(saved(size, r["candidate"])))
            sides[r["candidate"]] = (
                scann_search(searcher, r["candidate"], int(reach[0])),
                reach[0],
            )
            continue
        elif saved(size, r["candidate"]).is_file():
            index = faiss.read_index(str(saved(size, r["candidate"])))
            index.hnsw.efSearch = int(reach[0])
        else:
            continue
        sides[r["candidate"]] = (functools.partial(index.search, k=20), reach[0])
    times: dict[str, list[float]] = {name: [] for name in sides}
    blocks = np.array_split(np.arange(len(qv)), 10)
    for round_ in range(rounds):
        for b, block in enumerate(blocks):
            order = sorted(sides, reverse=bool((b + round_) % 2))
            for name in order:
                search = sides[name][0]
                for i in block:
                    started = time.perf_counter()
                    search(qv[i : i + 1])
                    times[name].append((time.perf_counter() - started) * 1e3)
    return {
        name: {"depth": sides[name][1], "p50_ms": float(np.median(t)),
               "p99_ms": float(np.percentile(t, 99))}
        for name, t in times.items()
    }  # fmt: skip


def neighbourhood(x: np.ndarray, qv: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """How flat the queries' neighbourhoods are: the median ratio of the squared L2
    distance to the exact 20th neighbour over that to the first (1.0: all tied)."""
    first = ((x[truth[:, 0]] - qv) ** 2).sum(axis=1)
    last = ((x[truth[:, 19]] - qv) ** 2).sum(axis=1)
    return {"median_d20_over_d1": float(np.median(last / np.maximum(first, 1e-12)))}


def graph_bundle(size: Path, spec: str) -> Path:
    """The size's bundle with a graph candidate's index in place of its IVF: a folder of
    links to the bundle's files, but for the index itself."""
    from qpr.artifacts import INDEX_FILE

    folder = size / "graph" / ("bundle-" + saved(size, spec).stem)
    if not folder.is_dir():
        source = size / "models"
        for path in source.rglob("*"):
            target = folder / path.relative_to(source)
            if path.is_dir():
                target.mkdir(parents=True, exist_ok=True)
            elif path.relative_to(source) != Path(INDEX_FILE):
                target.parent.mkdir(parents=True, exist_ok=True)
                target.symlink_to(path)
        (folder / INDEX_FILE).symlink_to(saved(size, spec))
    return folder


def at_depth(folder: Path, lexical: int, dest: Path) -> Path:
    """`folder`'s bundle fusing BM25's top `lexical`: links to its files, but for a
    search.json that says so."""
    if not dest.is_dir():
        for path in folder.rglob("*"):
            target = dest / path.relative_to(folder)
            if path.is_dir():
                target.mkdir(parents=True, exist_ok=True)
            elif path.relative_to(folder) != Path("search.json"):
                target.parent.mkdir(parents=True, exist_ok=True)
                target.symlink_to(path.resolve())
        search = json.loads((folder / "search.json").read_text())
        write_text_atomic(
            dest / "search.json", json.dumps(search | {"lexical_candidates": lexical})
        )
    return dest


def fused_reference(size: Path, folder: Path, qv: np.ndarray, texts: list[str]) -> np.ndarray:
    """int64 [Q, 20]: the fusion `folder`'s search config serves, over an exact dense
    search (IndexFlatL2 of the float32 vectors) and the bundle's BM25: what served recall
    is measured against (scale.py's fused_truth.npy, at any BM25 depth). Cached."""
    import faiss

    from qpr.artifacts import BM25_FILE, SearchConfig
    from qpr.retrieval.bm25 import BM25Index
    from qpr.retrieval.hybrid import HybridSearch

    config = SearchConfig.read(folder)
    cached = size / "graph" / f"fused_truth_L{config.lexical_candidates}.npy"
    if not cached.is_file():
        exact = faiss.IndexFlatL2(qv.shape[1])
        exact.add(vectors(size))
        search = HybridSearch(exact, config, bm25=BM25Index.load(size / "models" / BM25_FILE))
        save_numpy_atomic(cached, search.rank(texts, lambda: qv, 20).rows)
    return np.load(cached)


def served(
    size: Path, results: list[dict], qv: np.ndarray, lexical: int, log: Any
) -> dict[str, Any]:
    """The fused search as the service runs it (`Bundle.search`, folded encoder, BM25's
    top `lexical` on a second thread) over the IVF and over each kept FAISS graph: served
    recall@20 against the same fusion over an exact dense search at each depth of
    SERVED_DEPTHS, and fused p50 / p99 (k 10). Then each at its fastest depth keeping
    SERVED_TARGET, timed in alternated blocks."""
    import faiss
    import pandas as pd

    from qpr.retrieval.bundle import Bundle

    texts = pd.read_parquet(size / "queries.parquet")["question"].tolist()
    bundles = {"ivf": size / "models"}
    for r in results:
        if r["candidate"].startswith("faiss:") and saved(size, r["candidate"]).is_file():
            bundles[r["candidate"]] = graph_bundle(size, r["candidate"])
    folders = {
        name: (at_depth(folder, lexical, size / "graph" / f"served-L{lexical}-{i}"),
               "nprobe" if name == "ivf" else "ef_search")
        for i, (name, folder) in enumerate(bundles.items())
    }  # fmt: skip
    faiss.omp_set_num_threads(2)  # the exact reference: a batch
    rows = fused_reference(size, folders["ivf"][0], qv, texts)
    reference = [set(r[r >= 0].tolist()) for r in rows]
    faiss.omp_set_num_threads(1)  # one question at a time, as served
    out: dict[str, Any] = {}
    chosen: dict[str, Any] = {}
    for name, (folder, knob) in folders.items():
        out[name] = {"knob": knob, "curve": {}}
        for depth in SERVED_DEPTHS[knob]:
            bundle = Bundle.load(folder, fold_encoder=True, threads=1, **{knob: depth})
            got = [{h.question_id for h in bundle.search(t, 20).hits} for t in texts]
            recall = float(np.mean([len(g & r) / max(len(r), 1)
                                    for g, r in zip(got, reference, strict=True)]))  # fmt: skip
            ms = timed_search(bundle, texts)
            out[name]["curve"][depth] = {"served_recall_at_20": recall, **ms}
            log(f"served, BM25 top {lexical}, {name} {knob} {depth}: recall {recall:.4f}, "
                f"p50 {ms['p50_ms']:.3f} ms")  # fmt: skip
            if recall >= SERVED_TARGET and name not in chosen:
                chosen[name] = (depth, bundle)
    times: dict[str, list[float]] = {name: [] for name in chosen}
    for b, block in enumerate(np.array_split(np.arange(len(texts)), 10)):
        for name in sorted(chosen, reverse=bool(b % 2)):
            times[name] += timed_search(chosen[name][1], [texts[i] for i in block])["all"]
    for name in out:
        for point in out[name]["curve"].values():
            point.pop("all")
    out["side_by_side"] = {
        name: {"depth": chosen[name][0], "p50_ms": float(np.median(t)),
               "p99_ms": float(np.percentile(t, 99))}
        for name, t in times.items()
    }  # fmt: skip
    out["lexical_candidates"] = lexical
    return out


def timed_search(bundle: Any, texts: list[str]) -> dict[str, Any]:
    """Bundle.search(text, 10) one at a time: p50, p99 and every time (ms)."""
    for text in texts[:20]:
        bundle.search(text, 10)
    times = []
    for text in texts:
        started = time.perf_counter()
        bundle.search(text, 10)
        times.append((time.perf_counter() - started) * 1e3)
    return {"p50_ms": float(np.median(times)), "p99_ms": float(np.percentile(times, 99)),
            "all": times}  # fmt: skip


def fastest_reaching(result: dict[str, Any], target: float) -> tuple[str, dict] | None:
    """(depth, point) of the fastest depth reaching recall@20 `target`, or None."""
    points = [(k, v) for k, v in result["curve"].items() if v["recall_at_20"] >= target]
    return min(points, key=lambda kv: kv[1]["p50_ms"]) if points else None


def write(out_dir: Path, label: str, payload: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"graph_index_{label}.json").write_text(json.dumps(payload, indent=1))
    fig, ax = plt.subplots(figsize=(8, 5))
    for r in payload["results"]:
        points = sorted(r["curve"].values(), key=lambda v: v["p50_ms"])
        ax.plot([p["p50_ms"] for p in points], [p["recall_at_20"] for p in points], "o-",
                label=r["candidate"])  # fmt: skip
    ax.axhline(0.95, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_xlabel("p50 ms, one query, one thread (log)")
    ax.set_ylabel("dense recall@20 vs exact")
    ax.set_title(f"Dense indexes at {label}: recall against time")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / f"graph_index_{label}.png", dpi=110)
    plt.close(fig)
    m = payload["machine"]
    lines = [
        f"# Dense indexes at {label} against the served IVF",
        "",
        f"Measured {payload['when']} by `benchmarks/graph_index.py` on {m['cpu_model']}, "
        f"{m['cpus_usable']} cores (commit {str(m['git_commit'])[:10]}).",
        f"{payload['rows']:,} CNN vectors of {payload['dim']} dimensions (`benchmarks/scale.py`'s "
        "synthetic corpus), 1,000 queries, k 20, one query at a time on one thread.",
        f"Graphs and ScaNN are built on {BUILD_THREADS} threads. Recall is against exact search.",
        "The queries' 20th exact neighbour lies "
        f"{payload['neighbourhood']['median_d20_over_d1']:.2f} times as far as the first "
        "(squared L2, median): flat neighbourhoods, many near-ties.",
        "",
        "| candidate | build s | MB | depth knob | fastest depth with recall ≥ 0.95 | "
        "its p50 ms | p99 ms | best recall | at p50 ms | load |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in payload["results"]:
        reach = fastest_reaching(r, 0.95)
        best = max(r["curve"].values(), key=lambda v: v["recall_at_20"])
        build = "—" if r["build_s"] is None else f"{r['build_s']:.0f}"
        reached = (f"{reach[0]} | {reach[1]['p50_ms']:.3f} | {reach[1]['p99_ms']:.3f}"
                   if reach else "not reached | — | —")  # fmt: skip
        lines.append(
            f"| `{r['candidate']}` | {build} | {r['bytes'] / 1e6:.0f} | {r['knob']} | {reached} "
            f"| {best['recall_at_20']:.3f} | {best['p50_ms']:.3f} "
            f"| {r['load_before']} → {r['load_after']} |"
        )
    load = payload["side_by_side_load"]
    lines += [
        "",
        "## Side by side",
        "",
        "Each candidate at its fastest depth reaching the recall, queries in blocks "
        f"alternated between candidates, 5 rounds (load {load[0]} → {load[1]}).",
        "",
        "| recall ≥ | candidate | depth | p50 ms | p99 ms |",
        "|---:|---|---:|---:|---:|",
    ]
    for target, sides in payload["side_by_side"].items():
        for name, v in sides.items():
            lines.append(f"| {target} | `{name}` | {v['depth']} | {v['p50_ms']:.3f} | "
                         f"{v['p99_ms']:.3f} |")  # fmt: skip
    for lexical, sv in payload["served"].items():
        lines += ["", f"## As served: fused with BM25's top {lexical}", "",
                  "`Bundle.search` as the service runs it (folded encoder, BM25's top "
                  f"{lexical} on a second thread, k 10), the graph in place of the IVF. "
                  "Served recall@20 is against the same fusion over an exact dense search.",
                  "", "| index | depth | served recall@20 | fused p50 ms | fused p99 ms |",
                  "|---|---:|---:|---:|---:|"]  # fmt: skip
        for name, entry in sv.items():
            if name in ("side_by_side", "load", "lexical_candidates"):
                continue
            for depth, v in entry["curve"].items():
                lines.append(f"| `{name}` | {entry['knob']} {depth} | "
                             f"{v['served_recall_at_20']:.4f} | {v['p50_ms']:.3f} | "
                             f"{v['p99_ms']:.3f} |")  # fmt: skip
        lines += ["", f"Each at its fastest depth keeping served recall {SERVED_TARGET}, "
                  f"alternated in blocks (load {sv['load'][0]} → {sv['load'][1]}):", "",
                  "| index | depth | fused p50 ms | fused p99 ms |",
                  "|---|---:|---:|---:|"]  # fmt: skip
        for name, v in sv["side_by_side"].items():
            lines.append(f"| `{name}` | {v['depth']} | {v['p50_ms']:.3f} | {v['p99_ms']:.3f} |")
    lines += ["", f"![recall against time](graph_index_{label}.png)", "", "## Every depth", ""]
    for r in payload["results"]:
        lines += [f"`{r['candidate']}`, {r['knob']}:", "",
                  "| depth | recall@20 | p50 ms | p99 ms |", "|---:|---:|---:|---:|"]  # fmt: skip
        for depth, v in r["curve"].items():
            lines.append(
                f"| {depth} | {v['recall_at_20']:.4f} | {v['p50_ms']:.3f} | {v['p99_ms']:.3f} |"
            )
        lines.append("")
    (out_dir / f"graph_index_{label}.md").write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=Path, required=True, help="a scale.py size folder")
    parser.add_argument("--candidates", default=DEFAULT)
    parser.add_argument("--label")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    parser.add_argument("--lexical-depths", help="BM25 depths served, e.g. 50,100 "
                        "(default: the bundle's search.json)")  # fmt: skip
    parser.add_argument("--dense-only", action="store_true",
                        help="measure the dense search alone, no served pass")  # fmt: skip
    args = parser.parse_args()

    def log(line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)

    import faiss

    truth = np.load(args.size / "truth.npy")
    qv = queries(args.size)
    results = [measure(spec, args.size, qv, truth, log) for spec in candidates(args.candidates)]
    versions = {"faiss": faiss.__version__}
    for name in ("usearch", "scann"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[name] = importlib.metadata.version(name)
    load = [round(v, 2) for v in os.getloadavg()]
    paired = {str(t): side_by_side(args.size, results, qv, t) for t in SIDE_BY_SIDE}
    own = json.loads((args.size / "models" / "search.json").read_text())["lexical_candidates"]
    depths = [int(d) for d in args.lexical_depths.split(",")] if args.lexical_depths else [own]
    if args.dense_only:
        depths = []
    passes = {}
    for lexical in depths:
        served_path = args.size / "graph" / f"served-L{lexical}.json"
        if not served_path.is_file():
            before = [round(v, 2) for v in os.getloadavg()]
            result = served(args.size, results, qv, lexical, log)
            result["load"] = [before, [round(v, 2) for v in os.getloadavg()]]
            write_text_atomic(served_path, json.dumps(result, indent=1))
        passes[str(lexical)] = json.loads(served_path.read_text())
    payload = {
        "served": passes,
        "neighbourhood": neighbourhood(vectors(args.size), qv, truth),
        "side_by_side": paired,
        "side_by_side_load": [load, [round(v, 2) for v in os.getloadavg()]],
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": describe(ROOT, versions),
        "rows": int(sum(np.load(f, mmap_mode="r").shape[0] for f in
                        json.loads((args.size / "build.json").read_text())["vectors"])),
        "dim": int(qv.shape[1]),
        "results": results,
    }  # fmt: skip
    write(args.out, args.label or args.size.name, payload)


if __name__ == "__main__":
    main()
