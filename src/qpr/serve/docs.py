"""The service's API documentation: `/docs` served offline, and what /openapi.json says.

Swagger UI's script and stylesheet come from the fastapi-offline package (MIT), installed
from the lock and served by the service itself under `/docs/assets`: no CDN, so the page
works on a machine without internet access.

`request_schema` and `add_openapi_extras` make /openapi.json declare what the endpoints
enforce: question length, k's range, the batch size, the body size, the filter fields of
the serving model and, with an API key set, how to send it (Swagger UI's "Authorize").

Question and cluster ids are documented as strings: the service writes them so (`qpr.ids`).

The models below only document the responses. The endpoints still build their JSON by hand
(`qpr.serve.app`), so documenting them changes no byte of a response; tests check that
real responses validate against these models.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field

from qpr.ids import ID_PATTERN
from qpr.querylog.log_records import OUTCOMES
from qpr.serve.settings import ServeSettings

DOCS_PATH = "/docs"
ASSETS_PATH = "/docs/assets"
ASSETS_DIR = Path(fastapi_offline.__file__).resolve().parent / "static"
ASSETS = {
    "js": "swagger-ui-bundle.js",
    "css": "swagger-ui.css",
    "favicon": "favicon.png",
}


class _Doc(BaseModel):
    model_config = ConfigDict(extra="allow")


class Explain(_Doc):
    """A hit's score taken apart (`"explain": true`)."""

    dense_distance: float = Field(description="L2 distance to the query")
    dense_scaled: float = Field(description="the dense side before weighting, in [0, 1]")
    bm25_score: float | None = Field(description="BM25 score; null without BM25")
    bm25_scaled: float | None = Field(description="BM25 side before weighting, in [0, 1]")
    matched_words: list[str] = Field(description="query words whose stems the hit shares")
    dense_weight: float = Field(description="α, the dense share; 1.0 for dense only")
    fused_score: float = Field(description="α·dense_scaled + (1 - α)·bm25_scaled")


_ID_TEXT = "a 64-bit id as a decimal string: as a JSON number, JavaScript would round it"


class Hit(_Doc):
    """A known question that asks the same thing."""

    answer_id: str | None = Field(description="the answer of the hit's paraphrase cluster")
    question_id: str = Field(pattern=ID_PATTERN, description=f"the known question's id; {_ID_TEXT}")
    text: str = Field(description="the known question")
    cluster_id: str = Field(
        pattern=ID_PATTERN, description=f'its paraphrase cluster ("-1": none); {_ID_TEXT}'
    )
    distance: float = Field(description="L2 distance, >= 0; the no-answer threshold's unit")
    score: float = Field(description="what hits are ranked by, higher first")
    explain: Explain | None = Field(default=None, description='only with "explain": true')


class ModelBrief(_Doc):
    name: str
    version: str | None = Field(description="registry version; null for a local bundle")
    fingerprint: str


_HIT = {
    "answer_id": "a-reset-password",
    "question_id": "9007199254740993",
    "text": "how can i reset my password",
    "cluster_id": "4611686018427387914",
    "distance": 0.0421,
    "score": 0.9596,
}
_MODEL = {"name": "qpr", "version": "3", "fingerprint": "5f0c2a9e41d7"}
_QUERY = "how do i reset my password?"


class SearchResponse(_Doc):
    """POST /search: the k closest known questions, nearest first."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "example": {
                "query": _QUERY,
                "answered": True,
                "threshold": 0.35,
                "hits": [_HIT],
                "model": _MODEL,
            }
        },
    )
    query: str
    answered: bool = Field(description="the top hit is within the threshold")
    threshold: float | None = Field(description="the request's, else the model's")
    hits: list[Hit]
    model: ModelBrief


class BatchResult(_Doc):
    query: str
    answered: bool
    hits: list[Hit]


class BatchResponse(_Doc):
    """POST /search/batch: one result per question, in input order."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "example": {
                "results": [{"query": _QUERY, "answered": True, "hits": [_HIT]}],
                "threshold": 0.35,
                "model": _MODEL,
            }
        },
    )
    results: list[BatchResult]
    threshold: float | None
    model: ModelBrief


