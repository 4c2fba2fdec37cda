"""The pipeline's commands: one a stage (`qpr cluster` … `qpr register`, each its flow as
`dvc repro` runs it), the whole run, one retraining cycle, the metrics, and the UIs over
the runs. `qpr evaluate` is in `evaluate_file.py`: it also evaluates any file."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from qpr import environment
from qpr.cli.common import (
    ParamsOption,
    console,
    fail,
    print_metrics,
    run_flow,
    run_stage,
    with_timings,
)


def cluster(params: ParamsOption = Path("params.yaml")) -> None:
    """Stage 1: cluster questions (answers or duplicate pairs), filter incoherent clusters,
    split 80:10:10 by cluster, generate positive pairs. Gated; logged to MLflow."""
    print_metrics({"cluster": run_stage("cluster", params)})


def train(params: ParamsOption = Path("params.yaml")) -> None:
    """Stage 2: train the encoder model.encoder names (the paper's CNN with its vocabulary and
    SDML loss; the packaged transformer ships trained: train.max_epochs 0); early stopping
    on validation MRR (train.monitor), a checkpoint every epoch, resumes after a kill."""
    print_metrics({"train": run_stage("train", params)})


def export(params: ParamsOption = Path("params.yaml")) -> None:
    """Stage 3: export the encoder to ONNX; gate on torch-vs-ONNX parity and padding
    invariance."""
    print_metrics({"export": run_stage("export", params)})


def student(params: ParamsOption = Path("params.yaml")) -> None:
    """Stage 5: with student.enabled, train a query-only encoder into the index's vector
    space and export it; queries then go through it. On for model.encoder transformer (the
    default), off for cnn."""
    print_metrics({"student": run_stage("student", params)})


def rerank(params: ParamsOption = Path("params.yaml")) -> None:
    """Stage 6: with rerank.enabled, train a cross-encoder on the training pairs with BM25
    hard negatives and export it; the service re-ranks its top hits with it. Off by
    default."""
    print_metrics({"rerank": run_stage("rerank", params)})


def evaluate_stage(params: Path) -> None:
    """Stage 7 (`qpr evaluate` without a file): the stage's flow, then its table."""
    print_results(run_stage("evaluate", params))


def register(params: ParamsOption = Path("params.yaml")) -> None:
    """Stage 8: register the evaluated bundle as a registry version; it becomes champion
    only if it beats the champion on validation by registry.margin."""
    print_metrics({"register": run_stage("register", params)})


def pipeline(
    force: Annotated[bool, typer.Option(help="Rerun every stage, changed or not.")] = False,
) -> None:
    """Run every stage that changed, in order (`dvc repro`), then print the metrics."""
    environment.apply()
    command = ["dvc", "repro", *(["--force"] if force else [])]
    code = subprocess.call(command)
    if code != 0:
        fail(f"`{' '.join(command)}` failed (exit {code}); see the stage output above")
    metrics()


def retrain(
    params: ParamsOption = Path("params.yaml"),
    recover_only: Annotated[
        bool,
        typer.Option(help="Only roll back (or finish) a crashed retraining run, then stop."),
    ] = False,
) -> None:
    """Run one retraining cycle now: new log files in retrain.incoming are validated (a bad
    one is quarantined with its report), merged into data/ without duplicates, versioned
    (dvc add), and `dvc repro` retrains; the register stage promotes the new model only if
    it is better. Safe to rerun: nothing new, nothing changes. Scheduled: `python -m
    flows.retrain --serve` or the prefect.yaml deployment (README). Exit codes: 0 done,
    1 failed (rolled back), 3 every new file was quarantined (docs/operations.md)."""
    args = ["--params", str(params.resolve())] + (["--recover-only"] if recover_only else [])
    code = run_flow("flows.retrain", *args)
    if code != 0:
        raise typer.Exit(code)


def monitor(params: ParamsOption = Path("params.yaml")) -> None:
    """Write one monitoring report now: the service's query log (params' query_log) since
    the last report against the training questions (drift), and the "no answer" rate,
    feedback and latency, with the alarms they trip. Files in monitor.reports; the service
    shows the alarms on /metrics. Scheduled: `python -m flows.monitor --serve` or the
    prefect.yaml deployment. Exit codes: 0 no alarm, 1 failed, 3 an alarm
    (docs/operations.md)."""
    code = run_flow("flows.monitor", "--params", str(params.resolve()))
    if code != 0:
        raise typer.Exit(code)


