"""FAISS in the driver against FAISS as engine tasks, on the local engine and on Ray.

    python benchmarks/sharded_add.py [--vectors 200000] [--shard-rows 50000]

A synthetic set of float32 vectors (128 dims, seed 13, Gaussian), written as .npy shards,
is built three ways in one run, one after the other:

- driver: `qpr.retrieval.dense.build_index_from_shards` (train, then add shard by shard);
- local: `qpr.retrieval.faiss_shards.build_index_on_engine` on the local engine;
- ray: the same on a local Ray cluster of 2 CPUs (`flows.engine`, started here).

Measured: wall seconds of training and adding (the engine's adding includes the driver's
assembly), the 1-minute load average before and after each, and the sha256 of each
`faiss.serialize_index`: equal digests mean identical files. Written:
docs/results/sharded_add.{json,md}.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import faiss
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from machine_info import describe  # noqa: E402

from qpr.retrieval.dense import IndexConfig, VectorShards, build_index_from_shards  # noqa: E402
from qpr.retrieval.faiss_shards import build_index_on_engine  # noqa: E402

FACTORY = "IVF1024,PQ64x4fs,Refine(SQfp16)"
DIM = 128


def log(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def write_shards(folder: Path, n: int, shard_rows: int) -> VectorShards:
    rng = np.random.default_rng(13)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for number, start in enumerate(range(0, n, shard_rows)):
        paths.append(folder / f"vectors-{number:03d}.npy")
        rows = min(shard_rows, n - start)
        np.save(paths[-1], rng.standard_normal((rows, DIM)).astype(np.float32))
    return VectorShards(paths)


def measure(name: str, build: Callable[[Callable[[str], None]], faiss.Index]) -> dict[str, Any]:
    lines: list[str] = []

    def keep(line: str) -> None:
        lines.append(line)
        log(f"{name}: {line}")

    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    index = build(keep)
    seconds = time.perf_counter() - started
    load_after = os.getloadavg()[0]
    built = next(line for line in lines if line.startswith("built "))
    phases = dict(re.findall(r"(train|add|assembly) ([0-9.]+) s", built))
    return {
        "mode": name,
        "seconds": seconds,
        "train_seconds": float(phases["train"]),
        "add_seconds": float(phases["add"]),
        "assembly_seconds": float(phases["assembly"]) if "assembly" in phases else None,
        "load_before": load_before,
        "load_after": load_after,
        "sha256": hashlib.sha256(faiss.serialize_index(index).tobytes()).hexdigest(),
        "built": built,
    }


def run(n: int, shard_rows: int, work: Path) -> list[dict[str, Any]]:
    from flows.engine import ensure_ray, ray_map

    shards = write_shards(work / "vectors", n, shard_rows)
    config = IndexConfig(FACTORY, nprobe=64, use_gpu=False)
    warm = VectorShards(shards.paths[:1])  # FAISS's threads and the page cache, off the clock
    build_index_from_shards(warm, IndexConfig("IVF64,Flat", nprobe=1), seed=1, log=lambda _: None)
    rows = [
        measure("driver", lambda out: build_index_from_shards(shards, config, seed=13, log=out)),
        measure(
            "local",
            lambda out: build_index_on_engine(
                shards, config, seed=13, work_dir=work / "local", log=out
            ),
        ),
    ]
    ensure_ray(num_cpus=2)  # started before the clock: the cluster is not the build
    rows.append(
        measure(
            "ray",
            lambda out: build_index_on_engine(
                shards,
                config,
                seed=13,
                work_dir=work / "ray",
                engine=lambda fn, items: ray_map(fn, items, num_cpus=2, log=out),
                log=out,
            ),
        )
    )
    return rows


def markdown(result: dict[str, Any]) -> str:
    machine, rows = result["machine"], result["rows"]
    same = len({r["sha256"] for r in rows}) == 1
    lines = [
        "# FAISS in the driver against FAISS as engine tasks",
        "",
        f"Measured {result['when']} by `benchmarks/sharded_add.py`: {result['vectors']:,} "
        f"Gaussian float32 vectors of {DIM} dims in shards of {result['shard_rows']:,},",
        f"`{FACTORY}`, seed 13. Machine: {machine['cpu_model']}, {machine['cpus_usable']} "
        f"cores, {machine['memory_gib']} GiB, shared with another benchmark.",
        f"FAISS threads: {result['faiss_threads']} in the driver and in every task.",
        "",
        "| build | train s | add s | of which assembly s | total s | load before | load after |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        assembly = "" if r["assembly_seconds"] is None else f"{r['assembly_seconds']:.2f}"
        lines.append(
            f"| {r['mode']} | {r['train_seconds']:.1f} | {r['add_seconds']:.1f} | {assembly} | "
            f"{r['seconds']:.1f} | {r['load_before']:.2f} | {r['load_after']:.2f} |"
        )
    lines += [
        "",
        f"Index files: {'identical' if same else 'DIFFERENT'} on every build "
        f"(sha256 `{rows[0]['sha256'][:16]}…`).",
        "",
        f"`uptime` before: `{result['uptime_before']}`",
        f"`uptime` after: `{result['uptime_after']}`",
        "",
        "- driver: `build_index_from_shards`, FAISS in this process.",
        "- local: `build_index_on_engine` on the local engine. Its add includes writing each",
        "  shard's codes and reading them back into the driver.",
        "- ray: the same tasks on a local Ray cluster of 2 CPUs, started before the clock.",
        "  Two add tasks run at once, each on the driver's FAISS threads.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vectors", type=int, default=200_000)
    parser.add_argument("--shard-rows", type=int, default=50_000)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    args = parser.parse_args()
    before = uptime()
    log(before)
    with tempfile.TemporaryDirectory(prefix="qpr-sharded-add-") as work:
        rows = run(args.vectors, args.shard_rows, Path(work))
    after = uptime()
    log(after)
    result = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "vectors": args.vectors,
        "shard_rows": args.shard_rows,
        "factory": FACTORY,
        "faiss_threads": faiss.omp_get_max_threads(),
        "uptime_before": before,
        "uptime_after": after,
        "rows": rows,
        "machine": describe(
            ROOT, {"faiss": faiss.__version__, "numpy": np.__version__, "ray": version("ray")}
        ),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sharded_add.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "sharded_add.md").write_text(markdown(result))
    log(f"wrote {args.out / 'sharded_add.md'}")


if __name__ == "__main__":
    main()
