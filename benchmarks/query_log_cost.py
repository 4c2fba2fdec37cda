"""What the query log costs a search: /search p50 with the log on against off, side by side.

Two apps over the same bundle run in this process, one with ``QPR_SERVE_QUERY_LOG`` set
(every request logged: sample 1.0) and one without. Each question goes to both, one at a
time, through the ASGI app (Starlette's TestClient: parse, search, JSON, the middlewares),
in alternating order (on first, then off first), so drift and load hit both alike. The
log's writer thread runs during the measurement, as it does in the service. Also measured:
the request path's own share, `QueryLog.queries` alone (the sample check and one queue
put), and that every logged request was written, none dropped.

    python benchmarks/query_log_cost.py --models models --queries 2000

Questions: indexed questions of the bundle, a seeded sample. Without ``--models`` (or when
it does not exist) the tests' tiny bundle is built in a temporary folder (needs torch).
Target (issue 42): the log on costs at most 5 % of search p50.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

# Run as scripts (python benchmarks/x.py): their own folder is on sys.path.
from machine_info import describe

REPO = Path(__file__).resolve().parents[1]
NAME = "query_log_cost"
TARGET_SHARE = 0.05
K = 10


def questions_of(models: Path, count: int, seed: int) -> tuple[list[str], int]:
    """A seeded sample of the bundle's indexed questions, and how many it has."""
    import pyarrow.parquet as pq

    from qpr.artifacts import QUESTIONS_FILE

    texts = pq.read_table(models / QUESTIONS_FILE, columns=["text"])["text"].to_pylist()
    picked = np.random.default_rng(seed).choice(len(texts), min(count, len(texts)), replace=False)
    return [texts[i] for i in picked], len(texts)


def tiny_bundle(work: Path) -> Path:
    """The tests' bundle (tests/serve/test_app.py), when no built one is given."""
    import sys

    sys.path.insert(0, str(REPO))
    from tests.serve.test_app import QIDS, QUESTIONS, build_bundle

    return build_bundle(work / "models", QUESTIONS, QIDS)


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def measure(models: Path, questions: list[str], work: Path, rounds: int) -> dict[str, Any]:
    from fastapi.testclient import TestClient

    from qpr.serve.app import create_app
    from qpr.serve.settings import ServeSettings
    from qpr.serve.sources import LocalSource

    base = ServeSettings(poll_seconds=0, startup_wait=120, max_question_chars=10_000)
    log_dir = work / "log"
    apps = {
        "off": create_app(LocalSource(models), base),
        "on": create_app(LocalSource(models), base.replace(query_log=str(log_dir))),
    }
    times: dict[str, list[float]] = {"on": [], "off": []}
    with TestClient(apps["off"]) as off, TestClient(apps["on"]) as on:
        clients = {"on": on, "off": off}
        for question in questions[:50]:  # warm-up: both apps, every code path
            for client in clients.values():
                assert client.post("/search", json={"question": question, "k": K}).is_success
        sent = 0
        for _ in range(rounds):
            for i, question in enumerate(questions):
                order = ("on", "off") if (i + sent) % 2 == 0 else ("off", "on")
                for name in order:
                    started = time.perf_counter()
                    response = clients[name].post("/search", json={"question": question, "k": K})
                    times[name].append((time.perf_counter() - started) * 1000)
                    assert response.status_code == 200, response.text
            sent += len(questions)
        query_log = apps["on"].state.service.query_log
        deadline = time.monotonic() + 60
        while query_log.counts().get(("queries", "written"), 0) < sent + 50:
            assert time.monotonic() < deadline, query_log.counts()
            time.sleep(0.05)
        counts = {"/".join(key): value for key, value in query_log.counts().items()}
        served = apps["on"].state.service.holder.current
        enqueue = enqueue_cost(served.bundle, questions, work)
    log_bytes = sum(p.stat().st_size for p in log_dir.rglob("*") if p.is_file())
    return {
        "requests_each": len(times["on"]),
        "k": K,
        "sides": {
            name: {
                "p50_ms": statistics.median(values),
                "p99_ms": percentile(values, 99),
                "mean_ms": statistics.fmean(values),
            }
            for name, values in times.items()
        },
        "enqueue": enqueue,
        "log_counts": counts,
        "log_bytes": log_bytes,
        "bytes_per_line": log_bytes / max(1, counts.get("queries/written", 1)),
    }


