"""A built project's fusion inputs, and the resumable loop over projects, for the
benchmarks that tune the fusion offline (`fusion_rule.py`, `fusion_lexical.py`)."""

from __future__ import annotations

import json
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


def measure_projects(
    specs: list[str],
    stored_json: Path,
    *,
    fresh: bool,
    redo: list[str],
    measure: Callable[[str, Path], dict],
    write: Callable[[dict], None],
    root: Path,
    log: Callable[[str], None] = print,
) -> None:
    """Each NAME=PROJECT_DIR of specs measured and written after each one, so a killed run
    keeps what it measured; a project already in stored_json is kept unless fresh or
    named in redo."""
    stored = json.loads(stored_json.read_text()) if stored_json.exists() and not fresh else {}
    projects = dict(stored.get("projects", {}))
    for spec in specs:
        name, _, path = spec.partition("=")
        if not path:
            raise SystemExit(f"--project {spec!r}: NAME=PROJECT_DIR")
        if name in projects and name not in redo:
            log(f"{name}: kept from the JSON")
            continue
        projects[name] = measure(name, Path(path).resolve())
        write(
            {
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "machine": describe(root, {"numpy": np.__version__}),
                "projects": projects,
            }
        )
