"""The pipeline's commands: the stages, retraining, the metrics tables, the UIs."""

import json

from typer.testing import CliRunner

from qpr.cli import app

runner = CliRunner()


def test_metrics_prints_strings_nulls_and_numbers(tmp_path):
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    (metrics / "register.json").write_text(
        '{"version": 3, "promoted": false, "reason": "within margin", "champion_value": null,'
        ' "challenger_value": 0.8125}'
    )
    result = runner.invoke(app, ["metrics", "--metrics-dir", str(metrics)])
    assert result.exit_code == 0, result.output
    assert "within margin" in result.output and "0.8125" in result.output


def test_metrics_shows_the_fused_model_beside_its_encoder_alone(tmp_path):
    (tmp_path / "metrics").mkdir()
    measures = {"success_1": 0.75, "success_10": 0.9, "recip_rank": 0.8}
    evaluation = {
        **measures,
        "num_queries": 10,
        "baselines": {"bm25": {**measures, "success_1": 0.7}},
        "fusion": {"dense_weight": 0.3, "dense_test": {**measures, "success_1": 0.625}},
    }
    (tmp_path / "metrics.json").write_text(json.dumps(evaluation))
    result = runner.invoke(app, ["metrics", "--metrics-dir", str(tmp_path / "metrics")])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any("dense" in line and "0.6250" in line for line in lines)
    assert any("model" in line and "0.7500" in line for line in lines)
    text = " ".join(result.output.split())  # the console wraps long lines
    assert "fused at α 0.3, chosen on validation: both fused" in text


def test_metrics_rounds_the_no_answer_threshold_for_people(tmp_path):
    (tmp_path / "metrics").mkdir()
    measures = {"success_1": 0.75, "success_10": 0.9, "recip_rank": 0.8, "num_queries": 10}
    threshold = {
        "value": 2.9205896854400635,
        "target_precision": 0.95,
        "test_answered_share": 0.7379,
        "test_precision_at_1": 0.9978768577494692,
        "test_false_answer_rate": None,
    }
    (tmp_path / "metrics.json").write_text(json.dumps({**measures, "threshold": threshold}))
    result = runner.invoke(app, ["metrics", "--metrics-dir", str(tmp_path / "metrics")])
    assert result.exit_code == 0, result.output
    assert "threshold 2.9206" in result.output and "P@1 0.9979" in result.output
    assert "73.8%" in result.output and "0.99787" not in result.output


def test_metrics_summary_is_the_evaluation_table_and_the_decision(tmp_path):
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    measures = {"success_1": 0.75, "success_10": 0.9, "recip_rank": 0.8, "num_queries": 10}
    (tmp_path / "metrics.json").write_text(json.dumps(measures))
    (metrics / "cluster.json").write_text('{"clusters_kept": 400}')
    (metrics / "register.json").write_text('{"version": 2, "reason": "champion kept"}')
    result = runner.invoke(app, ["metrics", "--metrics-dir", str(metrics), "--summary"])
    assert result.exit_code == 0, result.output
    assert "0.7500" in result.output and "version 2: champion kept" in result.output
    assert "clusters_kept" not in result.output


def test_retrain_passes_the_flow_exit_code_through(monkeypatch, tmp_path):
    from qpr.cli import stages

    monkeypatch.setattr(stages, "run_flow", lambda *args: 3)  # every file quarantined
    result = runner.invoke(app, ["retrain", "--params", str(tmp_path / "params.yaml")])
    assert result.exit_code == 3


def test_ui_help_names_both_uis():
    result = runner.invoke(app, ["ui", "--help"])
    assert result.exit_code == 0, result.output
    assert "Prefect" in result.output and "MLflow" in result.output


def test_every_dvc_stage_is_a_command_that_runs_its_flow(monkeypatch, tmp_path):
    """`qpr STAGE` runs `python -m flows.stage STAGE`, as dvc.yaml does, then prints the
    stage's metrics; a failed flow is exit 1."""
    import yaml

    from qpr.cli import common
    from qpr.paths import ProjectPaths
    from tests.conftest import REPO_ROOT

    stages = list(yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"])
    params = tmp_path / "params.yaml"
    ran = []

    def flow(module: str, *args: str) -> int:
        ran.append((module, *args))
        metrics = ProjectPaths(tmp_path).stage_metrics(args[0])
        metrics.parent.mkdir(parents=True, exist_ok=True)
        metrics.write_text(json.dumps({"num_queries": 12345}))
        return 0

    monkeypatch.setattr(common, "run_flow", flow)
    for stage in stages:
        result = runner.invoke(app, [stage, "--params", str(params)])
        assert result.exit_code == 0, (stage, result.output)
        assert "12,345" in result.output, stage
    assert ran == [("flows.stage", s, "--params", str(params.resolve())) for s in stages]
    assert len(stages) == 8

    monkeypatch.setattr(common, "run_flow", lambda *args: 1)
    assert runner.invoke(app, ["student", "--params", str(params)]).exit_code == 1
