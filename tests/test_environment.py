"""The shared environment: quiet logging by default, QPR_LOG_LEVEL for the rest, and the
Prefect UI address that run logs link to."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from qpr import environment


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for key in [
        environment.LOG_LEVEL_VARIABLE,
        "PREFECT_API_URL",
        "PREFECT_UI_URL",
        *environment.logging_defaults(None),
        *environment.logging_defaults("INFO"),
    ]:
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def test_quiet_by_default_keeps_the_run_loggers_at_info(clean_env: pytest.MonkeyPatch) -> None:
    assert environment.log_level() is None
    wanted = environment.logging_defaults(None)
    assert wanted["PREFECT_LOGGING_LEVEL"] == "WARNING"
    assert wanted["PREFECT_LOGGING_LOGGERS_PREFECT_TASK_RUNS_LEVEL"] == "INFO"
    assert wanted["MLFLOW_LOGGING_LEVEL"] == "WARNING"


def test_qpr_log_level_brings_the_rest_back(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv(environment.LOG_LEVEL_VARIABLE, "debug")
    assert environment.log_level() == "DEBUG"
    assert environment.logging_defaults("DEBUG")["PREFECT_LOGGING_LEVEL"] == "DEBUG"
    clean_env.setenv(environment.LOG_LEVEL_VARIABLE, "loud")
    assert environment.log_level() is None  # not a level: quiet, no crash


def test_set_log_level_overrides_applied_quiet_defaults(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import os

    environment.apply(tmp_path)
    assert os.environ["PREFECT_LOGGING_LEVEL"] == "WARNING"
    environment.set_log_level("info")
    assert os.environ["PREFECT_LOGGING_LEVEL"] == "INFO"
    assert "PREFECT_LOGGING_LOGGERS_PREFECT_TASK_RUNS_LEVEL" not in os.environ
    with pytest.raises(ValueError, match="log level"):
        environment.set_log_level("loud")


def test_run_links_point_at_the_ui_unless_a_server_is_shared(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert environment.local_defaults(tmp_path)["PREFECT_UI_URL"] == "http://127.0.0.1:4200"
    clean_env.setenv("PREFECT_API_URL", "http://prefect.team:4200/api")
    assert "PREFECT_UI_URL" not in environment.local_defaults(tmp_path)


def test_quiet_loggers_drop_chatter_but_keep_progress_and_warnings(
    clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    environment.quiet_loggers()
    chatty = logging.getLogger("bm25s")
    chatty.setLevel(logging.DEBUG)  # as bm25s does when imported, after the filter
    runs = logging.getLogger("prefect.task_runs")
    with caplog.at_level(logging.DEBUG):
        chatty.debug("Building index from tokens")
        chatty.warning("a real warning")
        runs.info("cluster: writing 406 clusters")
        runs.info("Finished in state Completed()")
    assert [r.getMessage() for r in caplog.records] == [
        "a real warning",
        "cluster: writing 406 clusters",
    ]
    clean_env.setenv(environment.LOG_LEVEL_VARIABLE, "DEBUG")
    environment.quiet_loggers()  # verbose: nothing dropped
    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        chatty.debug("Building index from tokens")
        runs.info("Finished in state Completed()")
    assert len(caplog.records) == 2
    clean_env.delenv(environment.LOG_LEVEL_VARIABLE)
    environment.quiet_loggers()  # as flows/ leaves them


def test_an_experiment_copy_keeps_its_runs_in_the_project(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`dvc exp run --temp` runs in .dvc/tmp/exps/standalone/tmpXXXX: its MLflow runs and
    registry versions must land in the project's store, not in a copy deleted after it."""
    project = tmp_path / "project"
    copy = project / ".dvc" / "tmp" / "exps" / "standalone" / "tmpab12"
    copy.mkdir(parents=True)
    (copy / "params.yaml").write_text("seed: 1\n", encoding="utf-8")
    (project / "params.yaml").write_text("seed: 1\n", encoding="utf-8")
    root = environment.project_root(copy)
    assert root == copy  # the experiment reads its own params and writes its own outputs
    local = environment.local_defaults(root)
    assert local["MLFLOW_TRACKING_URI"] == f"sqlite:///{project / 'mlflow.db'}"
    assert local["QPR_MLFLOW_ARTIFACTS"] == (project / "mlruns").as_uri()
    assert local["PREFECT_HOME"] == str(project / ".prefect")
    assert environment.state_root(project) == project
