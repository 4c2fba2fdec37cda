"""The cluster stage against N: in memory (as before) and in shards, on each engine.

    python benchmarks/cluster_scale.py                       # 134k, 1M, 3M, 10M; resumable
    python benchmarks/cluster_scale.py --sizes 1M --modes sharded,ray

For each size, a `qpr.data.scale` corpus (seed 13, as benchmarks/scale.py; made here when
missing) goes through the pipeline's cluster stage (gates, clustering, splits, pairs) in a
child process, one mode at a time:

- memory: the whole logs in pandas (`qpr.data.dataset.build_clusters`), up to `--max-memory`;
- sharded: `qpr.data.sharded` on the local engine (the stage's default);
- ray: the same tasks on a local Ray cluster of 2 CPUs.

Measured: wall time, the phases' times, and the peak RSS of the child's whole process
tree (Ray's workers included), sampled every 0.2 s. Each mode's outputs are reduced to a
digest of their rows: equal digests mean equal questions, clusters and pairs.
Written: docs/results/cluster_scale.{json,md,png} (log-log plot, fitted exponents).
A finished (size, mode) is kept in `<work>/<size>/cluster-<mode>.json` and not run again.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"134k": 134_091, "1M": 1_000_000, "3M": 3_000_000, "10M": 10_000_000}
MODES = ("memory", "sharded", "ray")
FRAMES = ("questions", "clusters", "pairs")
PHASES = ("clean", "merge", "clusters", "write")  # the sharded stage's (qpr.data.sharded)


def log(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def corpus(work: Path, size: str) -> Path:
    from qpr.data.scale import ScaleSpec, write_scale_corpus

    shards = work / size / "shards"
    write_scale_corpus(ScaleSpec(SIZES[size], seed=13), shards, log=log)  # resumes, or no-op
    return shards


def _tree_rss(root: int) -> int:
    """Resident bytes of `root` and every process below it."""
    parent: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            parent[int(entry)] = int(fields[1])
            rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += [p for p, pp in parent.items() if pp == pid]
    return total


def run_child(args: list[str]) -> dict[str, Any]:
    """This file with `args` in a child: its JSON line, wall time, peak tree RSS."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE,
                            text=True, cwd=ROOT)  # fmt: skip
    peak = [0]

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    lines = []
    for line in proc.stdout:  # type: ignore[union-attr]
        print(line, end="", flush=True)
        lines.append(line)
    proc.wait()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{args} failed with status {proc.returncode}")
    result = json.loads([line for line in lines if line.startswith("{")][-1])
    return {**result, "wall_s": time.perf_counter() - started, "peak_rss_gb": peak[0] / 1e9}


def stage(shards: Path, mode: str, out: Path) -> dict[str, Any]:
    """The cluster stage on `shards` (in the child process)."""
    import pandas as pd

    from qpr.config import load_settings, settings_from_dict
    from qpr.pipeline.cluster import run_cluster, write_outputs

    raw = load_settings(ROOT / "params.yaml").model_dump()
    raw["data"].update(source="logs", path=str(shards))
    settings = settings_from_dict(raw)
    shutil.rmtree(out, ignore_errors=True)
    reports = out.with_name(out.name + "-reports")
    started = time.perf_counter()
    if mode == "memory":
        from qpr.data.dataset import build_clusters

        frames, metrics, _ = build_clusters(settings, reports, log)
        write_outputs(frames, out)
        del frames
    else:
        engine = None
        if mode == "ray":
            from flows.engine import mapper

            engine = mapper("ray", num_cpus=2, log=log)
        extra = {"engine": engine} if engine else {}
        metrics = run_cluster(settings, out_dir=out, report_dir=reports, log=log, **extra).metrics
    seconds = time.perf_counter() - started
    rows = {}
    for name in FRAMES:
        frame = pd.read_parquet(out / f"{name}.parquet")
        rows[name] = [len(frame), int(pd.util.hash_pandas_object(frame, index=False).sum())]
        del frame
    shutil.rmtree(out, ignore_errors=True)
    keep = {k: v for k, v in metrics.items() if isinstance(v, int | float)}
    return {"seconds": seconds, "metrics": keep, "rows": rows}


def measure(work: Path, size: str, mode: str) -> dict[str, Any]:
    done = work / size / f"cluster-{mode}.json"
    if done.is_file():
        return json.loads(done.read_text())
    shards = corpus(work, size)
    log(f"{size}: the cluster stage, {mode}")
    result = run_child(["--child", mode, "--shards", str(shards),
                        "--out", str(work / size / f"cluster-out-{mode}")])  # fmt: skip
    result.update(size=size, mode=mode, questions=SIZES[size])
    done.write_text(json.dumps(result, indent=1))
    return result


