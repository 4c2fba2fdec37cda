"""Recovery on its own: a killed cycle's MLflow run is closed as FAILED at the next start,
even when the cycle died before its journal existed; the scheduled recovery flow stands
aside while a cycle holds the lock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from flows.retrain import close_orphan_run, recover_flow
from qpr.config import load_settings, settings_from_dict
from qpr.ops.layout import RetrainLayout, RetrainLock
from tests.conftest import tiny_overrides


@pytest.fixture
def params(tmp_path: Path) -> Path:
    """A retraining project's params.yaml: data/logs versioned by a data.dvc."""
    tree = tiny_overrides(tmp_path)
    tree["data"]["path"] = "data/logs"
    (tmp_path / "data" / "logs").mkdir(parents=True)
    (tmp_path / "data.dvc").write_text("outs:\n- md5: aaa.dir\n  path: data\n")
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(settings_from_dict(tree).model_dump(mode="json")))
    return path


def _layout(params: Path) -> RetrainLayout:
    return RetrainLayout.from_settings(load_settings(params), params.parent)


def test_the_next_start_closes_a_killed_cycles_run_as_failed(params: Path):
    client = MlflowClient()
    experiment = client.get_experiment_by_name("qpr-recover-tests")
    experiment_id = (
        experiment.experiment_id if experiment else client.create_experiment("qpr-recover-tests")
    )
    run_id = client.create_run(experiment_id).info.run_id  # RUNNING, as a SIGKILL leaves it
    layout = _layout(params)
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    layout.active_run.write_text(json.dumps({"mlflow_run_id": run_id, "run": "x"}))
    assert not layout.journal.exists()  # killed before its journal was written

    assert close_orphan_run(layout) == run_id

    run = client.get_run(run_id)
    assert run.info.status == "FAILED"
    assert "killed" in run.data.tags["qpr.retrain.outcome"]
    assert not layout.active_run.exists()
    assert close_orphan_run(layout) is None  # nothing left: idempotent


def test_scheduled_recovery_stands_aside_while_a_cycle_runs(params: Path):
    layout = _layout(params)
    with RetrainLock(layout.lock):
        summary = recover_flow.fn(params=str(params))
    assert summary["outcome"] == "busy"
