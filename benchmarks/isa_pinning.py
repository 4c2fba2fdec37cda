#!/usr/bin/env python
"""What pinning the math (qpr.environment.pin_math) costs in training time, side by side.

    python benchmarks/isa_pinning.py                  # tiny CNN and tiny student, 3 repeats
    python benchmarks/isa_pinning.py --repeats 5 --only cnn
    python benchmarks/isa_pinning.py --only embedded --repeats 2 --keep   # minutes a run
    python benchmarks/isa_pinning.py --only cnn-embedded --repeats 2 --keep

Two tiny projects of the tests' configuration (tests.conftest.tiny_overrides) are made
once in this process: the paper's CNN, clustered; the product default (packaged MiniLM,
static query student), clustered, indexed and ready for its student stage; with
`--only embedded`, the product default on the embedded data of params.yaml, and with
`--only cnn-embedded` one epoch of the paper's CNN on them. Then each
stage runs in a fresh process per repeat, pinned and native (QPR_NATIVE_MATH=1) in
alternating order, so that load on a shared machine falls on both. Pinned runs rotate
through the instruction-set settings of tests/test_environment_math.py: their files must
be byte-identical. A stage's time is its stage function's wall clock in that process;
`uptime`'s load average is recorded beside each run. `--keep` keeps the other stages'
figures already in the results file.

Writes docs/results/isa_pinning.{json,md}.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT)]

from machine_info import describe  # noqa: E402

from qpr import environment  # noqa: E402
from tests.conftest import tiny_overrides  # noqa: E402
from tests.test_environment_math import OTHER_CPUS  # noqa: E402

RESULTS = ROOT / "docs" / "results"
# One stage in a fresh process, its math pinned first as flows/__init__.py does.
DRIVER = """
import json, sys, time
from pathlib import Path
from qpr import environment
environment.pin_math()
from qpr.config import load_settings
from qpr.paths import ProjectPaths
root, stage = Path(sys.argv[1]), sys.argv[2]
settings, paths = load_settings(root / "params.yaml"), ProjectPaths(root)
quiet = lambda _: None
started = time.perf_counter()
if stage == "train":
    from qpr.pipeline.train import run_train
    run_train(settings, paths, progress=False, log=quiet)
else:
    from qpr.pipeline.student import run_student
    run_student(settings, paths, log=quiet)