class ErrorBody(_Doc):
    """Every refusal: a code to branch on, a message for people, the request id."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "example": {
                "error": "k_out_of_range",
                "message": "k must be between 1 and 100, got 500",
                "request_id": "3f2b9c1e8a7d4e6f9b0c1d2e3f4a5b6c",
            }
        },
    )
    error: str
    message: str
    request_id: str
    details: list[dict[str, Any]] | None = Field(
        default=None, description="one entry per invalid field"
    )


class FeedbackResponse(_Doc):
    """POST /feedback: what was recorded, and whether it reached the query log."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "example": {
                "request_id": "3f2b9c1e8a7d4e6f9b0c1d2e3f4a5b6c",
                "position": 0,
                "outcome": "taken",
                "answer_id": None,
                "logged": True,
                "reason": None,
            }
        },
    )
    request_id: str = Field(description="the search the verdict is about")
    position: int = Field(description="which question of that request (0 for /search)")
    outcome: str = Field(description='"taken" or "rejected"')
    answer_id: str | None = Field(description="the right answer, when named")
    logged: bool = Field(description="queued for the query log")
    reason: str | None = Field(
        description='why not: "the query log is off", "sampled out", "queue full"'
    )


class Health(_Doc):
    model_config = ConfigDict(extra="allow", json_schema_extra={"example": {"status": "ok"}})
    status: str


class Ready(_Doc):
    """Without the API key (when one is set) only the status."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={"example": {"status": "ready", "model": _MODEL}},
    )
    status: str = Field(description='"ready" or "not ready"')
    model: ModelBrief | None = None
    reason: str | None = Field(default=None, description="why not ready")
    degraded: str | None = Field(
        default=None, description="ready, but without the deltas that fail their check"
    )
    failed_deltas: list[dict[str, Any]] | None = Field(
        default=None, description='[{"delta": number, "reason": why}]: the deltas left out'
    )


class Version(_Doc):
    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "example": {
                "model": {"name": "qpr", "version": "3", "alias": "champion"},
                "service": {"package_version": "0.2.0", "git_commit": "c91284a"},
                "reload": {"checks": 12, "swaps": 1, "refused": 0, "errors": 0},
                "limits": {"max_k": 100, "default_k": 10, "max_batch": 64},
            }
        },
    )
    model: dict[str, Any] | None = Field(description="the serving model; null when none")
    service: dict[str, Any]
    reload: dict[str, Any]
    limits: dict[str, int]


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorBody} for code in codes}


# `responses=` of each route: what /openapi.json shows; nothing is validated at run time.
SEARCH_RESPONSES = {200: {"model": SearchResponse}, **_errors(400, 401, 413, 415, 422, 503)}
BATCH_RESPONSES = {200: {"model": BatchResponse}, **_errors(400, 401, 413, 415, 422, 503)}
FEEDBACK_RESPONSES = {202: {"model": FeedbackResponse}, **_errors(400, 401, 413, 415, 422)}
HEALTH_RESPONSES = {200: {"model": Health}}
READY_RESPONSES = {200: {"model": Ready}, 503: {"model": Ready}}
VERSION_RESPONSES = {200: {"model": Version}, **_errors(401)}
METRICS_RESPONSES = {200: {"content": {"text/plain": {}}, "description": "Prometheus text"}}


def add_docs_routes(app: FastAPI) -> None:
    """GET /docs (Swagger UI) and its assets, from the service itself."""
    app.mount(ASSETS_PATH, StaticFiles(directory=ASSETS_DIR), name="docs-assets")

    @app.get(DOCS_PATH, include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        # Relative to root_path: behind a proxy that mounts the service under a prefix.
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} — API",
            swagger_js_url=f"{root}{ASSETS_PATH}/{ASSETS['js']}",
            swagger_css_url=f"{root}{ASSETS_PATH}/{ASSETS['css']}",
            swagger_favicon_url=f"{root}{ASSETS_PATH}/{ASSETS['favicon']}",
        )


# ---------------------------------------------------------------- what requests may hold

# A question must hold a non-space character (qpr.serve.app._check_question).
_NOT_BLANK = r"\S"
# What /feedback takes (qpr.serve.app): a request id as the service makes or echoes them,
# an answer id as the pipeline's quality gate takes them (ECMA regex: $ for \Z).
_REQUEST_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,64}$"
_ANSWER_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$"
BEARER_SCHEME = "bearerAuth"
HEADER_SCHEME = "apiKeyHeader"


def request_schema(schema: dict[str, Any], settings: ServeSettings) -> dict[str, Any]:
    """A request body's JSON schema (pydantic's, of /search or /search/batch) with the
    limits the endpoint enforces from `settings` added."""
    schema = copy.deepcopy(schema)
    props = schema["properties"]
    question = {
        "minLength": 1,
        "maxLength": settings.max_question_chars,
        "pattern": _NOT_BLANK,
    }
    if "question" in props:
        props["question"].update(question, description="not blank")
    if "questions" in props:
        props["questions"].update(minItems=1, maxItems=settings.max_batch)
        props["questions"]["items"].update(question)
    if "k" in props:
        _non_null(props["k"]).update(minimum=1, maximum=settings.max_k)
        props["k"]["default"] = settings.default_k
    if "threshold" in props:
        _non_null(props["threshold"]).update(minimum=0)
        props["threshold"]["description"] = "a distance; null: the model's stored one"
    if "outcome" in props:  # POST /feedback
        _feedback_schema(props, settings)
    return schema


def _feedback_schema(props: dict[str, Any], settings: ServeSettings) -> None:
    """What /feedback checks (qpr.serve.app._check_feedback), in the schema's words."""
    props["request_id"].update(
        pattern=_REQUEST_ID_PATTERN, description="the X-Request-ID of the search"
    )
    props["outcome"].update(enum=list(OUTCOMES), description="was the answer taken?")
    _non_null(props["answer_id"]).update(pattern=_ANSWER_ID_PATTERN)
    props["answer_id"]["description"] = "the right answer, when the person named it"
    props["position"].update(
        minimum=0,
        maximum=settings.max_batch - 1,
        description="which question of a /search/batch request (0 for /search)",
    )


