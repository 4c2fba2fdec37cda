#!/usr/bin/env python
"""BM25 at scale: our MaxScore kernel against tantivy and PISA, and how deep fusion reads.

    python benchmarks/bm25_engines.py --size /tmp/qpr-scale/1M-f2      # a scale.py size
    python benchmarks/bm25_engines.py --size /tmp/qpr-scale/10M --depths 20,50,100

Two parts, on a size `benchmarks/scale.py` built (its bundle `models/` and its 1000
queries):

1. **Kernels.** tantivy (Rust, block-max WAND over compressed postings) against
   `qpr.retrieval.bm25.BM25Index.search` on the same words and the same formula. Both index
   the bundle's questions as our analyzer cuts them (lower-case words, English stop words
   out, English stems), joined by spaces; tantivy reads them with its whitespace
   tokenizer. tantivy fixes k1 1.2 and b 0.75, so ours is rebuilt with those here. Its
   scores carry Lucene's (k1 + 1) factor, divided out to compare; its length norms are
   Lucene's one-byte codes, so scores differ in the last digits. One
   thread each, top k for each depth of `--depths`, query blocks alternated side by side.
   "same top 10": the share of queries whose top-10 scores agree within 1 %.
2. **Depth.** The bundle's fused search with BM25's top `d` for each depth d (the
   service's `lexical_candidates`; the pipeline takes 100): served recall@20 against the
   deepest depth, P@1 against the query's cluster, fused p50 / p99, one question at a time.

3. **PISA**, with `--pisa-python PY` (a Python where `pip install pyterrier-pisa` ran;
   its wheel pins packages ours does not): PISA's maxscore, block_max_maxscore and
   block_max_wand on the same words with the same k1 and b, in a process of its own
   (`benchmarks/pisa_worker.py`), as more sides of part 1. Its index is kept in the size
   folder (`pisa-index/`) for the next run.

    python benchmarks/bm25_engines.py --size /tmp/qpr-scale/1M-f2 --skip-depth \
        --label 1M_pisa --pisa-python /opt/pisa-venv/bin/python

Results: docs/results/bm25_engines_<label>.{json,md} (`--label`, default the size's
folder name; `--rewrite` writes the Markdown again from the JSON). tantivy comes from the
`bench` extra (`pip install -e .[bench]`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from machine_info import describe  # noqa: E402

from qpr.artifacts import BM25_FILE, QUESTIONS_FILE  # noqa: E402
from qpr.retrieval.bm25 import BM25Index  # noqa: E402
from qpr.text.words import tokenize  # noqa: E402

TANTIVY_K1, TANTIVY_B = 1.2, 0.75  # fixed inside tantivy (query/bm25.rs)
BLOCKS = 10


def timed(fn: Any, items: list[int]) -> list[float]:
    out = []
    for item in items:
        started = time.perf_counter()
        fn(item)
        out.append((time.perf_counter() - started) * 1e3)
    return out


def per_query(fn: Any) -> Any:
    """A side of `side_by_side` that times fn(i), one query at a time, here."""
    return lambda items: timed(fn, items)


def side_by_side(sides: dict[str, Any], n: int) -> dict[str, list[float]]:
    """Each side's per-query milliseconds, blocks of queries alternated between sides. A
    side takes a block (a list of query numbers) and returns each query's milliseconds
    (`per_query`, or PISA timing itself in its own process)."""
    for side in sides.values():  # compile and warm every side
        side(list(range(min(n, 50))))
    times: dict[str, list[float]] = {name: [] for name in sides}
    for b, block in enumerate(np.array_split(np.arange(n), BLOCKS)):
        for name in sorted(sides, reverse=bool(b % 2)):
            times[name] += sides[name](block.tolist())
    return times


class Pisa:
    """PISA in an interpreter of its own (`benchmarks/pisa_worker.py`), one JSON line each
    way; its log (PISA's progress, a traceback) goes to `log`."""

    def __init__(self, python: Path, log: Path) -> None:
        self.log = log
        self.info: dict[str, Any] = {}  # what the build answered
        with log.open("w") as stderr:
            self.process = subprocess.Popen(
                [str(python), str(ROOT / "benchmarks" / "pisa_worker.py")],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )

    def ask(self, **request: Any) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(
                f"the PISA worker ended (exit {self.process.wait()}); its log: {self.log}"
            )
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"the PISA worker: {answer['error']}")
        return answer

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)


def summary(ms: list[float]) -> dict[str, float]:
    return {"p50_ms": float(np.median(ms)), "p99_ms": float(np.percentile(ms, 99))}


