#!/usr/bin/env python
"""What a registry version stores, before and after versions referenced each other.

    python benchmarks/registry_storage.py --models-dir /tmp/qprod/models --label "Quora ..."

On copies of the bundle, into a scratch MLflow registry (sqlite + a file artifact store
under --work, default /tmp/regbench), with the real registry functions:

(a) a published delta: the bundle registered and promoted (the base), --per-delta new
    questions added (`qpr.deltas.add.add_questions`) and published
    (`qpr.deltas.publish.register_deltas`);
(b) a `dvc exp run` that changes only a search knob: the base registered, then
    search.json as the evaluate stage writes it for another ``evaluate.target_precision``
    (the threshold scaled, not re-chosen) and its metrics, registered as the register
    stage does (`registry.register_bundle`).

"Before": the same state registered into a registered model with no earlier version, so
it references nothing and stores every file, as every version did before. "After": the
version registered on top of the base. Stored bytes are the files under the version's
model folder and its run's artifact folder in the store. Each version is then downloaded
(`registry.download_bundle`, base + delta put together and checked) and searched.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from machine_info import describe  # noqa: E402


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _local(uri: str) -> Path:
    return Path(unquote(urlparse(uri).path))


def stored(name: str, version: int) -> dict[str, int]:
    """{folder: bytes} of what the store holds for the version: its model folder (split
    into the bundle, the qpr package and the rest) and its run's artifacts."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    mv = client.get_model_version(name, str(version))
    out: dict[str, Any] = {"bundle": 0, "code": 0, "metadata": 0, "run": 0}
    model_root = _local(client.get_model_version_download_uri(name, str(version)))
    files = {}
    for path in (p for p in model_root.rglob("*") if p.is_file()):
        parts = path.relative_to(model_root).parts
        kind = parts[1] if parts[0] == "artifacts" and parts[1] in ("bundle", "code") else None
        out[kind or "metadata"] += path.stat().st_size
        if kind == "bundle":
            files["/".join(parts[2:])] = path.stat().st_size
    if mv.run_id:
        run_root = _local(client.get_run(mv.run_id).info.artifact_uri)
        out["run"] = sum(p.stat().st_size for p in run_root.rglob("*") if p.is_file())
    out["total"] = sum(out.values())
    return {**out, "bundle_files": dict(sorted(files.items())) if len(files) < 20 else len(files)}