def ui(
    prefect_port: Annotated[
        int, typer.Option(help="Port of the Prefect UI.", envvar="QPR_UI_PREFECT_PORT")
    ] = environment.PREFECT_UI_PORT,
    mlflow_port: Annotated[
        int, typer.Option(help="Port of the MLflow UI.", envvar="QPR_UI_MLFLOW_PORT")
    ] = environment.MLFLOW_UI_PORT,
) -> None:
    """See the runs: the Prefect UI (the flow runs of `make run` and `qpr retrain`) and the
    MLflow UI (runs, metrics, artifacts, registered models) over this project's records,
    both on 127.0.0.1; Ctrl-C stops both. In team mode (PREFECT_API_URL,
    MLFLOW_TRACKING_URI naming servers) it prints the shared servers' addresses."""
    import os

    from qpr.ui import serve, ui_servers

    environment.apply()
    servers = ui_servers(
        environment.project_root(), os.environ, prefect_port=prefect_port, mlflow_port=mlflow_port
    )
    raise typer.Exit(serve(servers, log=console.print))


def print_results(metrics: dict) -> None:
    """The evaluation table: the model against each baseline, test split."""
    from qpr.evaluation.trec import MEASURE_LABELS as shown

    table = Table(
        title=f"test split, {metrics.get('num_queries', 0):,.0f} queries "
        "(P@N = success@N: a paraphrase among the first N)"
    )
    table.add_column("system")
    for label in shown.values():
        table.add_column(label, justify="right")
    fusion = metrics.get("fusion")
    rows = {"model": metrics, **metrics.get("baselines", {})}
    if fusion:
        rows = {"model": metrics, "dense": fusion["dense_test"], **metrics.get("baselines", {})}
    for name, values in rows.items():
        table.add_row(name, *(f"{values.get(m, float('nan')):.4f}" for m in shown))
    console.print(table)
    if fusion:
        weight = fusion["dense_weight"]
        what = {
            1.0: "ranked by embedding distance alone"
            + (" (over both retrievers' candidates)" if fusion.get("served") else ""),
            0.0: "BM25 alone",
        }.get(weight, "both fused")
        console.print(
            f"model = dense (the encoder) and BM25 fused at α {weight:g}, chosen on "
            f"validation: {what}"
        )
        served = fusion.get("served")
        if served:
            probing = "".join(
                f"at {knob} {served[knob]}, "
                for knob in ("nprobe", "ef_search")
                if served.get(knob) is not None
            )
            console.print(
                f"served: BM25's {fusion['candidates']} and the index's "
                f"{fusion['dense_candidates']} candidates scored exactly, {probing}recall@k "
                f"{served['recall']:.4f} against an exact dense search"
                + ("" if served["reached"] else f" (BELOW the target {served['target']})")
            )
        lexical = fusion.get("lexical")
        if lexical:
            from qpr.retrieval.bm25 import describe_bm25

            console.print(
                f"lexical = the bundle's BM25 alone ({describe_bm25(lexical)}); bm25 = plain "
                "BM25 (bm25s, words as written)"
            )
    chosen = metrics.get("threshold", {})
    if chosen:
        # Rounded for people: metrics.json keeps the full figures.
        console.print(
            f"no-answer threshold {_rounded(chosen.get('value'), '.4f')} (target P@1 "
            f"{chosen.get('target_precision')}): answers "
            f"{_rounded(chosen.get('test_answered_share'), '.1%')} of test queries at P@1 "
            f"{_rounded(chosen.get('test_precision_at_1'), '.4f')}, and "
            f"{_rounded(chosen.get('test_false_answer_rate'), '.1%')} of those with no paraphrase"
        )
        for warning in chosen.get("warnings") or []:
            console.print(f"[bold red]WARNING[/]: no-answer threshold: {warning}")


def _rounded(value: object, spec: str) -> str:
    """A number as people read it ("-" when absent, as is when not a number)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return format(value, spec)
    return "-" if value is None else str(value)


def metrics(
    metrics_dir: Annotated[Path, typer.Option(help="Where stages write metrics.")] = Path(
        "metrics"
    ),
    summary: Annotated[
        bool,
        typer.Option(
            "--summary",
            help="Only the evaluation table and the registry's decision (what `make run` "
            "prints after the run).",
        ),
    ] = False,
) -> None:
    """Print every stage's metrics with its timings, and the evaluation table."""
    from qpr.artifacts import METRICS_FILE, stage_metrics_file

    files = sorted(metrics_dir.glob("*.json"))
    evaluation = metrics_dir.parent / METRICS_FILE
    if not files and not evaluation.is_file():
        fail(f"no metrics in {metrics_dir}/ yet: run `dvc repro` (or `make run`) first")
    if summary and evaluation.is_file():
        print_results(json.loads(evaluation.read_text(encoding="utf-8")))
        register_file = metrics_dir / stage_metrics_file("register")
        if register_file.is_file():
            decision = json.loads(register_file.read_text(encoding="utf-8"))
            console.print(f"registry: version {decision.get('version')}: {decision.get('reason')}")
        console.print("every stage's metrics and timings: `qpr metrics` (make metrics)")
        return
    stages = {
        file.stem: with_timings(file, metrics_dir / "timings" / file.name)
        for file in files
        if not (file.stem == "evaluate" and evaluation.is_file())  # the table below shows it
    }
    print_metrics(stages)
    if evaluation.is_file():
        print_results(json.loads(evaluation.read_text(encoding="utf-8")))