def tantivy_index(words: list[list[str]], where: Path, log: Any) -> Any:
    """A one-segment tantivy index of the documents' words (row = doc id)."""
    import tantivy

    schema = tantivy.SchemaBuilder().add_text_field("body", tokenizer_name="whitespace").build()
    index = tantivy.Index(schema, path=str(where))
    writer = index.writer(heap_size=2_000_000_000, num_threads=1)  # one segment: doc = row
    started = time.perf_counter()
    for row, doc in enumerate(words):
        writer.add_document(tantivy.Document(body=" ".join(doc)))
        if row and row % 1_000_000 == 0:
            log(f"tantivy: {row:,} documents")
    writer.commit()
    writer.wait_merging_threads()
    index.reload()
    log(f"tantivy: indexed {len(words):,} documents in {time.perf_counter() - started:.0f} s")
    return index


def corpus(size: Path) -> tuple[str | None, pd.Series]:
    """(the stemmer, the questions in row order) of a size: its bundle's when built, else
    its corpus shards' (`scale.py`'s first step) with params' stemmer. The kernels need
    nothing else, so a size too large to build here can still be measured."""
    if (size / "models" / BM25_FILE).exists():
        stemmer = BM25Index.load(size / "models" / BM25_FILE).stemmer
        return stemmer, pd.read_parquet(size / "models" / QUESTIONS_FILE, columns=["text"])["text"]
    from qpr.config import load_settings

    shards = sorted((size / "shards").glob("logs-*.parquet"))
    if not shards:
        raise SystemExit(f"{size}: neither a built bundle nor corpus shards")
    texts = pd.concat([pd.read_parquet(s, columns=["question"])["question"] for s in shards])
    stemmer = load_settings(ROOT / "params.yaml").index.lexical.stemmer
    return stemmer, texts.reset_index(drop=True)


def kernels(
    size: Path, depths: list[int], log: Any, pisa_python: Path | None = None
) -> dict[str, Any]:
    import tantivy

    stemmer, texts = corpus(size)
    started = time.perf_counter()
    ours = BM25Index.build(texts.tolist(), k1=TANTIVY_K1, b=TANTIVY_B, stemmer=stemmer)
    build_ours = time.perf_counter() - started
    words = tokenize(texts.tolist(), stemmer=stemmer)
    del texts
    queries = pd.read_parquet(size / "queries.parquet")["question"].tolist()
    query_words = tokenize(queries, stemmer=stemmer)
    pisa = None
    if pisa_python is not None:
        pisa = pisa_start(pisa_python, size, words, query_words, log)
    with tempfile.TemporaryDirectory(prefix="tantivy-") as where:
        started = time.perf_counter()
        index = tantivy_index(words, Path(where), log)
        build_tantivy = time.perf_counter() - started
        del words
        searcher = index.searcher()
        schema = index.schema

        def theirs_query(i: int) -> Any:
            terms = sorted(set(query_words[i]))
            should = [(tantivy.Occur.Should, tantivy.Query.term_query(schema, "body", t))
                      for t in terms]  # fmt: skip
            return tantivy.Query.boolean_query(should)

        # count=False: counting every match would visit every posting and turn off
        # tantivy's block-max WAND pruning
        prepared = [theirs_query(i) for i in range(len(queries))]
        out: dict[str, Any] = {
            "build_s": {"ours": build_ours, "tantivy": build_tantivy},
            "documents": ours.num_docs,
            "queries": len(queries),
        }
        if pisa is not None:
            out["build_s"]["pisa"] = pisa.info["build_s"]
            out["pisa_version"] = pisa.info["version"]
        for k in depths:
            sides = {
                "ours": per_query(lambda i, k=k: ours.search(queries[i], k)),
                "tantivy": per_query(
                    lambda i, k=k: searcher.search(prepared[i], limit=k, count=False)
                ),
            }
            for algorithm in PISA_ALGORITHMS if pisa is not None else ():
                sides[f"pisa_{algorithm}"] = lambda items, k=k, a=algorithm: pisa.ask(
                    time=items, k=k, algorithm=a
                )["ms"]
            times = side_by_side(sides, len(queries))
            row = {name: summary(ms) for name, ms in times.items()}
            row["ratio_p50_ours_to_tantivy"] = row["ours"]["p50_ms"] / row["tantivy"]["p50_ms"]
            if pisa is not None:
                fastest = min(PISA_ALGORITHMS, key=lambda a: row[f"pisa_{a}"]["p50_ms"])
                row["pisa_fastest"] = fastest
                row["ratio_p50_ours_to_pisa"] = (
                    row["ours"]["p50_ms"] / row[f"pisa_{fastest}"]["p50_ms"]
                )
            out[f"k{k}"] = row
            log(f"k {k}: p50 ms " + ", ".join(f"{n} {row[n]['p50_ms']:.3f}" for n in sides))
        agree = []
        for i in range(min(200, len(queries))):
            mine = np.sort(ours.search(queries[i], 10)[0])[::-1]
            mine = mine[np.isfinite(mine)]
            hits = searcher.search(prepared[i], limit=10, count=False).hits
            # tantivy keeps Lucene's (k1 + 1) factor in the numerator; ours, as bm25s's
            # "lucene" method, leaves it out: a constant factor, the same ranking
            theirs = np.sort(np.array([s for s, _ in hits], dtype=np.float32))[::-1]
            theirs /= TANTIVY_K1 + 1
            agree.append(mine.size == theirs.size and np.allclose(mine, theirs, rtol=0.01))
        out["same_top10_share"] = float(np.mean(agree))
    if pisa is not None:
        out["pisa_agreement"] = pisa_agreement(ours, queries, pisa)
        pisa.close()
    return out


