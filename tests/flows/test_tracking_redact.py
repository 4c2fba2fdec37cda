"""No credential reaches what a retraining run writes: MLflow tags and params (the retrain
flow opens its run with scrub=redact_tree), and the summary report on disk and in the
run's artifacts."""

from __future__ import annotations

import json
from pathlib import Path

from mlflow.tracking import MlflowClient

from flows import tracking
from flows.retrain import record_summary
from qpr.config import settings_from_dict
from qpr.redact import redact_tree
from tests.conftest import tiny_overrides

TOKEN = "tok-5ecret-4f9a1c"
PASSWORD = "pa55-w0rd-77"


def test_a_planted_secret_is_in_no_tag_param_or_report(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("QPR_TEST_API_TOKEN", TOKEN)  # the name says secret: its value is one
    tree = tiny_overrides(tmp_path, mlflow={"experiment": "qpr-redact-tests"})
    tree["retrain"] = {"incoming": f"incoming/{TOKEN}"}  # a credential in a path, say
    settings = settings_from_dict(tree)
    uri = f"https://bob:{PASSWORD}@mlflow.internal/"
    summary = {
        "run": "20261015T030000Z",
        "outcome": "failed",
        "quarantined": [],
        "error": f"RegistryError: MLflow: cannot reach {uri} (token {TOKEN})",
        "register": {"version": 3, "promoted": 0, "reason": f"champion at {uri}"},
    }
    summary_file = tmp_path / "runs" / "summary.json"
    summary_file.parent.mkdir(parents=True)

    with tracking.stage_run("retrain", settings, root=tmp_path, scrub=redact_tree) as run:
        record_summary(summary, summary_file, tmp_path / "repro.log")

    client = MlflowClient()
    data = client.get_run(run.info.run_id).data
    logged = tmp_path / "downloaded"
    logged.mkdir()
    client.download_artifacts(run.info.run_id, "retrain", str(logged))
    written = [
        json.dumps(data.tags),
        json.dumps(data.params),
        summary_file.read_text(),
        *(p.read_text() for p in logged.rglob("*.json")),
    ]
    assert any("***" in text for text in written)
    for text in written:
        assert TOKEN not in text and PASSWORD not in text
