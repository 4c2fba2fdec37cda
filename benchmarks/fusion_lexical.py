"""BM25's side of the fusion: how deep BM25 reads, and the dense candidates it missed.

Why: the fused search (`qpr.retrieval.hybrid`) unions BM25's top `index.lexical.candidates`
with the index's top rows. Every row of the union gets its exact dense distance, but a row
BM25's top k left out gets 0 from BM25 (`qpr.retrieval.fusion.fuse_union`). Two questions
follow, and this script measures both on built projects:

1. How deep must BM25 read? Each --depths value is fused as the evaluate stage fuses it.
2. Would the missed rows' own BM25 scores help? The "union" rows score every row of the
   union with BM25 (`BM25Index.scores_at`, bit for bit what `search` gives its own rows)
   and scale BM25 over the whole union; "top" rows are the product's fusion.

For each --project (a folder `dvc repro` built): the evaluate stage's own steps give the
validation and test queries (spelling corrected as served), their vectors and their
candidates over an exact dense search (`qpr.evaluation.measure.fusion_candidates`). Every
(companion w, α) of params is fused and judged per query (`val_hits`). The setting with
the best validation P@1 (`best_setting`, the evaluate stage's rule) is read on test, with
its paired standard error against what the project serves.

    PYTHONPATH=src:. .venv/bin/python benchmarks/fusion_lexical.py \\
        --project embedded=/path/to/embedded-checkout --project quora=/path/to/quora-checkout

Writes docs/results/fusion_lexical.{json,md} (or --out DIR). Projects already in the JSON
are kept unless --fresh or --redo names them.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from built_project import (
    add_project_arguments,
    fusion_inputs,
    measure_projects,
    project_record,
    save_page,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
STEM = "fusion_lexical"
MODES = ("top", "union")


def log(message: str) -> None:
    print(message, flush=True)


def union_scored(candidates, texts, bm25):
    """The candidates with BM25's scores read for every union row: lexical rows = the
    union, scores float32 [Q, U] (0: no word shared, -inf at empty slots)."""
    pairs = zip(texts, candidates.union, strict=True)
    scores = np.stack([bm25.scores_at(text, rows) for text, rows in pairs])
    return replace(candidates, lexical_scores=scores, lexical_rows=candidates.union)


def measure(name: str, project: Path, depths: list[int]) -> dict[str, Any]:
    """One project's rows: per BM25 depth and mode, the setting chosen on val and its
    test P@1."""
    from qpr.evaluation.fusion_tuning import best_setting, paired_error, val_hits
    from qpr.evaluation.measure import fusion_candidates

    started = time.perf_counter()
    inputs = fusion_inputs(project)
    settings, served, k = inputs.settings, inputs.served, inputs.settings.evaluate.k
    rows = []
    chosen: dict[tuple[int, str], np.ndarray] = {}  # (depth, mode): test success@1 [Q]
    for depth in depths:
        lexical = settings.index.lexical.model_copy(update={"candidates": depth})
        index = settings.index.model_copy(update={"lexical": lexical})
        at_depth = settings.model_copy(update={"index": index})
        hits: dict[tuple[str, str], dict] = {}
        for split_name, split in inputs.splits.items():
            exact, _ = fusion_candidates(served, split, inputs.base, at_depth, inputs.twin)
            texts = split.queries.texts
            for mode in MODES:
                candidates = exact if mode == "top" else union_scored(exact, texts, served.bm25)
                hits[mode, split_name] = {
                    (float(w), float(a)): val_hits(
                        candidates, a, split.queries, served.ids.qids, k, w
                    )
                    for w in inputs.companion_weights
                    for a in inputs.weights
                }
        for mode in MODES:
            val, test = hits[mode, "val"], hits[mode, "test"]
            w, a = best_setting(val)
            chosen[depth, mode] = test[w, a]
            rows.append(
                {
                    "depth": depth,
                    "mode": mode,
                    "dense_weight": a,
                    "companion_weight": w,
                    "val_p1": float(val[w, a].mean()),
                    "test_p1": float(test[w, a].mean()),
                    "test_p1_best_setting": float(max(h.mean() for h in test.values())),
                }
            )
            log(f"{name}: BM25 top {depth}, {mode}: α {a}, w {w}: val P@1 "
                f"{val[w, a].mean():.4f}, test {test[w, a].mean():.4f}")  # fmt: skip
    served_depth = settings.index.lexical.candidates
    for row in rows:
        # against what the project serves; the same depth's product row when not measured
        product = chosen.get((served_depth, "top"), chosen[row["depth"], "top"])
        mine = chosen[row["depth"], row["mode"]]
        row["test_gain"] = float(mine.mean() - product.mean())
        row["test_gain_error"] = paired_error(mine, product)
    return {
        "rows": rows,
        **project_record(name, project, inputs, started),
        "served_depth": served_depth,
    }


def write(payload: dict, out: Path) -> None:
    intro = (
        "Each built project's validation and test queries are fused at every (companion w, "
        "α) of its params over an exact dense search, at each BM25 depth, as the evaluate "
        "stage tunes them. The setting with the best validation P@1 is read on test. "
        "\"top\": the product's fusion, where a row BM25's top k left out gets 0 from BM25. "
        '"union": every row of the union scored by BM25, scaled over the union. Gain: test '
        'P@1 against what the project serves (its depth, "top"), ± the paired standard '
        "error."
    )
    lines: list[str] = []
    for project in payload["projects"].values():
        lines += [
            f"## {project['project']}",
            "",
            f"`{project['path']}`: {project['val_queries']:,} validation and "
            f"{project['test_queries']:,} test queries; the project serves BM25's top "
            f"{project['served_depth']}. {project['seconds']:.0f} s, load "
            f"{project['load_avg'][0]:.1f}.",
            "",
            "| BM25 depth | BM25 scores | α | companion w | val P@1 | test P@1 | gain | "
            "best test P@1 in hindsight |",
            "|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in project["rows"]:
            lines.append(
                f"| {r['depth']} | {r['mode']} | {r['dense_weight']} | {r['companion_weight']} "
                f"| {r['val_p1']:.4f} | {r['test_p1']:.4f} | {r['test_gain']:+.4f} ± "
                f"{r['test_gain_error']:.4f} | {r['test_p1_best_setting']:.4f} |"
            )
        lines.append("")
    title = "BM25's side of the fusion: its depth, and the rows it missed"
    save_page(out, STEM, payload, title, intro, lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_project_arguments(parser, RESULTS)
    parser.add_argument("--depths", default="20,50,100", help="BM25 depths to fuse")
    args = parser.parse_args(argv)
    depths = [int(d) for d in args.depths.split(",")]
    measure_projects(args, STEM, lambda name, path: measure(name, path, depths), write, ROOT, log)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