PISA_ALGORITHMS = ("maxscore", "block_max_maxscore", "block_max_wand")


def pisa_start(
    python: Path, size: Path, words: list[list[str]], query_words: list[list[str]], log: Any
) -> Pisa:
    """A PISA worker holding an index of the documents' words (row = docno; built once in
    `size`/pisa-index, kept for the next run) and the queries' word counts. Its build
    time is that of the first build."""
    where = size / "pisa-index"
    docs = size / "pisa-docs.txt"
    if not docs.exists():
        partial = docs.with_suffix(".partial")
        with partial.open("w", encoding="utf-8") as out:
            for doc in words:
                out.write(" ".join(doc) + "\n")
        partial.replace(docs)
    pisa = Pisa(python, size / "pisa-worker.log")
    started = time.perf_counter()
    info = pisa.ask(build=str(where), docs=str(docs), k1=TANTIVY_K1, b=TANTIVY_B)
    first = where / "qpr-first-build.json"  # a rerun reuses the index: keep the first's time
    if first.exists():
        info["build_s"] = json.loads(first.read_text())["build_s"]
    else:
        first.write_text(json.dumps(info))
    log(f"PISA {info['version']}: {info['documents']:,} documents, "
        f"ready in {time.perf_counter() - started:.0f} s")  # fmt: skip
    if info["documents"] != len(words):
        raise RuntimeError(f"PISA indexed {info['documents']:,} of {len(words):,} documents")
    pisa.ask(queries=[dict(Counter(q)) for q in query_words])
    pisa.info = info
    return pisa


def pisa_agreement(ours: BM25Index, queries: list[str], pisa: Pisa) -> dict[str, float]:
    """On 200 queries: the share of our top 10 rows in PISA's top 10, and the share of
    queries whose top-1 scores agree within 1 %. PISA's BM25 keeps the (k1 + 1) factor,
    divided out here. Its idf is Robertson and Spärck Jones's, without Lucene's "1 +"
    inside the log (floored at 1e-6), so common words weigh less and whole score lists
    are not compared."""
    n = min(200, len(queries))
    tops = pisa.ask(top=list(range(n)), k=10)["tops"]
    common, top1 = [], []
    for i, theirs in enumerate(tops):
        scores, rows = ours.search(queries[i], 10)
        kept = rows[rows >= 0]
        common.append(len(set(kept.tolist()) & set(theirs["rows"])) / max(len(kept), 1))
        if theirs["scores"] and kept.size:
            first = max(theirs["scores"]) / (TANTIVY_K1 + 1)
            top1.append(bool(np.isclose(float(scores[0]), first, rtol=0.01)))
    return {
        "top10_rows_in_common": float(np.mean(common)),
        "top1_score_within_1pct": float(np.mean(top1)),
    }