def fit(points: list[tuple[float, float]]) -> float | None:
    """The exponent k of c·N^k, least squares in log-log."""
    import numpy as np

    if len(points) < 2:
        return None
    x, y = np.log([p[0] for p in points]), np.log([p[1] for p in points])
    return float(np.polyfit(x, y, 1)[0])


def report(out: Path, rows: list[dict[str, Any]], machine: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    exponents = {}
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for mode in MODES:
        mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["questions"])
        if not mine:
            continue
        for ax, key, label in ((axes[0], "wall_s", "seconds"), (axes[1], "peak_rss_gb", "GB")):
            points = [(r["questions"], r[key]) for r in mine]
            k = fit(points)
            exponents[f"{mode} {label}"] = k
            ax.loglog(*zip(*points, strict=True), "o-",
                      label=f"{mode}" + (f" (k {k:.2f})" if k is not None else ""))  # fmt: skip
    for ax, title in ((axes[0], "cluster stage, seconds"), (axes[1], "peak RSS, GB")):
        ax.set_xlabel("questions (N)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "cluster_scale.png", dpi=110)
    plt.close(fig)

    by_size = {}
    for r in rows:
        by_size.setdefault(r["size"], {})[r["mode"]] = r
    measured = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    payload = {"measured": measured, "machine": machine, "rows": rows, "exponents": exponents}
    (out / "cluster_scale.json").write_text(json.dumps(payload, indent=1) + "\n")

    lines = [
        "# The cluster stage against N",
        "",
        f"Measured {measured} by `benchmarks/cluster_scale.py` at {str(machine['git_commit'])[:7]}"
        f" on {machine['cpu_model']}, {machine['cpu_count']} cores, {machine['memory_gib']} GiB.",
        "One run each; the machine was shared with other work at times.",
        "Corpora: `qpr.data.scale` logs (seed 13), one Parquet file a 500,000 questions.",
        "The stage: gates, cleaning, clustering by answer, coherence, splits, pairs.",
        "memory: the logs in pandas, in one process (the stage before sharding).",
        "sharded: `qpr.data.sharded` on the local engine; ray: the same on 2 local Ray CPUs.",
        "Peak RSS: the stage's whole process tree (Ray's workers too), sampled every 0.2 s.",
        "",
        "| N | mode | stage s | clean s | merge s | clusters s | write s | peak RSS GB "
        "| clusters | pairs | same rows as sharded |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for size in sorted(by_size, key=lambda s: SIZES[s]):
        base = by_size[size].get("sharded")
        for mode in MODES:
            r = by_size[size].get(mode)
            if r is None:
                continue
            phases = [
                r["metrics"].get(f"{p}_seconds") for p in ("clean", "merge", "clusters", "write")
            ]
            same = (
                "—"
                if base is None or mode == "sharded"
                else ("yes" if r["rows"] == base["rows"] else "NO")
            )
            lines.append(
                f"| {size} ({r['questions']:,}) | {mode} | {r['wall_s']:.0f} | "
                + " | ".join("" if p is None else f"{p:.0f}" for p in phases)
                + f" | {r['peak_rss_gb']:.2f} | {r['metrics']['clusters_total']:,} | "
                f"{r['rows']['pairs'][0]:,} | {same} |"
            )  # fmt: skip
    lines += ["", "![time and peak RSS against N, log-log](cluster_scale.png)", "",
              "Fitted exponents k of c·N^k:", ""]  # fmt: skip
    lines += [f"- {name}: {k:.2f}" for name, k in exponents.items() if k is not None]
    (out / "cluster_scale.md").write_text("\n".join(lines) + "\n")


def _machine() -> dict[str, Any]:
    import pandas as pd
    import pyarrow
    import ray
    from machine_info import describe

    versions = {"pandas": pd.__version__, "pyarrow": pyarrow.__version__, "ray": ray.__version__}
    return describe(ROOT, versions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/qpr-scale"))
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--max-memory", default="3M", help="largest N run in memory")
    parser.add_argument("--max-ray", default="3M", help="largest N run on Ray")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    parser.add_argument("--child", choices=MODES)
    parser.add_argument("--shards", type=Path)
    args = parser.parse_args()
    if args.child:
        sys.path.insert(0, str(ROOT))
        print(json.dumps(stage(args.shards, args.child, args.out)), flush=True)
        return
    limits = {"memory": SIZES[args.max_memory], "ray": SIZES[args.max_ray]}
    rows = []
    for size in args.sizes.split(","):
        for mode in args.modes.split(","):
            if SIZES[size] <= limits.get(mode, SIZES[size]):
                rows.append(measure(args.work, size, mode))
    for done in sorted(args.work.glob("*/cluster-*.json")):  # sizes measured by earlier runs
        row = json.loads(done.read_text())
        if (row["size"], row["mode"]) not in {(r["size"], r["mode"]) for r in rows}:
            rows.append(row)
    report(args.out, rows, _machine())
    log(f"written {args.out / 'cluster_scale.md'}")


if __name__ == "__main__":
    main()
