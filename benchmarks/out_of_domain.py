"""Out of domain: trained bundles served on question sets of other domains, against BM25.

Why: issue 38 asks that a model trained on one domain never fall below BM25 alone on
another. Each --bundle (a trained models folder, with the domain it was trained on) is
measured on each --data set (a QA-log file or folder, or Quora pairs, with its domain)
by `qpr evaluate FILE`'s own code (`qpr.evaluation.on_file.evaluate_file`): the file is
clustered by the cluster stage's code, every question of a kept cluster (or of its test
split) is a query, its relevant documents are the other questions of its cluster, the
index is the file's questions alone, each query is left out of its own results, and
three systems run on the same queries:

- "served": the bundle as the service searches it over the file's questions (its query
  encoder, depth, BM25 fusion, re-ranker; `Bundle.search_batch`);
- "encoder": the bundle's encoder alone, exact search;
- "bm25": BM25 alone over the same questions (the bundle's BM25 settings, else params').

A bundle is in domain on a data set when their domains are named alike. --queries caps
each set's queries (a sample seeded by params' seed; the index stays whole). Rows already
in the JSON are kept unless --fresh, or --redo names their bundle or data set.

    PYTHONPATH=src:. .venv/bin/python benchmarks/out_of_domain.py \\
        --bundle paper-cnn@embedded=/tmp/embedded/models \\
        --bundle quora-cnn@quora=/tmp/quora/models \\
        --data readme-example@speaker-support=examples/my_logs.csv \\
        --data embedded-test@embedded=data/logs:test \\
        --data quora-test@quora=../shared/data/quora/quora_duplicate_questions.tsv:test \\
        --queries 3000

Writes docs/results/out_of_domain.{json,md,png} (or --out DIR).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_info import describe

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
STEM = "out_of_domain"
SYSTEMS = {"served": "served", "encoder": "encoder", "bm25_alone": "bm25"}
MEASURES = {"success_1": "p_at_1", "success_10": "p_at_10", "recip_rank": "mrr"}
SPLITS = ("all", "test")


def log(message: str) -> None:
    print(message, flush=True)


@dataclass(frozen=True)
class Spec:
    """One --bundle or --data: its name, its domain, its path (and a data set's split)."""

    name: str
    domain: str
    path: Path
    split: str = "all"


def parse_spec(text: str, *, with_split: bool) -> Spec:
    """NAME@DOMAIN=PATH, and for a data set PATH[:all|:test] (default all)."""
    label, eq, path = text.partition("=")
    name, at, domain = label.partition("@")
    if not (eq and at and name and domain and path):
        raise ValueError(f"{text!r}: expected NAME@DOMAIN=PATH")
    split = "all"
    if with_split:
        head, colon, tail = path.rpartition(":")
        if colon and tail in SPLITS:
            path, split = head, tail
    return Spec(name, domain, Path(path), split)


def points(a: float, b: float) -> float:
    """a minus b, in points of a share (0.81 - 0.80 → 1.0)."""
    return round(100 * (a - b), 2)


def row_of(bundle: Spec, data: Spec, summary: dict[str, Any]) -> dict[str, Any]:
    """The JSON row of one bundle on one data set, from `evaluate_file`'s summary."""
    systems = {
        short: {
            **{key: round(float(summary["systems"][name][m]), 4) for m, key in MEASURES.items()},
            "answered_share": summary["systems"][name].get("answered_share"),
            "p50_ms": summary["systems"][name].get("p50_ms"),
        }
        for name, short in SYSTEMS.items()
    }
    counts = summary["counts"]
    served, bm25 = systems["served"], systems["bm25"]
    return {
        "bundle": bundle.name,
        "trained_on": bundle.domain,
        "data": data.name,
        "data_domain": data.domain,
        "in_domain": bundle.domain == data.domain,
        "models_dir": str(bundle.path),
        "bundle_fingerprint": summary["bundle_fingerprint"],
        "file": str(data.path),
        "format": summary["format"],
        "split": summary["split"],
        "queries": counts["queries"],
        "queries_before_cap": counts.get("queries_before_cap", counts["queries"]),
        "clusters": counts["clusters"],
        "index_size": counts["index_size"],
        "systems": systems,
        "served_minus_bm25_points": points(served["p_at_1"], bm25["p_at_1"]),
        "encoder_minus_bm25_points": points(systems["encoder"]["p_at_1"], bm25["p_at_1"]),
        "served_index": summary["served_index"],
        "calibration": summary.get("calibration"),
        "seconds": round(summary["seconds"]["total"], 1),
    }


def bundle_about(models: Path) -> dict[str, Any]:
    """What serves queries: search.json's query encoder and fusion weight, and whether a
    query student is on (student/student.json)."""
    search = json.loads((models / "search.json").read_text())
    student_file = models / "student" / "student.json"
    student = json.loads(student_file.read_text()) if student_file.exists() else {}
    return {
        "query_encoder": (search.get("query_encoder") or {}).get("kind"),
        "dense_weight": search.get("dense_weight"),
        "student": (student.get("config") or {}).get("kind") if student.get("enabled") else None,
    }


def measure(bundle: Spec, data: Spec, args: argparse.Namespace, settings: Any) -> dict:
    """One row: `evaluate_file` on the data set with the bundle, timed, load recorded."""
    from qpr.evaluation.on_file import EvaluateFileConfig, evaluate_file

    before = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory(prefix="qpr-ood-") as gates:
        config = EvaluateFileConfig(
            data=data.path,
            gate_reports=Path(gates),
            models_dir=bundle.path,
            split=data.split,  # type: ignore[arg-type]
            max_queries=args.queries,
            calibrate=True,
        )
        started = time.perf_counter()
        result = evaluate_file(config, settings, log=log)
        wall = time.perf_counter() - started
    row = row_of(bundle, data, result.summary)
    row.update(bundle_about(bundle.path))
    row["wall_s"] = round(wall, 1)
    row["load_avg_before"] = before
    row["load_avg_after"] = round(os.getloadavg()[0], 2)
    return row


def payload_of(args: argparse.Namespace, rows: list[dict]) -> dict:
    import qpr

    return {
        "date": pd.Timestamp.now(tz="UTC").strftime("%Y-%m-%d %H:%M UTC"),
        "machine": describe(
            ROOT,
            {"numpy": np.__version__},
            load_avg=list(os.getloadavg()),
            qpr_source=str(Path(qpr.__file__).resolve().parent),
        ),
        "params": {"queries": args.queries, "seed": args.seed, "params": str(args.params)},
        "about": args.about,
        "rows": rows,
    }


def _fmt(system: dict[str, Any]) -> str:
    return f"{system['p_at_1']:.4f} | {system['p_at_10']:.4f} | {system['mrr']:.4f}"


def markdown(payload: dict) -> str:
    """docs/results/out_of_domain.md: protocol, the table, the verdicts."""
    machine, params, rows = payload["machine"], payload["params"], payload["rows"]
    capped = sorted(
        {
            f"{r['data']} ({r['queries']:,} of {r['queries_before_cap']:,})"
            for r in rows
            if r["queries"] < r["queries_before_cap"]
        }
    )
    cap = (
        f"at most {params['queries']:,} queries per set, a sample seeded by params' seed "
        f"({params['seed']}); sampled here: {', '.join(capped)}"
        if capped
        else "every query of each set"
    )
    lines = [
        "# Out of domain: served P@1 against BM25 alone on other domains' questions",
        "",
        f"Written by `benchmarks/out_of_domain.py` on {payload['date']} "
        f"({machine['cpu_model']}, {machine['cpus_usable']} cores, load average "
        f"{machine['load_avg'][0]:.1f} at the end); never edited by hand.",
        "",
        *([payload["about"], ""] if payload.get("about") else []),
        "## Protocol",
        "",
        "- each bundle on each data set through `qpr evaluate FILE`'s code "
        "(`qpr.evaluation.on_file`): the file clustered by the cluster stage's code; "
        "split all: every question of a kept cluster is a query; split test: the test "
        "clusters the cluster stage cuts with these params (seed and ratios)",
        f"- queries: {cap}",
        "- relevant: the other questions of the query's cluster; index: the set's questions "
        "alone; each query left out of its own results; P@N = a paraphrase in the first N",
        "- served: the bundle as the service searches it (query encoder, depth, BM25 "
        "fusion, re-ranker); encoder: its encoder alone, exact search; BM25: BM25 alone "
        "over the same questions (the bundle's BM25 settings, else params')",
        "- in domain: the bundle was trained on that domain's data",
        "",
        "## Results",
        "",
        "| bundle | trained on | data set | domain | queries | served P@1 | served P@10 | "
        "served MRR | encoder P@1 | encoder P@10 | encoder MRR | BM25 P@1 | BM25 P@10 | "
        "BM25 MRR | served − BM25 (points) | seconds | load avg |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        systems = row["systems"]
        lines.append(
            f"| {row['bundle']} | {row['trained_on']} | {row['data']} ({row['split']}) | "
            f"{'in' if row['in_domain'] else 'out'} | {row['queries']:,} | "
            f"{_fmt(systems['served'])} | {_fmt(systems['encoder'])} | {_fmt(systems['bm25'])} | "
            f"{row['served_minus_bm25_points']:+.1f} | {row['wall_s']:.0f} | "
            f"{row['load_avg_before']:.1f} / {row['load_avg_after']:.1f} |"
        )
    lines += ["", "## The target: served P@1 at least BM25 alone's out of domain", ""]
    lines += [verdict(row) for row in rows if not row["in_domain"]] or ["- no row out of domain"]
    lines += ["", *no_answer_section(rows)]
    lines += ["", "What each bundle serves:", ""]
    seen: dict[str, dict] = {r["bundle"]: r for r in rows}
    for name, row in seen.items():
        student = f", query student {row['student']}" if row.get("student") else ""
        fusion = (
            f"BM25 fused at dense weight {row['dense_weight']:g}"
            if row["served_index"]["fusion"]
            else "no BM25 fusion"
        )
        lines.append(
            f"- {name} (`{row['models_dir']}`, fingerprint {row['bundle_fingerprint'][:12]}): "
            f"query encoder {row['query_encoder']}{student}, {fusion}"
        )
    return "\n".join(lines) + "\n"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _outcome(check: dict[str, Any]) -> str:
    return (
        f"{_share(check['answered_share'])} | {_share(check['precision_at_1'])} | "
        f"{_share(check['false_answer_rate'])}"
    )


def no_answer_section(rows: list[dict]) -> list[str]:
    """The bundle's "no answer" threshold against one calibrated on the set's own clusters
    (`qpr evaluate FILE --calibrate`), both on the half of the clusters not used to choose."""
    calibrated = [r for r in rows if r.get("calibration")]
    if not calibrated:
        return []
    lines = [
        "## No answer across domains: the bundle's threshold against a calibrated one",
        "",
        "`qpr evaluate FILE --calibrate` chooses a threshold on a seeded half of the set's "
        "clusters, by the evaluate stage's rule (P@1 answered at least the target, false "
        "answers within the bound). Both thresholds are then measured on the other half. "
        "False answers: the check half's queries searched with their own cluster left out, "
        "and the set's questions with no paraphrase.",
        "",
        "| bundle | data set | domain | bundle's threshold | answered | P@1 answered | "
        "false answers | calibrated threshold (rule) | answered | P@1 answered | "
        "false answers | check queries / with no paraphrase |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in calibrated:
        cal = row["calibration"]
        bundle, mine = cal["check"]["bundle"], cal["check"]["calibrated"]
        own = row["served_index"].get("threshold")
        chosen = cal["threshold"]
        lines.append(
            f"| {row['bundle']} | {row['data']} ({row['split']}) | "
            f"{'in' if row['in_domain'] else 'out'} | "
            f"{'none' if own is None else f'{own:.3f}'} | {_outcome(bundle)} | "
            f"{'none' if chosen is None else f'{chosen:.3f}'} ({cal['rule']}) | "
            f"{_outcome(mine)} | {mine['answerable']:,} / {mine['unanswerable']:,} |"
        )
    return lines


def verdict(row: dict) -> str:
    gap = row["served_minus_bm25_points"]
    word = "met" if gap >= 0 else "MISSED"
    return (
        f"- {row['bundle']} on {row['data']}: served P@1 {row['systems']['served']['p_at_1']:.4f}"
        f", BM25 {row['systems']['bm25']['p_at_1']:.4f} ({gap:+.1f} points): {word}"
    )


def plot(rows: list[dict], path: Path) -> None:
    """One panel per data set: P@1 of served, encoder and BM25 for each bundle."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data_sets = list(dict.fromkeys(r["data"] for r in rows))
    fig, axes = plt.subplots(1, len(data_sets), figsize=(5 * len(data_sets), 4.2), squeeze=False)
    colours = {"served": "tab:blue", "encoder": "tab:orange", "bm25": "tab:gray"}
    for ax, name in zip(axes[0], data_sets, strict=True):
        mine = [r for r in rows if r["data"] == name]
        x = np.arange(len(mine))
        for i, (system, colour) in enumerate(colours.items()):
            values = [r["systems"][system]["p_at_1"] for r in mine]
            ax.bar(x + (i - 1) * 0.27, values, 0.27, label=system, color=colour)
        ax.set_xticks(x, [f"{r['bundle']}\n({'in' if r['in_domain'] else 'out'})" for r in mine])
        ax.set_ylim(0, 1)
        ax.set_title(f"{name} ({mine[0]['queries']:,} queries)")
        ax.set_ylabel("P@1")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def save(args: argparse.Namespace, done: dict[str, dict], stored: dict | None = None) -> dict:
    """Write what is measured so far (a later run resumes from it). stored: the JSON as
    it was, when this call measured nothing: its date and machine stay, the pages are
    written again from its rows."""
    from qpr.io import write_json_atomic, write_text_atomic

    rows = list(done.values())
    payload = payload_of(args, rows) if stored is None else {**stored, "rows": rows}
    write_json_atomic(args.out / f"{STEM}.json", payload)
    write_text_atomic(args.out / f"{STEM}.md", markdown(payload))
    if payload["rows"]:
        plot(payload["rows"], args.out / f"{STEM}.png")
    return payload


def previous_run(args: argparse.Namespace) -> tuple[dict | None, dict[str, dict]]:
    """(the JSON of an earlier run with the same cap and seed, its rows by "bundle/data")."""
    path = args.out / f"{STEM}.json"
    if args.fresh or not path.exists():
        return None, {}
    old = json.loads(path.read_text())
    wanted = {"queries": args.queries, "seed": args.seed}
    had = {key: old["params"].get(key) for key in wanted}
    if had != wanted:
        raise SystemExit(f"{path} has {had}, not {wanted}: pass --fresh")
    return old, {f"{r['bundle']}/{r['data']}": r for r in old["rows"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", action="append", required=True, help="NAME@DOMAIN=MODELS")
    parser.add_argument(
        "--data", action="append", required=True, help="NAME@DOMAIN=FILE[:all|:test]"
    )
    parser.add_argument("--queries", type=int, default=None, help="queries per set, at most")
    parser.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--about", default="", help="what the rows show, in words")
    parser.add_argument("--fresh", action="store_true", help="measure every row again")
    parser.add_argument(
        "--redo", action="append", default=[], help="a bundle or data set to measure again"
    )
    args = parser.parse_args(argv)
    try:
        bundles = [parse_spec(s, with_split=False) for s in args.bundle]
        data_sets = [parse_spec(s, with_split=True) for s in args.data]
    except ValueError as err:
        raise SystemExit(str(err)) from err

    from qpr.config import load_settings

    settings = load_settings(args.params)
    args.seed = settings.seed
    args.out.mkdir(parents=True, exist_ok=True)
    stored, done = previous_run(args)
    for bundle in bundles:
        for data in data_sets:
            key = f"{bundle.name}/{data.name}"
            if key in done and not {bundle.name, data.name} & set(args.redo):
                log(f"{key}: kept from the JSON")
                continue
            log(f"{key}: {bundle.path} on {data.path} ({data.split})")
            done[key] = measure(bundle, data, args, settings)
            log(json.dumps({k: done[key][k] for k in ("systems", "wall_s")}))
            save(args, done)
            stored = None  # the machine and date are this call's now
    # The table in the order asked for; rows of bundles or sets not named stay after.
    asked = [f"{b.name}/{d.name}" for b in bundles for d in data_sets]
    ordered = {key: done[key] for key in asked if key in done}
    done = {**ordered, **{key: row for key, row in done.items() if key not in ordered}}
    print(markdown(save(args, done, stored)))


if __name__ == "__main__":
    main()