def _non_null(prop: dict[str, Any]) -> dict[str, Any]:
    """The branch of ``anyOf: [X, null]`` that is not null."""
    return next(branch for branch in prop.get("anyOf", [prop]) if branch.get("type") != "null")


def add_openapi_extras(
    app: FastAPI,
    settings: ServeSettings,
    *,
    keyed: bool,
    filter_fields: Callable[[], Sequence[str] | None],
) -> None:
    """/openapi.json made at each request from FastAPI's (cached) one, plus: the body
    size limit, the filter fields of the model serving now (`filter_fields`; None while
    none serves) and, when `keyed`, the API key's security schemes (probes stay open)."""
    base = app.openapi

    def openapi() -> dict[str, Any]:
        spec = copy.deepcopy(base())
        fields = filter_fields()
        for path in ("/search", "/search/batch", "/feedback"):
            body = spec["paths"][path]["post"]["requestBody"]
            body["description"] = f"JSON, UTF-8, at most {settings.max_body_bytes:,} bytes"
            if fields is not None and path != "/feedback":
                filters = _non_null(
                    body["content"]["application/json"]["schema"]["properties"]["filters"]
                )
                filters["propertyNames"] = {"enum": list(fields)}
        if keyed:
            _declare_key(spec)
        return spec

    app.openapi = openapi  # type: ignore[method-assign]


def _declare_key(spec: dict[str, Any]) -> None:
    spec.setdefault("components", {})["securitySchemes"] = {
        BEARER_SCHEME: {"type": "http", "scheme": "bearer", "description": "the API key"},
        HEADER_SCHEME: {"type": "apiKey", "in": "header", "name": "X-API-Key"},
    }
    either = [{BEARER_SCHEME: []}, {HEADER_SCHEME: []}]
    spec["security"] = either
    spec["paths"]["/healthz"]["get"]["security"] = []
    # /readyz answers without the key; with it, it also says which model or why not.
    spec["paths"]["/readyz"]["get"]["security"] = [{}, *either]
