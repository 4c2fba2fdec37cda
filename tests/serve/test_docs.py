"""/docs offline and the documented schema: assets served by the service itself, response
models with examples, and real responses that fit the documented models."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from qpr.ids import ID_PATTERN
from qpr.serve.app import create_app
from qpr.serve.docs import (
    ASSETS_DIR,
    BatchResponse,
    ErrorBody,
    FeedbackResponse,
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
    for name in ("question_id", "cluster_id"):  # 64-bit: a JSON number would be rounded
        assert hit[name]["type"] == "string" and hit[name]["pattern"] == ID_PATTERN
        assert "decimal string" in hit[name]["description"]
        example = schemas["SearchResponse"]["example"]["hits"][0][name]
        assert re.fullmatch(ID_PATTERN, example) and int(example) > 2**53
    assert schemas["ErrorBody"]["example"]["error"]
    for path in ("/healthz", "/readyz", "/version"):
        assert "200" in spec["paths"][path]["get"]["responses"]
    feedback = spec["paths"]["/feedback"]["post"]["responses"]
    assert feedback["202"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/FeedbackResponse"
    )
    assert "401" in feedback and "422" in feedback


def test_real_responses_fit_the_documented_models(client: TestClient) -> None:
    searched = client.post("/search", json={"question": QUESTIONS[0], "k": 2, "explain": True})
    SearchResponse.model_validate(searched.json(), strict=False)
    with pytest.raises(ValidationError, match="question_id"):  # an int id no longer fits
        SearchResponse.model_validate(
            {**searched.json(), "hits": [{**searched.json()["hits"][0], "question_id": 7}]}
        )
    batch = client.post("/search/batch", json={"questions": QUESTIONS[:2], "k": 2})
    BatchResponse.model_validate(batch.json())
    ErrorBody.model_validate(client.post("/search", json={"question": ""}).json())
    Health.model_validate(client.get("/healthz").json())
    Ready.model_validate(client.get("/readyz").json())
    Version.model_validate(client.get("/version").json())
    verdict = client.post("/feedback", json={"request_id": "abc", "outcome": "taken"})
    FeedbackResponse.model_validate(verdict.json())


def test_with_a_key_the_docs_need_it_too(bundle_dir: Path) -> None:
    app = create_app(LocalSource(bundle_dir), SETTINGS.replace(api_key=KEY))
    with TestClient(app) as keyed:
        for path in ("/docs", "/docs/assets/swagger-ui.css", "/openapi.json"):
            assert keyed.get(path).status_code == 401
            assert keyed.get(path, headers={"X-API-Key": KEY}).status_code == 200


def _body_schema(spec: dict, path: str) -> dict:
    return spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]


def test_openapi_declares_the_limits_the_endpoints_enforce(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    search = _body_schema(spec, "/search")["properties"]
    question = {"minLength": 1, "maxLength": SETTINGS.max_question_chars, "pattern": r"\S"}
    assert question.items() <= search["question"].items()
    assert {"minimum": 1, "maximum": SETTINGS.max_k}.items() <= search["k"]["anyOf"][0].items()
    assert search["k"]["default"] == SETTINGS.default_k
    assert search["threshold"]["anyOf"][0]["minimum"] == 0
    # The serving model's filter fields (this bundle keeps answer_id).
    assert search["filters"]["anyOf"][0]["propertyNames"] == {"enum": ["answer_id"]}
    batch = _body_schema(spec, "/search/batch")["properties"]["questions"]
    assert (batch["minItems"], batch["maxItems"]) == (1, SETTINGS.max_batch)
    assert question.items() <= batch["items"].items()
    body = spec["paths"]["/search"]["post"]["requestBody"]["description"]
    assert f"{SETTINGS.max_body_bytes:,} bytes" in body
    assert "securitySchemes" not in spec.get("components", {})  # no key, nothing to send


@pytest.mark.parametrize(
    ("path", "payload"),
    [
        ("/search", {"question": QUESTIONS[0]}),
        ("/search", {"question": QUESTIONS[0], "k": 1, "threshold": 0, "explain": True}),
        ("/search", {"question": QUESTIONS[0], "filters": {"answer_id": ["ans-1"]}}),
        ("/search", {"question": ""}),
        ("/search", {"question": "   "}),
        ("/search", {"question": "why " * 60}),
        ("/search", {"question": "hi", "k": 0}),
        ("/search", {"question": "hi", "k": SETTINGS.max_k + 1}),
        ("/search", {"question": "hi", "threshold": -0.5}),
        ("/search", {"question": "hi", "filters": {"locale": "en"}}),
        ("/search", {"question": "hi", "top_k": 3}),
        ("/search/batch", {"questions": [QUESTIONS[0], QUESTIONS[1]]}),
        ("/search/batch", {"questions": []}),
        ("/search/batch", {"questions": [QUESTIONS[0]] * (SETTINGS.max_batch + 1)}),
        ("/search/batch", {"questions": [QUESTIONS[0], ""]}),
        ("/feedback", {"request_id": "abc", "outcome": "taken"}),
        ("/feedback", {"request_id": "a.b:c", "outcome": "rejected", "answer_id": "ans-1"}),
        ("/feedback", {"request_id": "abc", "outcome": "taken", "position": 3}),
        ("/feedback", {"request_id": "abc", "outcome": "liked"}),
        ("/feedback", {"request_id": "a b", "outcome": "taken"}),
        ("/feedback", {"request_id": "", "outcome": "taken"}),
        ("/feedback", {"request_id": "abc", "outcome": "taken", "answer_id": "-x"}),
        ("/feedback", {"request_id": "abc", "outcome": "taken", "position": -1}),
        ("/feedback", {"request_id": "abc", "outcome": "taken", "position": SETTINGS.max_batch}),
        ("/feedback", {"request_id": "abc", "outcome": "taken", "stars": 5}),
    ],
)
def test_the_documented_schema_and_the_endpoint_agree(
    client: TestClient, path: str, payload: dict
) -> None:
    """A body the schema accepts is served; one it rejects is refused."""
    import jsonschema

    schema = _body_schema(client.get("/openapi.json").json(), path)
    valid = jsonschema.Draft202012Validator(schema).is_valid(payload)
    status = client.post(path, json=payload).status_code
    assert (status in (200, 202)) == valid, (payload, status)


def test_with_a_key_openapi_declares_how_to_send_it(bundle_dir: Path) -> None:
    app = create_app(LocalSource(bundle_dir), SETTINGS.replace(api_key=KEY))
    with TestClient(app, headers={"X-API-Key": KEY}) as keyed:
        spec = keyed.get("/openapi.json").json()
    schemes = spec["components"]["securitySchemes"]
    assert {s["type"] for s in schemes.values()} == {"http", "apiKey"}
    assert any(s.get("scheme") == "bearer" for s in schemes.values())
    assert any(s.get("name") == "X-API-Key" and s["in"] == "header" for s in schemes.values())
    assert spec["security"] == [{name: []} for name in schemes]
    assert spec["paths"]["/healthz"]["get"]["security"] == []  # the probes stay open
    assert {} in spec["paths"]["/readyz"]["get"]["security"]
    assert "security" not in spec["paths"]["/search"]["post"]  # the global rule applies


def test_before_a_model_serves_the_filter_fields_are_not_listed(tmp_path: Path) -> None:
    with TestClient(create_app(LocalSource(tmp_path), SETTINGS)) as empty:
        filters = _body_schema(empty.get("/openapi.json").json(), "/search")["properties"]
    assert "propertyNames" not in filters["filters"]["anyOf"][0]
