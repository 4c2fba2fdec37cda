"""tests.session_experiment: a test's experiment is active inside, the caller's after."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

import mlflow

from tests.session_experiment import session_experiment


def test_the_experiment_is_active_inside_and_the_callers_after(isolated_tracking: Path):
    caller = mlflow.set_experiment("qpr-session-experiment-caller").experiment_id
    variable = os.environ.get("MLFLOW_EXPERIMENT_ID")

    with session_experiment("qpr-session-experiment-inner") as inner:
        assert inner != caller
        assert mlflow.get_experiment(inner).name == "qpr-session-experiment-inner"
        with mlflow.start_run() as run:
            assert run.info.experiment_id == inner
        # Its artifacts are in the session's store, not under the checkout's ./mlruns.
        location = Path(urlparse(mlflow.get_experiment(inner).artifact_location).path)
        assert location.is_relative_to(isolated_tracking)

    with mlflow.start_run() as run:
        assert run.info.experiment_id == caller
    assert os.environ.get("MLFLOW_EXPERIMENT_ID") == variable
