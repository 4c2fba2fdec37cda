"""The whole pipeline as Prefect flows on a tiny configuration: every stage runs, passes
its gates, writes its outputs and logs one MLflow run; the result is searchable."""

from __future__ import annotations

import json

import mlflow
import pytest

pytestmark = pytest.mark.slow


def test_pipeline_end_to_end(prefect_harness, tiny_params_file):
    from flows.pipeline import pipeline_flow
    from flows.stage import STAGES
    from qpr.artifacts import SearchConfig
    from qpr.config import load_settings
    from qpr.retrieval.bundle import Bundle

    root = tiny_params_file.parent
    results = pipeline_flow(params=str(tiny_params_file))
    assert list(results) == list(STAGES)

    train = results["train"]
    assert train["val_mrr"] > train["untrained_val_mrr"]
    assert results["export"]["parity_max_abs_diff"] < 1e-4
    assert results["index"]["self_retrieval_rate"] >= 0.95

    evaluation = json.loads((root / "metrics.json").read_text())
    for key in ("success_1", "success_10", "recip_rank", "map", "ndcg_cut_10", "recall_20"):
        assert 0.0 <= evaluation[key] <= 1.0
    # lexical: the bundle's own (stemmed) BM25 alone, beside plain bm25
    assert set(evaluation["baselines"]) == {"bm25", "jaccard", "lexical", "untrained"}
    assert evaluation["success_1"] > evaluation["baselines"]["untrained"]["success_1"]
    run_files = sorted(p.name for p in (root / "reports" / "evaluate").glob("*.run"))
    assert run_files == [
        "test.bm25.run",
        "test.dense.run",
        "test.jaccard.run",
        "test.lexical.run",
        "test.model.run",
        "test.untrained.run",
        "val.dense.run",
        "val.lexical.run",
        "val.model.run",
    ]
    # BM25 fused in (the default): α chosen on val from the grid, where the service reads it
    fusion = evaluation["fusion"]
    assert str(fusion["dense_weight"]) in fusion["val_success_1"]
    # α: the best validation P@1 over an exact dense search; served at the chosen nprobe
    assert fusion["val_success_1"][str(fusion["dense_weight"])] == max(
        fusion["val_success_1"].values()
    )
    assert evaluation["val"]["success_1"] >= fusion["dense_val"]["success_1"]
    stored = SearchConfig.read(root / "models")
    # A corpus this small gets a flat index (qpr.retrieval.dense.fit_factory): no depth.
    depth = {"nprobe": fusion["served"]["nprobe"]} if fusion["served"]["nprobe"] else {}
    lexical = load_settings(tiny_params_file).index.lexical
    assert stored.fusion == {
        "dense_weight": fusion["dense_weight"],
        "candidates": lexical.candidates,
        "dense_candidates": 20,
        **depth,
    }
    assert fusion["served"]["reached"]
    assert (root / "plots" / "evaluate" / "fusion.png").stat().st_size > 0
    # TREC files carry ids only, never question text.
    first = (root / "reports" / "evaluate" / "test.model.run").read_text().splitlines()[0]
    assert len(first.split()) == 6 and first.split()[0].isdigit()

    runs = mlflow.search_runs(experiment_names=["qpr-tests"], output_format="list")
    stages = {r.data.tags["qpr.stage"] for r in runs if r.info.status == "FINISHED"}
    assert {"cluster", "train", "export", "index", "evaluate"} <= stages
    # One parent run for the whole flow, every stage run nested under it.
    (parent,) = [r for r in runs if r.data.tags["qpr.stage"] == "pipeline"]
    assert parent.info.run_name.startswith("pipeline ") and parent.info.status == "FINISHED"
    nested = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(r.data.tags["qpr.stage"] for r in nested) == sorted(STAGES)
    assert parent.data.metrics["test_p1"] == evaluation["success_1"]  # the headline numbers
    train_run = next(r for r in runs if r.data.tags["qpr.stage"] == "train")
    history = mlflow.MlflowClient().get_metric_history(train_run.info.run_id, "epoch/val_mrr")
    assert len(history) == train["epochs"]  # one point per epoch: the learning curve

    bundle = Bundle.load(root / "models")
    assert bundle.fusion is not None
    text = bundle.search("how tall is the eiffel tower", k=3)
    assert len(text.hits) == 3 and text.hits[0].score >= text.hits[-1].score
