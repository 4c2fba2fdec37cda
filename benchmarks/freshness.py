#!/usr/bin/env python
"""Fresh questions without retraining: how fast they are served, and what deltas cost.

    python benchmarks/freshness.py --models-dir models          # writes docs/results/
    python benchmarks/freshness.py --models-dir models --quick  # fewer deltas and queries

What it does (every number measured on this machine, now), on a copy of the bundle:

1. New questions: a synthetic day of logs after the training data (`qpr.data.synth`),
   keeping the questions the bundle does not serve; each delta gets N of them, written as
   a log file.
2. End to end, per delta: the file through the raw-log gate and cleaning, encoded, written
   as a delta (`qpr.deltas.add.add_files`), the bundle loaded again (what the service's
   reloader does before its canaries) and the first search that returns a new question.
   Seconds per step; p50 / p99 over the deltas.
3. Search latency, one question at a time (`Bundle.search`, k 10, as the service calls it):
   p50 / p99 after 1, 5 and 20 deltas, after 20 deltas with T tombstones, and after
   compaction (`qpr.deltas.add.compact` with params.yaml's index factory).
4. The IDF rule's damage: the share of the delta questions' BM25 words unknown to the
   main vocabulary (they score nothing until compaction).

The machine is shared (2 cores): every latency is a median of repeats with its range.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from qpr.artifacts import DELTAS_DIR, DELTAS_MANIFEST_FILE  # noqa: E402
from qpr.config import load_settings  # noqa: E402
from qpr.data.loaders import clean_logs, read_log_file  # noqa: E402
from qpr.data.synth import write_day  # noqa: E402
from qpr.deltas.add import add_files, compact, delete_questions  # noqa: E402
from qpr.deltas.format import live_questions  # noqa: E402
from qpr.retrieval.bundle import Bundle  # noqa: E402
from qpr.retrieval.dense import IndexConfig, build_index  # noqa: E402


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def new_question_logs(models: Path, work: Path, want: int, seed: int) -> pd.DataFrame:
    """Log rows (one per distinct question the bundle does not serve), at least `want`."""
    served = set(live_questions(models)["text"].str.lower())
    rows: list[pd.DataFrame] = []
    day = dt.date(2027, 1, 1)
    while sum(len(r) for r in rows) < want:
        path = write_day(work / "synth", day, seed=seed, rows=20_000, intents=400)
        frame, _ = clean_logs(read_log_file(path), min_chars=2, max_chars=400)
        frame = frame[["timestamp", "question", "answer_id"]]
        frame = frame[~frame["question"].str.lower().isin(served)]
        frame = frame.drop_duplicates("question")
        served |= set(frame["question"].str.lower())
        rows.append(frame)
        day += dt.timedelta(days=1)
    return pd.concat(rows, ignore_index=True).head(want)


def percentiles(values: list[float]) -> dict[str, float]:
    array = np.asarray(values, np.float64)
    return {
        "p50": float(np.percentile(array, 50)),
        "p99": float(np.percentile(array, 99)),
        "n": int(array.size),
    }


def latency(bundle: Bundle, queries: list[str], repeats: int) -> dict[str, Any]:
    """p50 / p99 ms of one-question searches, the median over repeats and its range."""
    for query in queries[:20]:
        bundle.search(query, k=10)
    runs = []
    for _ in range(repeats):
        times = []
        for query in queries:
            started = time.perf_counter()
            bundle.search(query, k=10)
            times.append((time.perf_counter() - started) * 1e3)
        runs.append(percentiles(times))
    return {name: statistics.median(r[name] for r in runs) for name in ("p50", "p99")} | {
        "p99_range": [min(r["p99"] for r in runs), max(r["p99"] for r in runs)],
        "queries": len(queries),
        "repeats": repeats,
    }


def add_one(models: Path, rows: pd.DataFrame, path: Path, settings: Any) -> dict[str, float]:
    """One delta end to end: gate → delta → load → the first answer of a new question."""
    rows.to_json(path, orient="records", lines=True)
    started = time.perf_counter()
    out = add_files(models, [path], settings.quality, batch_size=256, threads=1)
    added = time.perf_counter()
    bundle = Bundle.load(models)
    loaded = time.perf_counter()
    hits = bundle.search(rows["question"].iloc[0], k=5).hits
    served = time.perf_counter()
    return {
        "questions": out["added"],
        "gate_and_delta_s": added - started,
        "load_s": loaded - added,
        "first_answer_s": served - loaded,
        "end_to_end_s": served - started,
        # the new question itself first (an asymmetric bundle's query student need not
        # put it at distance 0)
        # (or tied first: log variants such as "whats" / "what's" encode the same)
        "found_first": any(
            h.text == rows["question"].iloc[0] and h.distance <= hits[0].distance + 1e-6
            for h in hits
        ),
        "unknown_tokens": out["delta"]["unknown_tokens"],
        "tokens": out["delta"]["tokens"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models-dir", type=Path, default=ROOT / "models")
    parser.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    parser.add_argument("--per-delta", type=int, default=50)
    parser.add_argument("--tombstones", type=int, default=500)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    parser.add_argument("--name", default="freshness", help="Output file names.")
    parser.add_argument(
        "--no-compact", action="store_true", help="Skip compaction (re-encodes every question)."
    )
    args = parser.parse_args()
    settings = load_settings(args.params)
    # As the service runs FAISS: one OpenMP thread per request thread (qpr.serve.openmp);
    # the default pool costs ~15 ms a search on a shared 2-core box.
    faiss.omp_set_num_threads(1)
    for notes in ("qpr.retrieval.loading", "qpr.artifacts"):  # old bundles' notes
        logging.getLogger(notes).setLevel(logging.ERROR)
    marks = (1, 2, 5) if args.quick else (1, 5, 20)
    queries_n = 60 if args.quick else args.queries
    work = Path(tempfile.mkdtemp(prefix="qpr-freshness-"))
    try:
        result = run(args, settings, marks, queries_n, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / f"{args.name}.md").write_text(markdown(result))
    say(f"wrote {args.out / args.name}.json and .md")


def run(args: Any, settings: Any, marks: tuple[int, ...], queries_n: int, work: Path) -> dict:
    models = Path(
        shutil.copytree(args.models_dir, work / "models", ignore=shutil.ignore_patterns("*.pt"))
    )
    shutil.rmtree(models / DELTAS_DIR, ignore_errors=True)
    (models / DELTAS_MANIFEST_FILE).unlink(missing_ok=True)
    fresh = new_question_logs(models, work, args.per_delta * marks[-1], seed=settings.seed)
    main_questions = live_questions(models)["text"].tolist()
    rng = np.random.default_rng(0)
    # Half served questions, half new ones: what users ask right after a refresh.
    queries = (
        rng.choice(main_questions, queries_n // 2).tolist()
        + fresh["question"].sample(queries_n - queries_n // 2, random_state=0).tolist()
    )
    before = Bundle.load(models)
    result: dict[str, Any] = {
        "bundle": args.models_dir.name,
        "questions": before.size,
        "factory": settings.index.factory,
        "per_delta": args.per_delta,
        "load_average_start": os.getloadavg()[0],
        "latency_ms": {"0 deltas": latency(before, queries, args.repeats)},
        "adds": [],
    }
    for number in range(1, marks[-1] + 1):
        rows = fresh.iloc[(number - 1) * args.per_delta : number * args.per_delta]
        step = add_one(models, rows, work / f"new-{number:03d}.jsonl", settings)
        result["adds"].append(step)
        say(f"delta {number}: {step['questions']} questions, {step['end_to_end_s']:.2f} s")
        if number in marks:
            bundle = Bundle.load(models)
            result["latency_ms"][f"{number} deltas"] = latency(bundle, queries, args.repeats)
    served = live_questions(models)["question_id"].to_numpy(np.int64)
    doomed = rng.choice(served, min(args.tombstones, served.size // 4), replace=False)
    delete_questions(models, doomed.tolist())
    bundle = Bundle.load(models)
    result["latency_ms"][f"{marks[-1]} deltas + {doomed.size} tombstones"] = latency(
        bundle, queries, args.repeats
    )
    if args.no_compact:
        return summarised(result)
    config = IndexConfig.from_settings(settings.index)
    started = time.perf_counter()
    compacted = compact(
        models, lambda v: build_index(v, config, seed=settings.seed, log=lambda _: None)
    )
    result["compaction"] = compacted | {"seconds": time.perf_counter() - started}
    result["latency_ms"]["compacted"] = latency(Bundle.load(models), queries, args.repeats)
    return summarised(result)


def summarised(result: dict[str, Any]) -> dict[str, Any]:
    result["load_average_end"] = os.getloadavg()[0]
    adds = result["adds"]
    result["end_to_end_s"] = percentiles([a["end_to_end_s"] for a in adds])
    result["load_s"] = percentiles([a["load_s"] for a in adds])
    result["found_first_share"] = sum(a["found_first"] for a in adds) / len(adds)
    tokens = sum(a["tokens"] for a in adds)
    result["unknown_token_share"] = sum(a["unknown_tokens"] for a in adds) / max(tokens, 1)
    return result


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Fresh questions without retraining",
        "",
        f"Bundle `{result['bundle']}`: {result['questions']:,} questions; compaction builds "
        f"`{result['factory']}` (params.yaml). {result['per_delta']} new questions a delta "
        "(synthetic logs of later days, questions the bundle did not serve).",
        "Generated by `benchmarks/freshness.py`; 2 shared cores, load average "
        f"{result.get('load_average_start', float('nan')):.1f} at the start and "
        f"{result.get('load_average_end', float('nan')):.1f} at the end (other jobs ran: "
        "p99 is noisy, compare the medians and the ranges).",
        "",
        "## End to end: log file → first served answer",
        "",
        "| | p50 s | p99 s |",
        "|---|---:|---:|",
        f"| gate + encode + delta + load + first search | {result['end_to_end_s']['p50']:.2f} | "
        f"{result['end_to_end_s']['p99']:.2f} |",
        f"| of which Bundle.load | {result['load_s']['p50']:.2f} | {result['load_s']['p99']:.2f} |",
        "",
        f"The first new question of each delta came back first in "
        f"{result['found_first_share']:.0%} of the deltas.",
        "",
        "## Search latency, one question (`Bundle.search`, k 10)",
        "",
        "| state | p50 ms | p99 ms | p99 range |",
        "|---|---:|---:|---|",
    ]
    for name, row in result["latency_ms"].items():
        low, high = row["p99_range"]
        lines.append(f"| {name} | {row['p50']:.3f} | {row['p99']:.3f} | {low:.3f}–{high:.3f} |")
    compaction = result.get("compaction")
    if compaction:
        lines += [
            "",
            f"Compaction: {compaction['questions']:,} questions re-encoded and indexed in "
            f"{compaction['seconds']:.1f} s ({compaction['deltas_merged']} deltas, "
            f"{compaction['tombstones_applied']} tombstones).",
        ]
    lines += [
        "",
        f"IDF rule: {result['unknown_token_share']:.1%} of the delta questions' BM25 words "
        "are unknown to the main vocabulary and score nothing until compaction.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