def depth(size: Path, depths: list[int], log: Any) -> dict[str, Any]:
    """The fused search at each BM25 depth, as the bundle serves it."""
    import faiss

    from qpr.retrieval.bundle import Bundle

    faiss.omp_set_num_threads(1)
    bundle = Bundle.load(size / "models", fold_encoder=True, threads=1)
    frame = pd.read_parquet(size / "queries.parquet")
    queries, clusters = frame["question"].tolist(), frame["cluster_id"].to_numpy()
    base = bundle.search_config
    ranked: dict[int, list[list[int]]] = {}
    out: dict[str, Any] = {"served_depth": base.lexical_candidates}
    for d in sorted(depths, reverse=True):
        bundle._ranker.config = replace(base, lexical_candidates=d)  # the service's knob
        results = []

        def one(i: int) -> None:
            results.append(bundle.search(queries[i], 20))  # noqa: B023

        ms = side_by_side({"fused": per_query(one)}, len(queries))["fused"]
        results = results[-len(queries) :]  # the timed pass, after the warm-up
        ranked[d] = [[h.question_id for h in r.hits] for r in results]
        p1 = np.mean([bool(r.hits) and int(r.hits[0].cluster_id) == int(c)
                      for r, c in zip(results, clusters, strict=True)])  # fmt: skip
        deepest = ranked[max(ranked)]
        recall = np.mean([len(set(a) & set(b)) / max(len(b), 1)
                          for a, b in zip(ranked[d], deepest, strict=True)])  # fmt: skip
        out[f"d{d}"] = {**summary(ms), "p1": float(p1), "recall_at_20_vs_deepest": float(recall)}
        log(f"depth {d}: fused p50 {out[f'd{d}']['p50_ms']:.3f} ms, P@1 {p1:.4f}, "
            f"recall@20 vs depth {max(ranked)} {recall:.4f}")  # fmt: skip
    return out