def enqueue_cost(bundle: Any, questions: list[str], work: Path) -> dict[str, float]:
    """`QueryLog.queries` alone, on real search results: the request path's share."""
    from qpr.querylog.log_writer import LogLimits, QueryLog

    results = [bundle.search(q, K) for q in questions[:200]]
    model = {"name": "local", "version": None, "fingerprint": "0" * 64}
    per_call = []
    with QueryLog(work / "enqueue", LogLimits(queue_events=100_000)) as log:
        for repeat in range(5):
            started = time.perf_counter()
            for i, result in enumerate(results):
                log.queries(
                    f"r{repeat}-{i}",
                    [result],
                    endpoint="/search",
                    model=model,
                    k=K,
                    threshold=0.5,
                    latency_ms=1.0,
                )
            per_call.append((time.perf_counter() - started) / len(results) * 1e6)
    return {"median_us": statistics.median(per_call), "max_us": max(per_call)}


def report(result: dict[str, Any]) -> str:
    on, off = result["sides"]["on"], result["sides"]["off"]
    share = on["p50_ms"] / off["p50_ms"] - 1
    load = result["machine"]["load_average"]
    counts = result["log_counts"]
    dropped = sum(v for k, v in counts.items() if not k.endswith("/written"))
    lines = [
        "# What the query log costs a search",
        "",
        f"`benchmarks/query_log_cost.py`: POST /search through the ASGI app (TestClient), one "
        f"question at a time, k {result['k']}, {result['requests_each']:,} requests to each "
        f"app, alternating which goes first. Bundle `{result['source_bundle']}` "
        f"({result['bundle_questions']:,} questions). "
        f"Machine: {result['machine']['cpu_model']}, {result['machine']['cpus_usable']} cores; "
        f"{result['date']}. Load average before {load['before']}, after {load['after']}.",
        "",
        "| query log | p50 ms | p99 ms | mean ms |",
        "|---|---:|---:|---:|",
        f"| off | {off['p50_ms']:.3f} | {off['p99_ms']:.3f} | {off['mean_ms']:.3f} |",
        f"| on (every request) | {on['p50_ms']:.3f} | {on['p99_ms']:.3f} | {on['mean_ms']:.3f} |",
        "",
        f"p50 on / off: {1 + share:.3f} ({share:+.1%}; target at most "
        f"{TARGET_SHARE:+.0%}: {'met' if share <= TARGET_SHARE else 'NOT met'}).",
        f"The request path's share, `QueryLog.queries` alone: "
        f"{result['enqueue']['median_us']:.1f} µs a call (median of 5 × 200).",
        f"Lines written {counts.get('queries/written', 0):,}, lost {dropped:,}; "
        f"{result['bytes_per_line']:.0f} bytes a line.",
        "",
        "The writer thread formats, redacts and writes off the request path; what a request "
        "pays is one sample check and one put into a bounded queue. The rest of the "
        "difference is the writer thread taking the GIL from time to time.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, default=REPO / "models")
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "results" / NAME)
    args = parser.parse_args()
    import faiss
    import onnxruntime

    load_before = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="qpr-query-log-") as tmp:
        work = Path(tmp)
        models = args.models if (args.models / "search.json").is_file() else tiny_bundle(work)
        questions, result_size = questions_of(models, args.queries, args.seed)
        result = measure(models, questions, work, args.rounds)
        result["bundle_questions"] = result_size
    result["source_bundle"] = str(args.models) if models == args.models else "the tests' tiny one"
    result["date"] = datetime.now(UTC).strftime("%Y-%m-%d")
    versions = {"faiss": faiss.__version__, "onnxruntime": onnxruntime.__version__}
    load = {"before": load_before, "after": [round(x, 2) for x in os.getloadavg()]}
    result["machine"] = describe(REPO, versions, load_average=load)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(report(result))
    print(report(result))


if __name__ == "__main__":
    main()
