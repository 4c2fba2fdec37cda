"""`qpr data ...`: synthetic logs (daily and at scale) and the raw-log gate's check."""

from typer.testing import CliRunner

from qpr.cli import app

runner = CliRunner()


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
