"""Report of one full pipeline run: per-stage wall time and the measured results.

Reads a project directory after `dvc repro` (its params.yaml, metrics/*.json, metrics.json
and the MLflow runs of its stages) and writes `<out>/<name>.json` and `<out>/<name>.md`.
Nothing is typed in: every number comes from the run's own files.

    python benchmarks/pipeline_report.py --project . --name pipeline_default
    python benchmarks/pipeline_report.py --project /path/to/quora-checkout --name pipeline_quora
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# Run as scripts (python benchmarks/x.py): their own folder is on sys.path.
from machine_info import describe

from qpr.evaluation.trec import MEASURE_LABELS as SHOWN

STAGES = ("cluster", "train", "export", "index", "evaluate")


def merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
    """`extra`'s keys into `into`, nested dicts merged rather than replaced."""
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value


def served_label(params: dict[str, Any]) -> str:
    """What the run serves, in a few words, from its params: the encoder, a query
    student, the companion, BM25."""
    model = params.get("model", {})
    if model.get("encoder") == "transformer":
        parts = [f"{model.get('transformer', {}).get('package', 'transformer')}"]
    else:
        parts = [f"CNN + {params['train']['loss']}"]
    student = params.get("student", {}).get("enabled")
    # auto: a student for a transformer, none for the CNN (qpr.config)
    if student is True or (student == "auto" and model.get("encoder") == "transformer"):
        parts.append(f"{params.get('student', {}).get('kind', '')} student".strip())
    index = params.get("index", {})
    if index.get("companion"):
        parts.append(f"{index['companion']} companion")
    if index.get("lexical", {}).get("enabled", True):
        parts.append("BM25")
    return ", ".join(parts)


def stage_durations(project: Path, experiment: str) -> dict[str, dict[str, Any]]:
    """Wall time of the latest FINISHED MLflow run of each stage (start → end)."""
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{project / 'mlflow.db'}")
    runs = mlflow.search_runs(
        experiment_names=[experiment],
        filter_string="attributes.status = 'FINISHED'",
        order_by=["attributes.start_time DESC"],
        output_format="list",
    )
    latest: dict[str, dict[str, Any]] = {}
    for run in runs:
        stage = run.data.tags.get("qpr.stage")
        if stage in STAGES and stage not in latest:
            latest[stage] = {
                "seconds": (run.info.end_time - run.info.start_time) / 1000.0,
                "run_id": run.info.run_id,
                "git_commit": run.data.tags.get("mlflow.source.git.commit"),
                "data_hash": run.data.tags.get("qpr.data_hash"),
            }
    return latest


def machine() -> dict[str, Any]:
    info = describe(Path(__file__).resolve().parents[1], {})
    return {"cpu": info["cpu_model"], "cores": info["cpu_count"], "python": info["python"]}


