"""How deep the fused search reads BM25: quality and time at each depth, side by side.

Why: the fused search takes BM25's top `index.lexical.candidates` (100 until this was
measured). On Quora's 134k questions BM25 is the longer half of a question's search: the
dense half waits for it. A shallower BM25 search prunes more and returns sooner, and the
union the companion re-scores is smaller. This measures what that costs in quality.

For each built project (a folder with artifacts/cluster/ and models/, as the pipeline
writes them), the bundle is served at each --depths value, everything else as its
search.json says (α, companion weight, nprobe; not tuned again per depth):

- quality: a seeded sample of its --split queries (val: choose; test: report), as typed
  and with --share of their words typo'd (`qpr.text.noise.typos`), through
  `Bundle.search_batch` with each query's own question left out (`served_system`, the
  evaluate stage's relevance); success@1, success@10 and MRR by trec_eval;
- time: the same queries one at a time through `Bundle.search` (k 10), the depths taking
  turns per question so that each sees the same load; the encoder folded and FAISS on one
  OpenMP thread, as the service loads and runs it. p50 and p99 in ms.

    PYTHONPATH=src:. .venv/bin/python benchmarks/lexical_depth.py \\
        --project embedded=/tmp/embedded --project quora=/tmp/quora --split val

Projects already in the JSON are kept unless --fresh. Writes
docs/results/lexical_depth.{json,md} (or --out DIR).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_info import describe
from noisy_queries import measures, sample

from qpr.config import load_settings
from qpr.evaluation.queries import SearchTask, judged_questions, query_set
from qpr.evaluation.served import served_system
from qpr.io import write_json_atomic, write_text_atomic
from qpr.paths import ProjectPaths
from qpr.pipeline.handoff import read_cluster_outputs, read_indexed_questions
from qpr.text.noise import typos

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"


def log(message: str) -> None:
    print(message, flush=True)


def bundles_at(models: Path, depths: list[int]) -> tuple[dict[int, Any], np.ndarray]:
    """(the bundle in `models` once per BM25 depth, loaded once and folded as served; its
    rows' question ids int64 [N])."""
    from qpr.retrieval.bundle import Bundle
    from qpr.retrieval.loading import load_bundle_parts

    parts = load_bundle_parts(models, fold_encoder=True)
    if not parts.config.fused:
        raise SystemExit(f"{models}: the bundle does not fuse BM25 in; no depth to vary")
    bundles = {
        depth: Bundle(
            models_dir=parts.root,
            encoder=parts.encoder,
            questions=parts.questions,
            config=replace(parts.config, lexical_candidates=depth),
            fingerprint=parts.fingerprint,
            reranker=parts.reranker,
            companion=parts.companion,
        )
        for depth in depths
    }
    return bundles, np.asarray(parts.questions.qids, np.int64)


def served_ms(bundles: dict[int, Any], texts: list[str]) -> dict[int, dict[str, float]]:
    """Each depth's p50 / p99 ms of one `Bundle.search` (k 10), the depths taking turns
    per question, after 50 warm-up questions each."""
    from qpr.retrieval.dense import faiss_threads

    with faiss_threads(1):  # as the service runs FAISS (qpr.serve.openmp)
        for bundle in bundles.values():
            for text in texts[:50]:
                bundle.search(text, k=10)
        times: dict[int, list[float]] = {depth: [] for depth in bundles}
        for text in texts:
            for depth, bundle in bundles.items():
                started = time.perf_counter()
                bundle.search(text, k=10)
                times[depth].append(1000 * (time.perf_counter() - started))
    return {
        depth: {
            "p50_ms": round(float(np.median(t)), 3),
            "p99_ms": round(float(np.percentile(t, 99)), 3),
        }
        for depth, t in times.items()
    }


def project_rows(name: str, root: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per depth for the project in `root`."""
    settings = load_settings(args.params)
    paths = ProjectPaths(root)
    questions = judged_questions(read_cluster_outputs(paths)[0], read_indexed_questions(paths))
    queries = sample(query_set(questions, args.split), args.queries, args.seed)
    noisy = typos(queries.texts, args.share, args.seed)
    bundles, row_to_qid = bundles_at(paths.models_dir, args.depths)
    log(f"{name}: {len(queries.texts):,} {args.split} queries; depths {args.depths}")
    load_before = round(os.getloadavg()[0], 2)
    timing = served_ms(bundles, queries.texts)
    rows = []
    for depth, bundle in bundles.items():
        row: dict[str, Any] = {"project": name, "root": str(root), "depth": depth}
        for kind, texts in (("clean", queries.texts), ("noisy", noisy)):
            task = SearchTask(
                [], row_to_qid, replace(queries, texts=texts), np.full(len(texts), -1),
                settings.evaluate.k,
            )  # fmt: skip
            row[kind] = measures(served_system(bundle, task, log))
        row |= timing[depth]
        row["queries"] = len(queries.texts)
        row["load_avg"] = [load_before, round(os.getloadavg()[0], 2)]
        log(json.dumps(row))
        rows.append(row)
    return rows


def markdown(payload: dict) -> str:
    machine = payload["machine"]
    params = payload["params"]
    lines = [
        "# How deep the fused search reads BM25",
        "",
        f"Written by `benchmarks/lexical_depth.py` on {payload['date']} "
        f"({machine['cpu_model']}, {machine['cpus_usable']} cores); never edited by hand.",
        "",
        f"{params['queries']} seeded {params['split']} queries a project (seed "
        f"{params['seed']}), each leaving its own question out; noisy: "
        f"{params['share']:.0%} of their words typo'd. Each depth serves the bundle's own "
        "search.json otherwise (α, companion weight, nprobe). Time: one question at a "
        "time, k 10, the depths taking turns per question; encoder folded, FAISS on one "
        "OpenMP thread, as the service runs it.",
        "",
        "| project | BM25 depth | P@1 | P@10 | MRR | noisy P@1 | noisy MRR | p50 ms | p99 ms "
        "| load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in payload["rows"]:
        clean, noisy = row["clean"], row["noisy"]
        load = "-".join(f"{v:.1f}" for v in row["load_avg"])
        lines.append(
            f"| {row['project']} | {row['depth']} | {clean['success_1']:.4f} | "
            f"{clean['success_10']:.4f} | {clean['recip_rank']:.4f} | "
            f"{noisy['success_1']:.4f} | {noisy['recip_rank']:.4f} | {row['p50_ms']:.3f} | "
            f"{row['p99_ms']:.3f} | {load} |"
        )
    if payload.get("about"):
        lines += ["", payload["about"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--project", action="append", required=True, help="NAME=FOLDER")
    parser.add_argument("--depths", type=lambda s: [int(x) for x in s.split(",")],
                        default=[100, 50, 30])  # fmt: skip
    parser.add_argument("--split", default="val", choices=("val", "test"))
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--share", type=float, default=0.2, help="typo'd share of words")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    parser.add_argument("--about", default="", help="what the projects are, in words")
    parser.add_argument("--fresh", action="store_true", help="measure every project again")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    out = args.out / "lexical_depth.json"
    done: dict[str, list] = {}
    if out.is_file() and not args.fresh:
        for row in json.loads(out.read_text())["rows"]:
            done.setdefault(row["project"], []).append(row)
    params = {k: getattr(args, k) for k in ("queries", "share", "seed", "split", "depths")}
    for spec in args.project:
        name, _, folder = spec.partition("=")
        if name in done:
            log(f"{name}: kept from the JSON")
            continue
        done[name] = project_rows(name, Path(folder), args)
        payload = {
            "date": pd.Timestamp.now(tz="UTC").strftime("%Y-%m-%d %H:%M UTC"),
            "machine": describe(ROOT, {"numpy": np.__version__}, load_avg=list(os.getloadavg())),
            "params": params,
            "about": args.about,
            "rows": [row for rows in done.values() for row in rows],
        }
        args.out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out, payload)
        write_text_atomic(args.out / "lexical_depth.md", markdown(payload))
    print((args.out / "lexical_depth.md").read_text())


if __name__ == "__main__":
    main()
