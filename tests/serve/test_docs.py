"""/docs offline and the documented schema: assets served by the service itself, response
models with examples, and real responses that fit the documented models."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from qpr.serve.app import create_app
from qpr.serve.docs import (
    ASSETS_DIR,
    BatchResponse,
    ErrorBody,
    Health,
    Ready,
    SearchResponse,
    Version,
)
from qpr.serve.sources import LocalSource
from tests.serve.test_app import QIDS, QUESTIONS, SETTINGS, build_bundle

KEY = "k3y-for-docs-tests-0123456789abcdef"


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bundle(tmp_path_factory.mktemp("models"), QUESTIONS, QIDS)


@pytest.fixture(scope="module")
def client(bundle_dir: Path) -> Iterator[TestClient]:
    with TestClient(create_app(LocalSource(bundle_dir), SETTINGS)) as test_client:
        yield test_client


def _asset_urls(html: str) -> list[str]:
    return re.findall(r"""(?:src|href)=["']([^"']+)["']""", html) + re.findall(
        r"""url: ?["']([^"']+)["']""", html
    )


def test_docs_page_uses_only_local_assets(client: TestClient) -> None:
    response = client.get("/docs")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    urls = _asset_urls(response.text)
    assert urls and all(url.startswith("/") for url in urls), urls
    assert "http://" not in response.text and "https://" not in response.text
    assert "/openapi.json" in urls


@pytest.mark.parametrize(
    ("name", "media"),
    [
        ("swagger-ui-bundle.js", "javascript"),
        ("swagger-ui.css", "text/css"),
        ("favicon.png", "image/png"),
    ],
)
def test_docs_assets_come_from_the_service(client: TestClient, name: str, media: str) -> None:
    response = client.get(f"/docs/assets/{name}")
    assert response.status_code == 200
    assert media in response.headers["content-type"]
    assert response.content == (ASSETS_DIR / name).read_bytes()


def test_openapi_documents_responses_with_examples(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    for path, model in (("/search", "SearchResponse"), ("/search/batch", "BatchResponse")):
        responses = spec["paths"][path]["post"]["responses"]
        ok = responses["200"]["content"]["application/json"]["schema"]
        assert ok == {"$ref": f"#/components/schemas/{model}"}
        assert schemas[model]["example"]["hits" if model == "SearchResponse" else "results"]
        assert responses["422"]["content"]["application/json"]["schema"]["$ref"].endswith(
            "/ErrorBody"
        )
        assert spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["example"]
    hit = schemas["Hit"]["properties"]
    assert set(hit) == {
        "answer_id",
        "question_id",
        "text",
        "cluster_id",
        "distance",
        "score",
        "explain",
    }
    assert schemas["ErrorBody"]["example"]["error"]
    for path in ("/healthz", "/readyz", "/version"):
        assert "200" in spec["paths"][path]["get"]["responses"]


def test_real_responses_fit_the_documented_models(client: TestClient) -> None:
    searched = client.post("/search", json={"question": QUESTIONS[0], "k": 2, "explain": True})
    SearchResponse.model_validate(searched.json(), strict=False)
    batch = client.post("/search/batch", json={"questions": QUESTIONS[:2], "k": 2})
    BatchResponse.model_validate(batch.json())
    ErrorBody.model_validate(client.post("/search", json={"question": ""}).json())
    Health.model_validate(client.get("/healthz").json())
    Ready.model_validate(client.get("/readyz").json())
    Version.model_validate(client.get("/version").json())


def test_with_a_key_the_docs_need_it_too(bundle_dir: Path) -> None:
    app = create_app(LocalSource(bundle_dir), SETTINGS.replace(api_key=KEY))
    with TestClient(app) as keyed:
        for path in ("/docs", "/docs/assets/swagger-ui.css", "/openapi.json"):
            assert keyed.get(path).status_code == 401
            assert keyed.get(path, headers={"X-API-Key": KEY}).status_code == 200