def markdown(report: dict[str, Any]) -> str:
    ev = report["evaluate"]
    lines = [
        f"# Pipeline run: {report['name']}",
        "",
        f"Data: `{report['params']['data']['source']}` at `{report['params']['data']['path']}`. "
        f"Machine: {report['machine']['cpu']}, {report['machine']['cores']} cores, no GPU. "
        f"Written {report['written']} by `benchmarks/pipeline_report.py` from the run's own "
        "metrics files and MLflow runs.",
        "",
        *([f"Run notes: {report['note']}", ""] if report.get("note") else []),
        "## Wall time per stage",
        "",
        "| stage | seconds | what it did |",
        "|---|---:|---|",
    ]
    what = {
        "cluster": lambda m: (
            f"{m['index_size']:,} questions, {m['clusters_kept']:,} clusters "
            f"kept, pairs train/val/test {m['pairs_train']:,}/{m['pairs_val']:,}/"
            f"{m['pairs_test']:,}"
        ),
        "train": lambda m: (
            f"{m['epochs']} epochs (best {m['best_epoch']}) in "
            f"{m['train_seconds']:,.0f} s of training, {m['train_pairs']:,} pairs, median "
            f"{m['pairs_per_s']:,.0f} pairs/s, {m['parameters']:,} parameters"
        ),
        "export": lambda m: f"parity: max abs diff torch vs ONNX {m['parity_max_abs_diff']:.1e}",
        "index": lambda m: (
            f"{m['questions']:,} vectors at {m['questions_per_s']:,.0f} "
            f"questions/s, "
            + (
                f"nlist {m['nlist']}, nprobe {m['nprobe']}"
                if m.get("nlist")
                else f"HNSW efSearch {m.get('ef_search', '?')}"
            )
            + f", self-retrieval {m['self_retrieval_rate']:.3f}"
        ),
        "evaluate": lambda m: (
            f"{m['num_queries']:,.0f} test queries, "
            f"{m['query_ms']:.2f} ms a query (batched encode + search)"
        ),
    }
    total = 0.0
    for stage in STAGES:
        seconds = report["durations"].get(stage, {}).get("seconds")
        metrics = report["metrics"].get(stage, {})
        total += seconds or 0.0
        shown = f"{seconds:,.0f}" if seconds is not None else "n/a"
        lines.append(f"| {stage} | {shown} | {what[stage](metrics) if metrics else ''} |")
    lines += [
        f"| **total** | **{total:,.0f}** | |",
        "",
        "Seconds are the stage's MLflow run, start to end (Prefect start-up of ~10 s per stage "
        "process comes on top). A train stage that resumed a finished run takes seconds; its "
        "training time is in the last column.",
        "",
    ]
    lines += [
        f"## Test split ({ev['num_queries']:,.0f} queries, "
        f"top {report['params']['evaluate']['k']})",
        "",
        "P@N is trec_eval's success@N (a paraphrase among the first N), as in the paper.",
        "",
        "| system | " + " | ".join(SHOWN.values()) + " |",
        "|---|" + "---:|" * len(SHOWN),
    ]
    rows = {f"served ({served_label(report['params'])})": ev}
    rows.update(ev.get("baselines", {}))
    for name, values in rows.items():
        lines.append(f"| {name} | " + " | ".join(f"{values[m]:.4f}" for m in SHOWN) + " |")
    threshold = ev.get("threshold") or {}

    def fmt(value: Any) -> str:
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    lines += [
        "",
        f"Validation (model): P@1 {ev['val']['success_1']:.4f}, P@10 "
        f"{ev['val']['success_10']:.4f}, MRR {ev['val']['recip_rank']:.4f}.",
        "",
        "No-answer threshold (squared L2 distance) chosen on validation for P@1 ≥ "
        f"{threshold.get('target_precision')} and at most "
        f"{fmt(threshold.get('max_false_answer_rate'))} false answers: "
        f"{fmt(threshold.get('value'))} (rule {threshold.get('rule')}); on test it "
        f"answers {fmt(threshold.get('test_answered_share'))} of the answerable queries with "
        f"P@1 {fmt(threshold.get('test_precision_at_1'))}, and "
        f"{fmt(threshold.get('test_false_answer_rate'))} of those with no paraphrase.",
        "",
        *[f"**WARNING**: {warning}." for warning in threshold.get("warnings") or []],
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--project", type=Path, default=Path("."))
    parser.add_argument("--name", required=True, help="report file stem under --out")
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument(
        "--note", default="", help="how the run went (interruptions, load), shown verbatim"
    )
    args = parser.parse_args()

    import yaml

    project = args.project.resolve()
    params = yaml.safe_load((project / "params.yaml").read_text())
    metrics = {
        stage: json.loads((project / "metrics" / f"{stage}.json").read_text())
        for stage in STAGES[:-1]
        if (project / "metrics" / f"{stage}.json").is_file()
    }
    metrics["evaluate"] = json.loads((project / "metrics.json").read_text())
    # Each stage's seconds and rates live apart (metrics/timings/), out of `dvc metrics diff`.
    for stage in STAGES:
        timings = project / "metrics" / "timings" / f"{stage}.json"
        if timings.is_file():
            merge(metrics.setdefault(stage, {}), json.loads(timings.read_text()))
    report = {
        "name": args.name,
        "written": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "params": params,
        "durations": stage_durations(project, params["mlflow"]["experiment"]),
        "metrics": metrics,
        "evaluate": metrics["evaluate"],
        "note": args.note,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (args.out / f"{args.name}.md").write_text(markdown(report))
    print(f"wrote {args.out / args.name}.json and .md")


if __name__ == "__main__":
    main()