def write(out_dir: Path, label: str, result: dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"bm25_engines_{label}.json").write_text(json.dumps(result, indent=1))
    k, m = result["kernels"], result["machine"]
    lines = [
        f"# BM25 at {label}: our kernel against tantivy"
        + (" and PISA" if "pisa_version" in k else "")
        + (", and the fused search's depth" if result["depth"] else ""),
        "",
        f"Measured {result['when']} by `benchmarks/bm25_engines.py` on "
        f"{m['cpu_model']}, {m['cpus_usable']} cores, {m['memory_gib']} GiB "
        f"(commit {str(m['git_commit'])[:10]}; tantivy {m['versions']['tantivy']}).",
        f"Load average (1/5/15 min): {result['load_before']} before, {result['load_after']} after.",
        "",
        f"{k['documents']:,} questions, {k['queries']:,} queries, one thread each, blocks "
        "alternated.",
        "Both score BM25 with k1 1.2, b 0.75 over the same stemmed words (tantivy's fixed values).",
        "",
        "## Kernels",
        "",
        "| top k | ours p50 ms | ours p99 ms | tantivy p50 ms | tantivy p99 ms "
        "| ours / tantivy p50 |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for key, row in k.items():
        if key.startswith("k"):
            lines.append(
                f"| {key[1:]} | {row['ours']['p50_ms']:.3f} | {row['ours']['p99_ms']:.3f} | "
                f"{row['tantivy']['p50_ms']:.3f} | {row['tantivy']['p99_ms']:.3f} | "
                f"{row['ratio_p50_ours_to_tantivy']:.2f} |"
            )
    lines += [
        "",
        f"Same top-10 scores (within 1 %): {k['same_top10_share']:.0%} of 200 queries. "
        f"Build: ours {k['build_s']['ours']:.0f} s, tantivy {k['build_s']['tantivy']:.0f} s "
        "(one writer thread).",
    ]
    if "pisa_version" in k:
        lines += pisa_lines(k)
    if result["depth"]:
        lines += [
            "",
            "## The fused search's BM25 depth",
            "",
            "| BM25 depth | fused p50 ms | fused p99 ms | P@1 | recall@20 vs deepest |",
            "|---:|---:|---:|---:|---:|",
        ]
    for key, row in result["depth"].items():
        if key.startswith("d"):
            lines.append(
                f"| {key[1:]} | {row['p50_ms']:.3f} | {row['p99_ms']:.3f} | {row['p1']:.4f} | "
                f"{row['recall_at_20_vs_deepest']:.4f} |"
            )
    (out_dir / f"bm25_engines_{label}.md").write_text("\n".join(lines) + "\n")


def pisa_lines(k: dict[str, Any]) -> list[str]:
    """The PISA section of the results page: each query algorithm against ours."""
    lines = [
        "",
        f"## Against PISA (pyterrier-pisa {k['pisa_version']})",
        "",
        "PISA indexes the same words (no stemmer, no stop list of its own) and scores them "
        "with the same k1 and b, block-max data in blocks of 64. It runs in a Python of its "
        "own (`benchmarks/pisa_worker.py`) and times each query around its compiled call "
        "alone; the blocks of queries alternate with ours as above.",
        "",
        "| top k | ours p50 ms | "
        + " | ".join(f"PISA {a} p50 ms" for a in PISA_ALGORITHMS)
        + " | PISA fastest p99 ms | ours / PISA fastest p50 |",
        "|---:|---:|" + "---:|" * len(PISA_ALGORITHMS) + "---:|---:|",
    ]
    for key, row in k.items():
        if key.startswith("k") and "pisa_fastest" in row:
            fastest = row[f"pisa_{row['pisa_fastest']}"]
            lines.append(
                f"| {key[1:]} | {row['ours']['p50_ms']:.3f} | "
                + " | ".join(f"{row[f'pisa_{a}']['p50_ms']:.3f}" for a in PISA_ALGORITHMS)
                + f" | {fastest['p99_ms']:.3f} | {row['ratio_p50_ours_to_pisa']:.2f} |"
            )
    lines += [
        "",
        f"On 200 queries, {k['pisa_agreement']['top10_rows_in_common']:.0%} of our top 10 "
        f"rows are in PISA's; the top-1 scores agree within 1 % (PISA's divided by k1 + 1) "
        f"for {k['pisa_agreement']['top1_score_within_1pct']:.0%}. The idf differs: "
        "PISA's is log((N − df + 0.5) / (df + 0.5)), floored at 10⁻⁶; ours and tantivy's "
        "log(1 + (N − df + 0.5) / (df + 0.5)). Common words weigh less in PISA's. PISA's "
        f"build, inverted index and block-max BM25 data: {k['build_s']['pisa']:.0f} s.",
    ]
    return lines


def plot(out_dir: Path, labels: list[str], k: int = 50) -> Path:
    """p50 and p99 against N, one line per engine (PISA: its fastest algorithm at each N),
    from the results of `labels`, at top k: docs/results/bm25_engines_sizes.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads((out_dir / f"bm25_engines_{lb}.json").read_text()) for lb in labels]
    rows.sort(key=lambda r: r["kernels"]["documents"])
    sizes = [r["kernels"]["documents"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharex=True)
    for name, pick in (
        ("ours", lambda row: row["ours"]),
        ("PISA (fastest)", lambda row: row[f"pisa_{row['pisa_fastest']}"]),
        ("tantivy", lambda row: row["tantivy"]),
    ):
        for ax, stat in zip(axes, ("p50_ms", "p99_ms"), strict=True):
            ms = [pick(r["kernels"][f"k{k}"])[stat] for r in rows]
            ax.plot(sizes, ms, marker="o", label=name)
    for ax, stat in zip(axes, ("p50", "p99"), strict=True):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("questions indexed")
        ax.set_ylabel(f"{stat} ms, top {k}, one thread")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend()
    fig.suptitle("BM25 kernels side by side: ours, PISA, tantivy")
    fig.tight_layout()
    path = out_dir / "bm25_engines_sizes.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=Path, help="a scale.py size folder")
    parser.add_argument("--depths", default="10,20,50,100")
    parser.add_argument("--label")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    parser.add_argument(
        "--pisa-python",
        type=Path,
        help="a Python with pyterrier-pisa installed: PISA joins the kernels' comparison",
    )
    parser.add_argument("--skip-depth", action="store_true", help="the kernels alone")
    parser.add_argument(
        "--rewrite", action="store_true", help="the Markdown again from the JSON, no run"
    )
    parser.add_argument(
        "--plot",
        help="labels of earlier runs (comma-separated): their kernels' p50 / p99 against N",
    )
    args = parser.parse_args()
    if args.plot:
        print(plot(args.out, args.plot.split(",")))
        return
    if args.size is None:
        parser.error("--size is needed, unless --plot")
    depths = [int(d) for d in args.depths.split(",")]
    label = args.label or args.size.name
    if args.rewrite:
        write(args.out, label, json.loads((args.out / f"bm25_engines_{label}.json").read_text()))
        return

    def log(line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)

    import os

    import faiss
    import tantivy

    versions = {"faiss": faiss.__version__, "tantivy": tantivy.__version__}
    result: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": describe(ROOT, versions),
        "load_before": [round(x, 2) for x in os.getloadavg()],
    }
    result["depth"] = {} if args.skip_depth else depth(args.size, depths, log)
    result["kernels"] = kernels(args.size, depths, log, args.pisa_python)
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    write(args.out, label, result)


if __name__ == "__main__":
    main()
