"""The Quora pipeline with its index stage on each engine: the same files, the same P@1.

    python benchmarks/engine_parity.py [--work DIR] [--epochs 2]

Cluster, train (params.yaml's settings, `--epochs` epochs) and export run once; then the
index stage runs on the local engine and on Ray (a local Ray cluster, or RAY_ADDRESS),
each from nothing (no cached vectors), each followed by the evaluate stage. Written:
docs/results/engine_parity.{json,md}: the index files' digests, the test measures and the
index stage's time on each engine. Resumable: a finished step is not run again.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
QUORA = ROOT.parent / "shared" / "data" / "quora" / "quora_duplicate_questions.tsv"
MEASURES = ("success_1", "success_10", "recip_rank", "recall_20")


def log(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def settings_for(epochs: int, engine: str) -> Any:
    from qpr.config import load_settings, settings_from_dict

    raw = load_settings(ROOT / "params.yaml").model_dump()
    raw["data"].update(source="quora", path=str(QUORA))
    raw["train"].update(max_epochs=epochs)
    raw["engine"] = engine
    return settings_from_dict(raw)


def trained(work: Path, epochs: int) -> None:
    from qpr.paths import ProjectPaths
    from qpr.pipeline.cluster import run_cluster
    from qpr.pipeline.export import run_export
    from qpr.pipeline.train import run_train

    paths = ProjectPaths(work)
    if paths.encoder_onnx.is_file():
        return
    settings = settings_for(epochs, "local")
    run_cluster(settings, out_dir=paths.cluster_dir, report_dir=work / "reports", log=log)
    run_train(settings, paths, progress=False, log=log)
    run_export(settings, paths, log=log)


def on_engine(work: Path, epochs: int, engine: str) -> dict[str, Any]:
    from flows.engine import mapper
    from qpr.io import file_sha256
    from qpr.paths import ProjectPaths
    from qpr.pipeline.evaluate import run_evaluate
    from qpr.pipeline.index import run_index

    done = work / f"{engine}.json"
    if done.is_file():
        return json.loads(done.read_text())
    paths = ProjectPaths(work)
    settings = settings_for(epochs, engine)
    shutil.rmtree(paths.index_cache_dir, ignore_errors=True)  # every question encoded again
    started = time.perf_counter()
    index = run_index(settings, paths, engine=mapper(engine, log=log), log=log)
    seconds = time.perf_counter() - started
    evaluated = run_evaluate(settings, paths, log=log)
    result = {
        "engine": engine,
        "index_seconds": seconds,
        "encode_seconds": index["encode_seconds"],
        "digests": {p.name: file_sha256(p) for p in sorted(paths.index_dir.iterdir())},
        "test": {m: evaluated.get(m) for m in MEASURES},
    }
    done.write_text(json.dumps(result, indent=1))
    return result


def markdown(rows: list[dict[str, Any]], epochs: int) -> str:
    local, ray = rows
    same = {name: local["digests"][name] == ray["digests"].get(name) for name in local["digests"]}
    lines = [
        "# The index stage on both engines",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by "
        f"`benchmarks/engine_parity.py` on Quora ({epochs} epochs of the default CNN), 2 cores.",
        "The index stage ran from nothing on each engine, then the evaluate stage.",
        "",
        "| engine | index stage s | encode s | " + " | ".join(f"test {m}" for m in MEASURES) + " |",
        "|---|---:|---:|" + "---:|" * len(MEASURES),
    ]
    for r in rows:
        cells = " | ".join(f"{r['test'][m]:.4f}" for m in MEASURES)
        lines.append(
            f"| {r['engine']} | {r['index_seconds']:.1f} | {r['encode_seconds']:.1f} | {cells} |"
        )
    lines += ["", "Index files byte for byte:", ""]
    lines += [f"- `{name}`: {'identical' if ok else 'DIFFERENT'}" for name, ok in same.items()]
    lines += [
        "",
        "Ray's time includes starting a local cluster and its workers (one a core).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/qpr-engine-parity"))
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    args = parser.parse_args()
    if not QUORA.is_file():
        sys.exit(f"Quora data not found at {QUORA}")
    args.work.mkdir(parents=True, exist_ok=True)
    trained(args.work, args.epochs)
    rows = [on_engine(args.work, args.epochs, engine) for engine in ("local", "ray")]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "engine_parity.json").write_text(json.dumps(rows, indent=1))
    (args.out / "engine_parity.md").write_text(markdown(rows, args.epochs))
    log(f"wrote {args.out / 'engine_parity.md'}")


if __name__ == "__main__":
    main()
