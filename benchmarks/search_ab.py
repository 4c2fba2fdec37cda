"""Bundle.search side by side: two checkouts (or two bundles) timed alternately in one run.

Why: a refactoring must not slow the query path, and this machine is shared and noisy, so
two figures are only comparable when taken in the same run, interleaved. Each "side" is a
Python interpreter (a checkout's .venv/bin/python, which imports that checkout's qpr) and
a bundle directory. Every round runs each side once, in turn, as a fresh process: load the
bundle, warm up on 50 questions, then time `Bundle.search(question, k=10)` one question at
a time, FAISS on one OpenMP thread as the service runs it (--faiss-threads 0: the process
default, as a Python caller has it). The result names each side's p50 and p99 per round,
their medians over the rounds, the ratio of medians, and whether every side returned the
same top 10 for every question.

    .venv/bin/python benchmarks/search_ab.py \\
        --side old=/tmp/old/.venv/bin/python:/tmp/old/models \\
        --side new=.venv/bin/python:/tmp/old/models \\
        --questions questions.txt --rounds 5

Writes docs/results/search_ab.{json,md} (or --out DIR).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_info import describe

from qpr.io import write_text_atomic

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"

# Runs inside each side's interpreter, so it must work with any checkout's qpr: the bundle
# module moved from qpr.serve.bundle to qpr.retrieval.bundle.
PROBE = r"""
import hashlib, json, sys, time
import numpy as np
try:
    from qpr.retrieval.bundle import Bundle
except ImportError:
    from qpr.serve.bundle import Bundle
models, questions_file, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
fold, faiss_threads = sys.argv[4] == "fold", int(sys.argv[5])
if faiss_threads:
    import faiss
    faiss.omp_set_num_threads(faiss_threads)
questions = [line.strip() for line in open(questions_file, encoding="utf-8") if line.strip()][:n]
bundle = Bundle.load(models, threads=1, fold_encoder=True) if fold else Bundle.load(models)
for q in questions[:50]:
    bundle.search(q, k=10)
times, tops = [], []
for q in questions:
    start = time.perf_counter()
    result = bundle.search(q, k=10)
    times.append(time.perf_counter() - start)
    tops.append([hit.question_id for hit in result.hits])
print(json.dumps({
    "p50_ms": float(np.median(times) * 1e3),
    "p99_ms": float(np.percentile(times, 99) * 1e3),
    "questions": len(questions),
    "top10_sha256": hashlib.sha256(json.dumps(tops).encode()).hexdigest(),
}))
"""


def run_side(
    python: str, models: str, questions: Path, n: int, fold: bool = False, faiss_threads: int = 1
) -> dict:
    fold_arg = "fold" if fold else "onnx"
    done = subprocess.run(
        [python, "-c", PROBE, models, str(questions), str(n), fold_arg, str(faiss_threads)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{python} on {models} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def parse_side(text: str) -> tuple[str, str, str]:
    name, _, rest = text.partition("=")
    python, _, models = rest.partition(":")
    if not (name and python and models):
        raise argparse.ArgumentTypeError(f"--side NAME=PYTHON:MODELS, got {text!r}")
    return name, python, models


def _per_round(name: str, side: dict) -> str:
    return name + " " + ", ".join(f"{r['p50_ms']:.3f}" for r in side["rounds"])


def markdown(report: dict) -> str:
    sides = report["sides"]
    first = next(iter(sides))
    lines = [
        "# Bundle.search side by side",
        "",
        *([report["about"], ""] if report.get("about") else []),
        f"Machine: {report['machine']['cpu_model']}, {report['machine']['cpus_usable']} cores. "
        f"{report['rounds']} rounds; each round runs every side "
        f"once, in turn, as a fresh process: {report['questions']} questions, one at a time, "
        "k 10, after 50 warm-up searches"
        + (
            ", loaded as the service loads (encoder folded, one thread)."
            if report.get("fold_encoder")
            else "."
        )
        + (
            f" FAISS on {report['faiss_threads']} OpenMP thread(s), set before loading"
            + (" (the service's setting)." if report["faiss_threads"] == 1 else ".")
            if report.get("faiss_threads")
            else " FAISS's OpenMP threads left at the process default (a Python caller's)."
        ),
        "",
        f"| side | interpreter | bundle | p50 ms (median of rounds) | p99 ms | p50 / {first} |",
        "|---|---|---|---:|---:|---:|",
    ]
    for name, side in sides.items():
        lines.append(
            f"| {name} | `{side['python']}` | `{side['models']}` | {side['p50_ms']:.3f} | "
            f"{side['p99_ms']:.3f} | {side['p50_ms'] / sides[first]['p50_ms']:.3f} |"
        )
    if report.get("load_avg"):
        before, after = report["load_avg"]
        lines += ["", f"Load average (1, 5, 15 min): {before} before, {after} after."]
    same = (
        "Every side returned the same top 10 for every question."
        if report["same_top10"]
        else "The sides returned different top 10s for some questions: expected only when "
        "their bundles differ."
    )
    lines += ["", same, ""]
    lines += [
        "Per round p50 ms: "
        + "; ".join(_per_round(name, side) for name, side in sides.items())
        + ".",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", action="append", type=parse_side, required=True)
    parser.add_argument("--questions", type=Path, required=True, help="one question a line")
    parser.add_argument("--n", type=int, default=2000, help="questions timed per run")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--fold-encoder",
        action="store_true",
        help="load as the service does: one ONNX thread, a CNN or static student folded",
    )
    parser.add_argument(
        "--faiss-threads",
        type=int,
        default=1,
        help="FAISS OpenMP threads in the searching thread: 1 as the service sets it; "
        "0 leaves the process default, as a Python caller has it",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--about", default="", help="what the sides and bundles are, in words")
    args = parser.parse_args(argv)
    sides = {name: {"python": py, "models": models, "rounds": []} for name, py, models in args.side}
    load_before = [round(v, 2) for v in os.getloadavg()]
    for round_ in range(1, args.rounds + 1):
        for name, side in sides.items():
            result = run_side(
                side["python"],
                side["models"],
                args.questions,
                args.n,
                args.fold_encoder,
                args.faiss_threads,
            )
            side["rounds"].append(result)
            print(f"round {round_}/{args.rounds} {name}: p50 {result['p50_ms']:.3f} ms", flush=True)
    for side in sides.values():
        side["p50_ms"] = statistics.median(r["p50_ms"] for r in side["rounds"])
        side["p99_ms"] = statistics.median(r["p99_ms"] for r in side["rounds"])
    digests = {r["top10_sha256"] for side in sides.values() for r in side["rounds"]}
    machine = describe(Path(__file__).resolve().parents[1], {})
    report = {
        "machine": machine,
        "rounds": args.rounds,
        "questions": args.n,
        "fold_encoder": args.fold_encoder,
        "faiss_threads": args.faiss_threads,
        "load_avg": [load_before, [round(v, 2) for v in os.getloadavg()]],
        "same_top10": len(digests) == 1,
        "about": args.about,
        "sides": sides,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out / "search_ab.json", json.dumps(report, indent=2) + "\n")
    write_text_atomic(args.out / "search_ab.md", markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
