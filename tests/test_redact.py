"""Credentials never leave the service: responses about itself and its log are masked."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from qpr.redact import MASK, RedactingFilter, redact, redact_tree

SECRET = "hunter2-s3cr3t"


def test_url_credentials_are_masked() -> None:
    text = f"cannot reach https://alice:{SECRET}@mlflow.example:5000/api (retries exhausted)"
    assert (
        redact(text) == f"cannot reach https://{MASK}@mlflow.example:5000/api (retries exhausted)"
    )


def test_secret_query_values_are_masked() -> None:
    text = f"GET https://h/x?run=1&access_token={SECRET}&page=2"
    assert SECRET not in redact(text) and "run=1" in redact(text) and "page=2" in redact(text)


def test_secret_environment_values_are_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SECRET)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "qpr")  # not a secret: kept
    assert redact(f"login as bob with {SECRET} to qpr") == f"login as bob with {MASK} to qpr"
    assert redact_tree({"a": [f"x{SECRET}", 3], "b": None}) == {"a": [f"x{MASK}", 3], "b": None}


def test_log_records_and_tracebacks_are_masked(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("qpr.test.redact")
    logger.addFilter(RedactingFilter())
    try:
        raise RuntimeError(f"https://u:{SECRET}@host refused")
    except RuntimeError:
        with caplog.at_level(logging.ERROR, logger="qpr.test.redact"):
            logger.exception("polling %s failed", f"https://u:{SECRET}@host")
    assert caplog.records and SECRET not in caplog.text
    assert MASK in caplog.text


def test_a_planted_secret_appears_in_no_response_or_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A models directory whose name carries the secret (as a registry URI would): the
    service cannot load it, and says so without the secret."""
    from qpr.serve.app import create_app
    from qpr.serve.settings import ServeSettings
    from qpr.serve.sources import LocalSource

    monkeypatch.setenv("QPR_REGISTRY_TOKEN", SECRET)
    models = tmp_path / f"models?token={SECRET}"
    models.mkdir()
    app = create_app(LocalSource(models), ServeSettings(poll_seconds=0))
    with caplog.at_level(logging.INFO, logger="qpr.serve"), TestClient(app) as client:
        ready = client.get("/readyz")
        version = client.get("/version")
    assert ready.status_code == 503
    for body in (ready.text, version.text, caplog.text):
        assert SECRET not in body
    assert MASK in ready.text