def timed(step: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    result = step()
    return result, time.perf_counter() - started


def register(models: Path, metrics: dict[str, Any], name: str) -> tuple[Any, float]:
    from qpr.ops import registry

    info, seconds = timed(lambda: registry.register_bundle(models, metrics, name=name))
    registry.mark_committed(name, info.version, by="benchmark")
    return info, seconds


def searched(name: str, work: Path, question: str, qid: int | None) -> dict[str, Any]:
    """Download the champion (base + delta put together, checked), search `question`."""
    from qpr.ops import registry
    from qpr.retrieval.bundle import Bundle

    target = work / f"download-{name}"
    shutil.rmtree(target, ignore_errors=True)
    folder, seconds = timed(lambda: registry.download_bundle(name, registry.CHAMPION, target))
    top = Bundle.load(folder).search(question, k=1).hits[0].question_id
    shutil.rmtree(target, ignore_errors=True)
    return {"download_s": seconds, "top1": top, "found": qid is None or top == qid}


def scenario(
    label: str, base_dir: Path, metrics: dict[str, Any], work: Path, change: Callable
) -> dict[str, Any]:
    """Register the base (promoted), apply `change` to the models copy, register the
    changed state on top of the base ("after") and into a model of its own ("before")."""
    from qpr.ops import registry

    models = Path(shutil.copytree(base_dir, work / f"models-{label}"))
    name = f"bench-{label}"
    base, base_s = register(models, metrics, name)
    registry.promote(name, base.version, reason="base", actor="benchmark")
    say(f"{label}: base registered as version {base.version} in {base_s:.1f} s")
    facts, after, after_s = change(models, name)
    alone, alone_s = register(models, after["metrics"], f"{name}-whole")
    registry.promote(f"{name}-whole", alone.version, reason="before", actor="benchmark")
    say(f"{label}: after {after_s:.1f} s, whole copy {alone_s:.1f} s")
    version = after["info"].version
    result = {
        "base": {"version": base.version, "register_s": base_s},
        "after": {"version": version, "register_s": after_s},
        "before": {"version": alone.version, "register_s": alone_s},
        **facts,
    }
    for key, model in (("base", name), ("after", name), ("before", f"{name}-whole")):
        result[key]["stored"] = stored(model, result[key]["version"])
    for key, model in (("after", name), ("before", f"{name}-whole")):
        result[key]["served"] = searched(model, work, facts["question"], facts.get("qid"))
    shutil.rmtree(models, ignore_errors=True)
    return result


def delta_change(per_delta: int) -> Callable:
    def change(models: Path, name: str) -> tuple[dict[str, Any], dict[str, Any], float]:
        import pandas as pd

        from qpr.deltas.add import add_questions
        from qpr.deltas.format import live_questions
        from qpr.deltas.publish import register_deltas
        from qpr.ops import registry

        texts = live_questions(models)["text"].tolist()[:per_delta]
        qids = list(range(10**15, 10**15 + per_delta))
        frame = pd.DataFrame(
            {
                "question_id": qids,
                "text": [f"{t} (asked again today)" for t in texts],
                "cluster_id": -1,
                "answer_id": None,
            }
        )
        add_questions(models, frame)
        delta_bytes = sum(p.stat().st_size for p in (models / "deltas").rglob("*") if p.is_file())
        (info, said), seconds = timed(
            lambda: register_deltas(models, name=name, actor="benchmark", reason="delta")
        )
        if info is None or said != "promoted":
            raise SystemExit(f"the delta was not published: {said}")
        champion = registry.get_version(name, info.version)
        facts = {
            "questions_added": per_delta,
            "delta_bytes": delta_bytes,
            "question": frame["text"].iloc[0],
            "qid": qids[0],
        }
        return facts, {"info": info, "metrics": _metrics_of(champion)}, seconds

    return change


def search_change(metrics: dict[str, Any]) -> Callable:
    def change(models: Path, name: str) -> tuple[dict[str, Any], dict[str, Any], float]:
        from qpr.artifacts import SEARCH_FILE, SearchConfig
        from qpr.ops import registry

        before = (models / SEARCH_FILE).stat().st_size
        config = SearchConfig.read(models)
        changed = dataclasses.replace(
            config,
            target_precision=0.95,
            threshold=None if config.threshold is None else config.threshold * 0.9,
        )
        changed.write(models)
        new_metrics = {**metrics, "answered_share": 0.1}  # the evaluate stage reports anew
        info, seconds = timed(lambda: registry.register_bundle(models, new_metrics, name=name))
        facts = {
            "search_json_bytes": (models / SEARCH_FILE).stat().st_size,
            "search_json_bytes_before": before,
            "question": _first_question(models),
        }
        return facts, {"info": info, "metrics": new_metrics}, seconds

    return change


def _first_question(models: Path) -> str:
    from qpr.deltas.format import live_questions

    return str(live_questions(models)["text"].iloc[0])


def _metrics_of(info: Any) -> dict[str, Any]:
    """The metrics register_deltas registers (the champion's measures, as it rebuilds them)."""
    measures = info.measures
    out: dict[str, Any] = {k: v for k, v in measures.items() if not k.startswith("val.")}
    out["val"] = {k[4:]: v for k, v in measures.items() if k.startswith("val.")}
    return out


def markdown(result: dict[str, Any]) -> str:
    mb = 1e6
    machine = result["machine"]
    rows = []
    for key, what in (
        ("delta", f"(a) publish a {result['delta']['questions_added']}-question delta"),
        ("search", "(b) `dvc exp run` changing only search.json"),
    ):
        r = result[key]
        before, after = r["before"]["stored"]["total"], r["after"]["stored"]["total"]
        rows.append(
            f"| {what} | {before:,} ({before / mb:,.0f} MB) | {after:,} ({after / mb:.3f} MB) "
            f"| {before / after:,.0f}× | {r['before']['register_s']:.1f} / "
            f"{r['after']['register_s']:.1f} | {r['before']['served']['download_s']:.1f} / "
            f"{r['after']['served']['download_s']:.1f} |"
        )
    d, s = result["delta"], result["search"]
    da, sa = d["after"]["stored"], s["after"]["stored"]
    return "\n".join(
        [
            "# What a registry version stores",
            "",
            f"Bundle `{result['bundle']}`: {result['bundle_bytes'] / mb:,.0f} MB of bundle files. "
            "Scratch MLflow registry (sqlite, file artifact store) with the real registry "
            "functions. Generated by `benchmarks/registry_storage.py` on "
            f"{machine['cpus_usable']} shared {machine['cpu_model']} cores, load average "
            f"{result['load_average_start']:.1f} at the start and "
            f"{result['load_average_end']:.1f} at the end.",
            "",
            "Before: the version stores every file, as every version did until versions "
            "referenced each other (measured: the same state registered into a model with no "
            "earlier version). After: registered on top of the base, it stores only what no "
            "earlier version stores.",
            "",
            "| registered | stored before, bytes | stored after, bytes | ratio | register s "
            "before / after | download s before / after |",
            "|---|---:|---:|---:|---:|---:|",
            *rows,
            "",
            f"(a) The delta's files are {d['delta_bytes']:,} bytes (`deltas/`: the delta's "
            f"folder and the manifest). The version stores {da['bundle']:,} bytes of bundle "
            f"files: {_files(da)}. It stores {da['code']:,} bytes of code and "
            f"{da['metadata']:,} of metadata (the version manifest, MLmodel, the model code "
            "and its loader, the details file).",
            f"(b) The version stores {sa['bundle']:,} bytes of bundle files: {_files(sa)}. "
            f"It stores {sa['code']:,} bytes of code and {sa['metadata']:,} of metadata.",
            "Every version downloaded, base + delta put together and checked against its "
            "manifest, and found the question searched: "
            + (
                "yes."
                if all(r[k]["served"]["found"] for r in (d, s) for k in ("before", "after"))
                else "NO."
            ),
            "",
        ]
    )


def _files(stored_bytes: dict[str, Any]) -> str:
    files = stored_bytes["bundle_files"]
    if not isinstance(files, dict):
        return f"{files} files"
    return ", ".join(f"{rel} ({size:,})" for rel, size in files.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models-dir", type=Path, default=Path("/tmp/qprod/models"))
    parser.add_argument("--metrics", type=Path, help="evaluate.json (default: beside models/)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/regbench"))
    parser.add_argument("--per-delta", type=int, default=50)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    parser.add_argument("--name", default="registry_storage")
    parser.add_argument("--label", help="What the page calls the bundle (default: its folder).")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{args.work / 'mlflow.db'}"
    import mlflow

    from qpr.ops.registry import bundle_files

    mlflow.create_experiment("registry-storage", artifact_location=(args.work / "art").as_uri())
    mlflow.set_experiment("registry-storage")
    metrics_file = args.metrics or args.models_dir.parent / "metrics" / "evaluate.json"
    metrics = json.loads(metrics_file.read_text()) if metrics_file.is_file() else {}
    metrics.setdefault("val", {}).setdefault("recip_rank", 0.5)
    # The bundle as the register stage sees it: no torch checkpoint, no deltas yet.
    base = Path(
        shutil.copytree(args.models_dir, args.work / "base", ignore=shutil.ignore_patterns("*.pt"))
    )
    shutil.rmtree(base / "deltas", ignore_errors=True)
    result: dict[str, Any] = {
        "bundle": args.label or str(args.models_dir),
        "bundle_bytes": sum((base / rel).stat().st_size for rel in bundle_files(base)),
        "load_average_start": load,
    }
    result["search"] = scenario("search", base, metrics, args.work, search_change(metrics))
    result["delta"] = scenario("delta", base, metrics, args.work, delta_change(args.per_delta))
    result["load_average_end"] = os.getloadavg()[0]
    result["machine"] = describe(ROOT, {"mlflow": mlflow.__version__})
    args.out.mkdir(parents=True, exist_ok=True)
    pages = {"json": json.dumps(result, indent=2) + "\n", "md": markdown(result)}
    for suffix, text in pages.items():
        (args.out / f"{args.name}.{suffix}").write_text(text)
    say(f"wrote {args.out / args.name}.{{json,md}}")


if __name__ == "__main__":
    main()
