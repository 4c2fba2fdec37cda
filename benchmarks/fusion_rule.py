"""The fusion rule on small validation sets: `index.lexical.rule` best against one_se.

Why: a team's own logs start small. With a few hundred validation queries the best
validation P@1 is a noisy pick, and the evaluate stage's `one_se` rule serves the setting
that leans least on the trained query encoder within one paired standard error of it
(`qpr.evaluation.fusion_tuning.lean_choice`). This script asks, on a built project, what
each rule would serve from validation sets of a given size, and what that setting scores
on the project's whole test split.

For each --project (a folder `dvc repro` built): the evaluate stage's own steps give the
validation and test queries (spelling corrected as served), their vectors and their
candidates from an exact dense search with BM25 (`qpr.evaluation.measure.fusion_candidates`,
as the stage tunes them); every (companion w, α) of params is fused and judged per query
(`val_hits`). Then --draws seeded samples of --sizes validation queries each choose a
setting by each rule; the chosen setting's test P@1 is read from the whole test split.
The row "all" is the stage's own choice on the whole validation split.

    PYTHONPATH=src:. .venv/bin/python benchmarks/fusion_rule.py \\
        --project quora=/path/to/quora-checkout --sizes 250,500,1000 --draws 200

Writes docs/results/fusion_rule.{json,md} (or --out DIR). Rows already in the JSON are
kept unless --fresh or --redo names their project.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from built_project import (
    FusionInputs,
    add_project_arguments,
    fusion_inputs,
    measure_projects,
    project_record,
    save_page,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
STEM = "fusion_rule"


def log(message: str) -> None:
    print(message, flush=True)


def per_query_hits(inputs: FusionInputs, label: str) -> dict[str, dict]:
    """{"val", "test": {(w, α): float64 [Q] success@1}} of a built project, over the
    evaluate stage's exact candidates."""
    from qpr.evaluation.fusion_tuning import val_hits
    from qpr.evaluation.measure import fusion_candidates

    served, k = inputs.served, inputs.settings.evaluate.k
    out: dict[str, dict] = {}
    for name, split in inputs.splits.items():
        exact, _ = fusion_candidates(served, split, inputs.base, inputs.settings, inputs.twin)
        out[name] = {
            (float(w), float(a)): val_hits(exact, a, split.queries, served.ids.qids, k, w)
            for w in inputs.companion_weights
            for a in inputs.weights
        }
        log(f"{label}: {name}, {len(split.queries.texts):,} queries, "
            f"{len(out[name])} settings")  # fmt: skip
    return out


def measure(name: str, project: Path, sizes: list[int], draws: int, seed: int) -> dict:
    """One project's rows: per validation size and rule, the chosen settings' test P@1."""
    from qpr.evaluation.fusion_tuning import RULES, choose_setting, trained_share

    started = time.perf_counter()
    inputs = fusion_inputs(project)
    hits = per_query_hits(inputs, project.name)
    val, test = hits["val"], hits["test"]
    test_p1 = {wa: float(h.mean()) for wa, h in test.items()}
    n_val = len(next(iter(val.values())))
    rows = []
    for size in [*sorted(s for s in sizes if s < n_val), n_val]:
        rng = np.random.default_rng(seed)
        samples = (
            [np.arange(n_val)]
            if size == n_val
            else [rng.choice(n_val, size, replace=False) for _ in range(draws)]
        )
        for rule in RULES:
            chosen = [choose_setting({wa: h[s] for wa, h in val.items()}, rule) for s in samples]
            p1 = np.array([test_p1[wa] for wa in chosen])
            share = np.array([trained_share(a, w) for w, a in chosen])
            rows.append(
                {
                    "project": name,
                    "val_queries": size,
                    "draws": len(samples),
                    "rule": rule,
                    "test_p1_mean": float(p1.mean()),
                    "test_p1_std": float(p1.std()),
                    "test_p1_p10": float(np.percentile(p1, 10)),
                    "test_p1_min": float(p1.min()),
                    "trained_share_mean": float(share.mean()),
                    "bm25_alone_share": float(np.mean([a == 0.0 for _, a in chosen])),
                    "chosen": None if size < n_val else {"dense_weight": chosen[0][1],
                                                          "companion_weight": chosen[0][0]},
                }
            )  # fmt: skip
            log(
                f"{name}: {size:,} val queries, {rule}: test P@1 {p1.mean():.4f} ± "
                f"{p1.std():.4f} (10th percentile {np.percentile(p1, 10):.4f})"
            )
    return {
        "rows": rows,
        **project_record(name, project, inputs, started),
        "test_p1_best_setting": max(test_p1.values()),
        "test_p1_bm25_alone": test_p1[(0.0, 0.0)],
    }


def write(payload: dict, out: Path) -> None:
    intro = (
        "Each built project's validation and test queries are fused at every (companion w, "
        "α) of its params, over an exact dense search with BM25, as the evaluate stage tunes "
        "them. Seeded samples of N validation queries each choose a setting by `rule: best` "
        "(the best validation P@1) and by `rule: one_se` (within one paired standard error "
        "of the best, the least weight α·(1 − w) on the trained query encoder). The chosen "
        "setting's P@1 is read on the project's whole test split. The last N of each "
        "project is its whole validation split: the evaluate stage's own choice."
    )
    lines: list[str] = []
    for project in payload["projects"].values():
        lines += [
            f"## {project['project']}",
            "",
            f"`{project['path']}`: {project['val_queries']:,} validation and "
            f"{project['test_queries']:,} test queries. Test P@1 of the best setting in "
            f"hindsight {project['test_p1_best_setting']:.4f}; BM25 alone "
            f"{project['test_p1_bm25_alone']:.4f}. {project['seconds']:.0f} s, load "
            f"{project['load_avg'][0]:.1f}.",
            "",
            "| val queries | draws | rule | test P@1 mean | std | 10th percentile | worst "
            "| trained share | BM25 alone chosen |",
            "|---:|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in project["rows"]:
            lines.append(
                f"| {r['val_queries']:,} | {r['draws']} | {r['rule']} | {r['test_p1_mean']:.4f} "
                f"| {r['test_p1_std']:.4f} | {r['test_p1_p10']:.4f} | {r['test_p1_min']:.4f} "
                f"| {r['trained_share_mean']:.2f} | {r['bm25_alone_share']:.0%} |"
            )
        lines.append("")
    title = "The fusion rule on small validation sets: best against one_se"
    save_page(out, STEM, payload, title, intro, lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_project_arguments(parser, RESULTS)
    parser.add_argument("--sizes", default="100,250,500,1000", help="validation queries a draw")
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--seed", type=int, default=13)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    measure_projects(
        args, STEM, lambda name, path: measure(name, path, sizes, args.draws, args.seed), write,
        ROOT, log,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
