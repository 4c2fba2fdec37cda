"""A built project's fusion inputs, the resumable loop over projects and the results page,
for the benchmarks that tune the fusion offline (`fusion_rule.py`, `fusion_lexical.py`)."""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from machine_info import describe


@dataclass(frozen=True)
class FusionInputs:
    """What the evaluate stage tunes the fusion on, for a project `dvc repro` built:
    settings, served (`qpr.evaluation.measure.Served`), base (its `SearchConfig`), splits
    {"val", "test": `Split`} (queries spelling-corrected as served), the (w, α) grid of
    params, and the index's exact twin (built once: it copies every vector)."""

    settings: Any
    served: Any
    base: Any
    splits: dict[str, Any]
    weights: list[float]
    companion_weights: list[float]
    twin: Any


def fusion_inputs(project: Path) -> FusionInputs:
    """The evaluate stage's own steps up to the fusion's candidates; SystemExit when the
    project does not fuse BM25 in."""
    from qpr.config import load_settings
    from qpr.evaluation.measure import as_searched, dense_splits
    from qpr.evaluation.queries import judged_questions, query_set
    from qpr.paths import ProjectPaths
    from qpr.pipeline.evaluate import search_config
    from qpr.pipeline.handoff import load_served, read_cluster_outputs
    from qpr.retrieval.dense import exact_twin

    settings = load_settings(project / "params.yaml")
    paths = ProjectPaths(project)
    served, indexed = load_served(paths, settings)
    if served.bm25 is None:
        raise SystemExit(f"{project}: index.lexical.enabled is false, there is no fusion to tune")
    questions, _ = read_cluster_outputs(paths)
    judged = judged_questions(questions, indexed)
    base = search_config(paths, settings, None, None)
    asked = {name: query_set(judged, name) for name in ("val", "test")}
    companions = (
        sorted(set(settings.index.companion_weights)) if served.companion is not None else [0.0]
    )
    return FusionInputs(
        settings=settings,
        served=served,
        base=base,
        splits=dense_splits(served, as_searched(served, asked, base), settings.evaluate.k),
        weights=sorted(set(settings.index.lexical.dense_weights)),
        companion_weights=companions,
        twin=exact_twin(served.index),
    )


def project_record(name: str, project: Path, inputs: FusionInputs, started: float) -> dict:
    """The fields every project's result carries: its name and folder, its splits' sizes,
    the seconds since `started` (perf_counter) and the load average."""
    return {
        "project": name,
        "path": str(project),
        "val_queries": len(inputs.splits["val"].queries.texts),
        "test_queries": len(inputs.splits["test"].queries.texts),
        "seconds": round(time.perf_counter() - started, 1),
        "load_avg": os.getloadavg(),
    }


def add_project_arguments(parser: argparse.ArgumentParser, results: Path) -> None:
    """--project NAME=PROJECT_DIR (repeatable), --out, --fresh and --redo NAME."""
    parser.add_argument("--project", action="append", required=True, help="NAME=PROJECT_DIR")
    parser.add_argument("--out", type=Path, default=results)
    parser.add_argument("--fresh", action="store_true", help="measure every project again")
    parser.add_argument("--redo", action="append", default=[], help="a project to measure again")


def measure_projects(
    args: argparse.Namespace,
    stem: str,
    measure: Callable[[str, Path], dict],
    write: Callable[[dict, Path], None],
    root: Path,
    log: Callable[[str], None] = print,
) -> None:
    """Each of args.project measured and written to args.out after each one, so a killed
    run keeps what it measured; a project already in `<stem>.json` there is kept unless
    args.fresh or args.redo names it."""
    stored_json = args.out / f"{stem}.json"
    stored = json.loads(stored_json.read_text()) if stored_json.exists() and not args.fresh else {}
    projects = dict(stored.get("projects", {}))
    for spec in args.project:
        name, _, path = spec.partition("=")
        if not path:
            raise SystemExit(f"--project {spec!r}: NAME=PROJECT_DIR")
        if name in projects and name not in args.redo:
            log(f"{name}: kept from the JSON")
            continue
        projects[name] = measure(name, Path(path).resolve())
        payload = {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": describe(root, {"numpy": np.__version__}),
            "projects": projects,
        }
        write(payload, args.out)


def save_page(out: Path, stem: str, payload: dict, title: str, intro: str, body: list[str]) -> None:
    """`<stem>.json` (the payload) and `<stem>.md`: the title, who wrote it on which
    machine, the intro, then the body's lines."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    machine = payload["machine"]
    lines = [
        f"# {title}",
        "",
        f"Written by `benchmarks/{stem}.py` on {payload['date']} at "
        f"{str(machine['git_commit'])[:7]} ({machine['cpu_model']}, "
        f"{machine['cpus_usable']} cores); never edited by hand.",
        "",
        intro,
        "",
        *body,
    ]
    (out / f"{stem}.md").write_text("\n".join(lines), encoding="utf-8")
