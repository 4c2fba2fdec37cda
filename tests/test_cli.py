"""The qpr command reads like documentation: every stage and user task is a sub-command
with help text."""

import json
import os

from typer.testing import CliRunner

from qpr.cli import app

runner = CliRunner()


def test_top_level_help_lists_every_command():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in (
        "data",
        "cluster",
        "train",
        "export",
        "index",
        "evaluate",
        "search",
        "pipeline",
        "metrics",
        "ui",
    ):
        assert command in result.output


def test_data_help_lists_its_tasks():
    result = runner.invoke(app, ["data", "--help"])
    assert result.exit_code == 0
    for command in ("synth", "check", "ensure"):
        assert command in result.output


def test_synth_bad_day_is_a_clear_error(tmp_path):
    result = runner.invoke(app, ["data", "synth", "--out", str(tmp_path), "--day", "tomorrow"])
    assert result.exit_code == 1 and "YYYY-MM-DD" in result.output


def test_synth_one_day_then_check_it(tmp_path):
    out = tmp_path / "logs"
    made = runner.invoke(app, ["data", "synth", "--out", str(out), "--day", "2026-11-02"])
    assert made.exit_code == 0, made.output
    assert (out / "2026-11-02.jsonl").is_file()
    checked = runner.invoke(app, ["data", "check", str(out)])
    assert checked.exit_code == 0, checked.output
    assert "gate passed" in checked.output


def test_check_on_a_file_that_is_not_a_log(tmp_path):
    path = tmp_path / "sales.csv"
    path.write_text("a,b\n1,2\n")
    result = runner.invoke(app, ["data", "check", str(path)])
    assert result.exit_code == 1 and "not a QA log" in result.output


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


def test_data_scale_writes_shards_the_loader_reads(tmp_path):
    out = tmp_path / "scale"
    made = runner.invoke(
        app, ["data", "scale", "--questions", "3k", "--out", str(out), "--shard-rows", "1000"]
    )
    assert made.exit_code == 0, made.output
    assert "3,000 questions in 3 shards" in made.output
    checked = runner.invoke(app, ["data", "check", str(out)])
    assert checked.exit_code == 0, checked.output


def test_data_scale_refuses_a_bad_count(tmp_path):
    result = runner.invoke(app, ["data", "scale", "--questions", "lots", "--out", str(tmp_path)])
    assert result.exit_code != 0 and "not a count" in result.output


def test_search_json_hits_have_the_service_field_names(tmp_path):
    from qpr.retrieval.bundle import HIT_FIELDS
    from tests.serve.test_app import QIDS, QUESTIONS, build_bundle

    models = build_bundle(tmp_path / "models", QUESTIONS, QIDS)
    args = ["search", QUESTIONS[7], "-k", "3", "--models-dir", str(models), "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    hits = json.loads(result.output)["hits"]
    assert [tuple(h) for h in hits] == [HIT_FIELDS] * 3
    assert (hits[0]["question_id"], hits[0]["answer_id"]) == (QIDS[7], "ans-3")
    explained = runner.invoke(app, [*args, "--explain"])
    assert explained.exit_code == 0, explained.output
    part = json.loads(explained.output)["hits"][0]["explain"]
    assert part["fused_score"] == hits[0]["score"] and part["dense_weight"] == 1.0
    table = runner.invoke(app, ["search", QUESTIONS[7], "--models-dir", str(models), "--explain"])
    assert table.exit_code == 0, table.output
    assert "ans-3" in table.output and "matched" in table.output


def test_evaluate_refuses_bad_model_references(tmp_path):
    data = tmp_path / "pairs.tsv"
    data.write_text("id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n")
    base = ["evaluate", "--data", str(data), "--out", str(tmp_path / "out")]

    def said(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, [*base, *args])
        return result.exit_code, " ".join(result.output.split())

    code, text = said("--model", "qpr@champion")
    assert code == 1 and "--model qpr@champion: expected models:/<name>@<alias>" in text
    code, text = said("--model", "models:/a/b@champion")
    assert code == 1 and "expected models:/<name>@<alias>" in text
    code, text = said("--model", "models:/no-such-model@champion")
    assert code == 1 and "--model models:/no-such-model@champion:" in text
    code, text = said("--model", "models:/qpr", "--models-dir", str(tmp_path))
    assert code == 1 and "--model and --models-dir name two bundles" in text
    result = runner.invoke(app, ["evaluate", "--model", "models:/qpr"])
    assert (
        result.exit_code == 1 and "--model" in result.output and "--data FILE only" in result.output
    )


def test_retrain_passes_the_flow_exit_code_through(monkeypatch, tmp_path):
    import qpr.cli

    monkeypatch.setattr(qpr.cli, "_run_flow", lambda *args: 3)  # every file quarantined
    result = runner.invoke(app, ["retrain", "--params", str(tmp_path / "params.yaml")])
    assert result.exit_code == 3


def test_a_forced_promotion_needs_a_reason(tmp_path):
    result = runner.invoke(app, ["model", "promote", "3", "--force"])
    assert result.exit_code == 1
    assert "--force needs a --reason" in result.output


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


def test_verbose_brings_every_log_line_back_in_child_processes(monkeypatch, tmp_path):
    from qpr import environment

    monkeypatch.delenv(environment.LOG_LEVEL_VARIABLE, raising=False)
    for key in environment.logging_defaults(None):
        monkeypatch.setenv(key, "WARNING")  # as apply() left them: setenv restores them
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "train.json").write_text('{"epochs": 3}')
    result = runner.invoke(
        app, ["--verbose", "metrics", "--metrics-dir", str(tmp_path / "metrics")]
    )
    assert result.exit_code == 0, result.output
    assert os.environ[environment.LOG_LEVEL_VARIABLE] == "INFO"
    assert os.environ["PREFECT_LOGGING_LEVEL"] == "INFO"
    monkeypatch.delenv(environment.LOG_LEVEL_VARIABLE)