print(json.dumps({"seconds": time.perf_counter() - started}))
"""
STUDENT = {"enabled": "auto", "max_epochs": 3, "batch_size": 64, "val_queries": 200, "probe": 16}
# stage: (what the project needs first, the file the stage writes, what to clear per run)
STAGES = {
    "cnn": ("train", "models/encoder.pt", ("models", "artifacts/train")),
    "student": ("student", "models/student/query_encoder.onnx", ("models/student",)),
    "embedded": ("student", "models/student/query_encoder.onnx", ("models/student",)),
    "cnn-embedded": ("train", "models/encoder.pt", ("models", "artifacts/train")),
}


DATA = {
    "cnn": "tiny, the paper's CNN",
    "student": "tiny",
    "embedded": "embedded logs",
    "cnn-embedded": "embedded logs, the paper's CNN, one epoch",
}


def _tree(root: Path, kind: str) -> dict:
    if kind.endswith("embedded"):  # the project's own params: the embedded logs
        tree = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
        tree["data"]["path"] = str(root / "data" / "logs")
        if kind == "cnn-embedded":  # the paper's CNN (its family's defaults), one epoch
            tree["model"]["encoder"] = "cnn"
            tree["train"]["max_epochs"] = 1
        return tree
    if kind == "cnn":
        return tiny_overrides(root, model={"encoder": "cnn"}, train={"threads": 2})
    return tiny_overrides(
        root,
        model={"encoder": "transformer", "normalize": "auto", "transformer": {"max_len": 32}},
        train={"max_epochs": "auto", "threads": 2},
        export={"sample": 48},
        index={"factory": "Flat", "threads": 2},
        student={**STUDENT, "threads": 2},
    )


def prepare(work: Path, kind: str) -> Path:
    """A tiny project ready for the measured stage (its earlier stages run here)."""
    from qpr.config import load_settings
    from qpr.data.synth import SynthSpec, write_logs
    from qpr.paths import ProjectPaths
    from qpr.pipeline.cluster import run_cluster

    root = work / f"base-{kind}"
    root.mkdir(parents=True)
    (root / "params.yaml").write_text(yaml.safe_dump(_tree(root, kind)), encoding="utf-8")
    settings, paths = load_settings(root / "params.yaml"), ProjectPaths(root)
    write_logs(Path(settings.data.path), SynthSpec.from_settings(settings.data.synth))
    quiet = lambda _: None  # noqa: E731
    run_cluster(
        settings, out_dir=paths.cluster_dir, report_dir=paths.gate_reports("cluster"), log=quiet
    )
    if kind in ("student", "embedded"):
        from qpr.pipeline.export import run_export
        from qpr.pipeline.index import run_index
        from qpr.pipeline.train import run_train

        run_train(settings, paths, progress=False, log=quiet)
        run_export(settings, paths, log=quiet)
        run_index(settings, paths, log=quiet)
    return root


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def run_once(base: Path, kind: str, target: Path, outer: dict[str, str]) -> dict[str, Any]:
    """The stage in a fresh process on a copy of `base` under the environment `outer`."""
    stage, output, cleared = STAGES[kind]
    shutil.copytree(base, target)
    params = target / "params.yaml"
    params.write_text(params.read_text().replace(str(base), str(target)), encoding="utf-8")
    for name in cleared:
        shutil.rmtree(target / name, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if k not in environment.PINNED_MATH}
    env.pop(environment.NATIVE_MATH_VARIABLE, None)
    env.update({**outer, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"})
    load = load_average()
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(target), stage],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    seconds = json.loads(done.stdout.splitlines()[-1])["seconds"]
    digest = hashlib.sha256((target / output).read_bytes()).hexdigest()
    shutil.rmtree(target)
    return {"seconds": round(seconds, 2), "load_before": load, "sha256": digest}


def measure(base: Path, kind: str, repeats: int, work: Path) -> dict[str, Any]:
    settings = list(OTHER_CPUS.items())
    runs: dict[str, list[dict]] = {"pinned": [], "native": []}
    for repeat in range(repeats):
        name, outer = settings[repeat % len(settings)]
        order = ("pinned", "native") if repeat % 2 == 0 else ("native", "pinned")
        for mode in order:
            env = outer if mode == "pinned" else {environment.NATIVE_MATH_VARIABLE: "1"}
            run = run_once(base, kind, work / f"{kind}-{mode}-{repeat}", env)
            run["outer"] = name if mode == "pinned" else "none"
            runs[mode].append(run)
            print(f"{kind} {mode} #{repeat}: {run}", flush=True)
    median = {mode: statistics.median(r["seconds"] for r in rs) for mode, rs in runs.items()}
    return {
        "stage": STAGES[kind][0],
        "runs": runs,
        "median_seconds": median,
        "ratio": round(median["pinned"] / median["native"], 2),
        "pinned_distinct_outputs": len({r["sha256"] for r in runs["pinned"]}),
        "native_distinct_outputs": len({r["sha256"] for r in runs["native"]}),
    }


def markdown(result: dict[str, Any]) -> str:
    machine = result["machine"]
    lines = [
        "# Pinned math: the cost in training time",
        "",
        "Written by `benchmarks/isa_pinning.py`. Each stage ran in a fresh process, pinned "
        "and native (`QPR_NATIVE_MATH=1`) in alternating order; pinned runs under each "
        "instruction-set setting of `tests/test_environment_math.py` in turn.",
        "",
        f"Machine: {machine['cpu_model']}, {machine['cpus_usable']} usable cores, shared; "
        f"load average {result['load_min']}–{result['load_max']} during the runs "
        f"(`uptime`, 1 min).",
        "",
        "| stage (data) | runs each | native median s | pinned median s | pinned / "
        "native | distinct outputs pinned | distinct outputs native |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for kind, r in result["stages"].items():
        lines.append(
            f"| {r['stage']} ({DATA[kind]}) | {len(r['runs']['pinned'])} | "
            f"{r['median_seconds']['native']:.1f} | {r['median_seconds']['pinned']:.1f} | "
            f"{r['ratio']:.2f} | {r['pinned_distinct_outputs']} | "
            f"{r['native_distinct_outputs']} |"
        )
    lines += [
        "",
        "Distinct outputs 1: every run wrote the same bytes. Native runs all took this CPU's "
        "own code paths; the pinned ones took the pinned path under every setting, which is "
        "what another CPU would change.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=sorted(STAGES), default=None)
    parser.add_argument("--keep", action="store_true", help="keep the other stages' figures")
    args = parser.parse_args()
    kinds = [args.only] if args.only else ["cnn", "student"]
    with tempfile.TemporaryDirectory(prefix="isa-pinning-") as tmp:
        work = Path(tmp)
        os.environ.setdefault("QPR_CACHE_DIR", str(work / "cache"))
        stages = {kind: measure(prepare(work, kind), kind, args.repeats, work) for kind in kinds}
    saved = RESULTS / "isa_pinning.json"
    if args.keep and saved.is_file():
        stages = {**json.loads(saved.read_text())["stages"], **stages}
    loads = [r["load_before"] for s in stages.values() for rs in s["runs"].values() for r in rs]
    import torch

    result = {
        "machine": describe(ROOT, {"torch": torch.__version__}),
        "pinned": environment.pinned_math(),
        "load_min": min(loads),
        "load_max": max(loads),
        "stages": stages,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "isa_pinning.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "isa_pinning.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
