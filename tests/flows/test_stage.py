"""The cluster stage as a Prefect flow, end to end on tiny synthetic logs, with its MLflow run."""

from __future__ import annotations

import json

import mlflow
import pandas as pd
import pytest

pytestmark = pytest.mark.slow


def test_cluster_flow_writes_outputs_and_logs_an_mlflow_run(prefect_harness, tiny_params_file):
    from flows.stage import stage_flow
    from qpr.io import split_timings

    cluster_flow = stage_flow("cluster")

    root = tiny_params_file.parent
    metrics = cluster_flow(params=str(tiny_params_file))

    out = root / "artifacts" / "cluster"
    questions = pd.read_parquet(out / "questions.parquet")
    pairs = pd.read_parquet(out / "pairs.parquet")
    assert metrics["index_size"] == len(questions)
    assert metrics["pairs_train"] == int((pairs["split"] == "train").sum()) > 0
    assert metrics["clusters_dropped_incoherent"] > 0  # generic answers are filtered
    on_disk = json.loads((root / "metrics" / "cluster.json").read_text())
    stable, timings = split_timings(metrics)  # the phases' times go outside DVC's metrics
    assert on_disk == json.loads(json.dumps(stable))
    assert set(timings) >= {"clean_seconds", "merge_seconds", "write_seconds"}
    assert (root / "plots" / "cluster" / "coherence.png").stat().st_size > 0

    runs = mlflow.search_runs(experiment_names=["qpr-tests"], output_format="list")
    run = next(r for r in runs if r.data.tags.get("qpr.stage") == "cluster")
    assert run.info.status == "FINISHED"
    assert run.data.params["cluster.coherence_threshold"] == "0.1"
    assert run.data.metrics["index_size"] == metrics["index_size"]
    for tag in ("mlflow.source.git.commit", "qpr.data_hash", "prefect.flow_run_id"):
        assert run.data.tags.get(tag)
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id)}
    assert {"gates", "metrics", "plots", "cluster"} <= artifacts


def test_failing_gate_stops_the_flow_and_writes_nothing(prefect_harness, tiny_params_file):
    from flows.stage import stage_flow

    cluster_flow = stage_flow("cluster")
    from qpr.quality.gate import GateFailed

    root = tiny_params_file.parent
    # A bad batch: most questions of one day's file blanked out.
    day = sorted((root / "data" / "logs").glob("*.jsonl"))[0]
    rows = [json.loads(line) for line in day.read_text().splitlines()]
    for row in rows:
        row["question"] = ""
    day.write_text("".join(json.dumps(r) + "\n" for r in rows))

    with pytest.raises(GateFailed, match="question"):
        cluster_flow(params=str(tiny_params_file))
    assert not (root / "artifacts" / "cluster").exists()
    assert (root / "reports" / "gates" / "cluster" / "raw_logs.json").is_file()
    runs = mlflow.search_runs(experiment_names=["qpr-tests"], output_format="list")
    assert any(r.info.status == "FAILED" for r in runs)


def test_logs_too_small_fail_in_one_line_without_a_traceback(
    prefect_harness, tiny_params_file, capsys
):
    import logging
    import shutil
    from pathlib import Path

    import yaml

    from flows.stage import QuietExpectedErrors, run_cli, stage_flow

    root = tiny_params_file.parent
    logs = root / "data" / "logs"
    shutil.rmtree(logs)
    logs.mkdir()
    shutil.copy(Path(__file__).parents[2] / "examples" / "my_logs.csv", logs)
    params = yaml.safe_load(tiny_params_file.read_text())
    params["quality"]["split_ratio_tolerance"] = 0.05  # params.yaml's (the tiny one allows 8)
    tiny_params_file.write_text(yaml.safe_dump(params))
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    loggers = [logging.getLogger(name) for name in QuietExpectedErrors.LOGGERS]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        with pytest.raises(SystemExit) as stopped:
            run_cli(stage_flow("cluster"), params=str(tiny_params_file))
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    assert stopped.value.code == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("ERROR: too little data to train on")
    assert "40 questions in 8 paraphrase clusters" in err and "at least 14 clusters" in err
    assert "\n" not in err and "Traceback" not in err
    assert records and not any(r.exc_info for r in records)
    assert not any(r.getMessage().startswith("Finished in state Failed") for r in records)
    assert not (root / "artifacts" / "cluster").exists()