def test_ui_help_names_both_uis():
    result = runner.invoke(app, ["ui", "--help"])
    assert result.exit_code == 0, result.output
    assert "Prefect" in result.output and "MLflow" in result.output


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


def test_search_filter_flag(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from qpr.cli import parse_filters
    from tests.serve.test_app import QIDS, QUESTIONS, build_bundle

    models = build_bundle(tmp_path / "models", QUESTIONS, QIDS)
    table = pq.read_table(models / "index" / "questions.parquet")
    locales = [("en", "de")[i % 2] for i in range(table.num_rows)]
    pq.write_table(table.append_column("locale", pa.array(locales)),
                   models / "index" / "questions.parquet")  # fmt: skip
    args = ["search", QUESTIONS[7], "-k", "5", "--models-dir", str(models), "--json"]
    result = runner.invoke(
        app, [*args, "--filter", "locale=en", "--filter", "answer_id=ans-2,ans-4"]
    )
    assert result.exit_code == 0, result.output
    hits = json.loads(result.output)["hits"]
    assert hits and all(QIDS.index(h["question_id"]) % 2 == 0 for h in hits)
    assert {h["answer_id"] for h in hits} <= {"ans-2", "ans-4"}
    unknown = runner.invoke(app, [*args, "--filter", "tenant=a"])
    assert unknown.exit_code != 0 and "answer_id, locale" in " ".join(unknown.output.split())
    assert parse_filters(["locale=en", "tenant=a, b"]) == {"locale": "en", "tenant": ["a", "b"]}
    for bad in (["locale"], ["=en"], ["locale=en", "locale=de"]):
        refused = runner.invoke(app, [*args, *(f"--filter={b}" for b in bad)])
        assert refused.exit_code != 0, bad


def test_index_add_then_delete_serves_fresh_questions_at_once(tmp_path):
    from tests.serve.test_app import QIDS, QUESTIONS, build_bundle

    models = build_bundle(tmp_path / "models", QUESTIONS, QIDS)
    logs = tmp_path / "logs"
    made = runner.invoke(app, ["data", "synth", "--out", str(logs), "--day", "2026-11-02"])
    assert made.exit_code == 0, made.output
    listed = tmp_path / "new.txt"
    listed.write_text(f"how do i descale my espresso machine\n{QUESTIONS[0]}\n")

    added = runner.invoke(
        app,
        ["index", "add", str(logs / "2026-11-02.jsonl"), str(listed), "--models-dir", str(models)],
    )
    assert added.exit_code == 0, added.output
    out = json.loads(added.output)
    assert out["files"] == 2 and out["added"] >= 1  # QUESTIONS[0] is served already
    again = runner.invoke(app, ["index", "add", str(listed), "--models-dir", str(models)])
    assert json.loads(again.output)["files"] == 0  # the same file is not added twice

    args = ["search", "how do i descale my espresso machine", "-k", "1", "--models-dir"]
    hit = json.loads(runner.invoke(app, [*args, str(models), "--json"]).output)["hits"][0]
    assert hit["distance"] == 0.0
    deleted = runner.invoke(
        app,
        ["index", "delete", "--question-id", str(hit["question_id"]), "--models-dir", str(models)],
    )
    assert deleted.exit_code == 0, deleted.output
    after = json.loads(runner.invoke(app, [*args, str(models), "--json"]).output)["hits"][0]
    assert after["question_id"] != hit["question_id"]
    assert runner.invoke(app, ["index", "delete", "--models-dir", str(models)]).exit_code == 1
    assert "published" in out  # not a DVC project, no champion: said, not failed
    assert out["published"]["dvc"].startswith("not the models/ of a DVC project")

    dropped = runner.invoke(
        app, ["index", "drop", "1", "--reason", "bad file", "--models-dir", str(models), "--local"]
    )
    assert dropped.exit_code == 0, dropped.output
    assert json.loads(dropped.output)["dropped"] == 1 and "published" not in dropped.output
    gone = json.loads(runner.invoke(app, [*args, str(models), "--json"]).output)["hits"][0]
    assert gone["text"] != "how do i descale my espresso machine"
    again = runner.invoke(app, ["index", "drop", "1", "--models-dir", str(models), "--local"])
    assert again.exit_code == 1 and "no delta 1" in again.output
    listed = runner.invoke(app, ["index", "list", "--models-dir", str(models)])
    assert listed.exit_code == 0 and "dropped" in listed.output
    manifest = json.loads(
        runner.invoke(app, ["index", "list", "--json", "--models-dir", str(models)]).output
    )
    assert manifest["dropped"][0]["number"] == 1 and manifest["absorbed_version"] == 0


def test_index_help_names_the_stage_and_the_delta_commands():
    result = runner.invoke(app, ["index", "--help"])
    assert result.exit_code == 0
    assert all(word in result.output for word in ("Stage 4", "add", "delete", "drop", "compact"))
