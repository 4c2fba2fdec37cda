"""Credentials never leave the service: responses about itself and its log are masked."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from qpr.redact import MASK, RedactingFilter, hide_paths, redact, redact_tree

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
    app = create_app(LocalSource(models), ServeSettings(poll_seconds=0, startup_wait=60))
    with caplog.at_level(logging.INFO, logger="qpr.serve"), TestClient(app) as client:
        ready = client.get("/readyz")
        version = client.get("/version")
    assert ready.status_code == 503
    for body in (ready.text, version.text, caplog.text):
        assert SECRET not in body
    assert MASK in ready.text


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("local:/srv/project/models", "local:models"),
        ("local:/elsewhere/bundles/v7", "local:v7"),
        ("/srv/project", "."),
        (
            "cannot open /srv/project/models/encoder.onnx: no such file.",
            "cannot open models/encoder.onnx: no such file.",
        ),
        ("read '/data/x/index.faiss' (size 0)", "read 'index.faiss' (size 0)"),
        ("file:///srv/mlruns/1/artifacts", "artifacts"),
        # not paths on this host: URLs, MLflow model URIs, one-part paths
        ("https://mlflow.example/api/2.0/x", "https://mlflow.example/api/2.0/x"),
        ("mlflow:models:/qpr@champion", "mlflow:models:/qpr@champion"),
        ("see /etc", "see /etc"),
    ],
)
def test_absolute_paths_are_hidden(text: str, shown: str) -> None:
    assert hide_paths(text, "/srv/project") == shown


def test_hide_paths_walks_a_tree() -> None:
    tree = {"model": {"source": "local:/srv/project/models", "dim": 8}, "log": ["/a/b/c"]}
    assert hide_paths(tree, Path("/srv/project")) == {
        "model": {"source": "local:models", "dim": 8},
        "log": ["c"],
    }


def test_a_switch_is_not_a_secret(monkeypatch) -> None:
    """TOKENIZERS_PARALLELISM=false once masked every "false" of every record."""
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.setenv("SERVICE_TOKEN", "true")
    monkeypatch.setenv("API_TOKEN", "s3cr3t-value")
    assert redact('{"enabled": false, "git": true} s3cr3t-value') == (
        '{"enabled": false, "git": true} ***'
    )
