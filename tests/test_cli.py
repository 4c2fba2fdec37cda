"""The qpr command reads like documentation: every stage and user task is a sub-command
with help text."""

import os

from typer.testing import CliRunner

from qpr.cli import app

runner = CliRunner()


def test_top_level_help_lists_every_command():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in (
        "data",
        "model",
        "cluster",
        "train",
        "export",
        "index",
        "student",
        "rerank",
        "evaluate",
        "register",
        "search",
        "serve",
        "pipeline",
        "retrain",
        "metrics",
        "experiments",
        "ui",
    ):
        assert command in result.output
    said = " ".join(result.output.split())
    assert "index → student → rerank → evaluate → register" in said
    assert "validation MRR" in said and "ROC AUC" not in said


def test_python_m_qpr_cli_is_the_command():
    """Tests and benchmarks start the service as `python -m qpr.cli serve`."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "qpr.cli", "search", "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "paraphrases" in done.stdout


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
