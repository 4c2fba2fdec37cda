"""The search service: a FastAPI app over the current `Bundle`, hot-reloaded from a source.

Endpoints (JSON unless said otherwise; every response carries an ``X-Request-ID``):

- ``POST /search`` ``{"question": str, "k"?: int, "threshold"?: number|null}`` → the k
  closest known questions (`qpr.retrieval.bundle.HIT_FIELDS`; question_id and cluster_id
  as decimal strings, `qpr.ids`), ``answered``
  (top-1 within the threshold: the request's, else the model's stored one), the threshold
  used, and which model answered. ``"explain": true`` adds each hit's score parts.
  ``"filters": {"locale": "en", "tenant": ["a", "b"]}`` searches only the questions
  whose metadata match (exact value or one of a list); an unknown field gets 400.
- ``POST /search/batch`` ``{"questions": [str, ...], "k"?, "threshold"?}`` → ``results``
  in input order, same fields.
- ``POST /feedback`` ``{"request_id": str, "outcome": "taken"|"rejected", "answer_id"?:
  str, "position"?: int}`` → 202: a person's verdict on a search's answer, appended to
  the query log (`qpr.querylog`) beside that search's line; ``"logged": false`` and the
  reason when it was not (log off, sampled out, queue full).
- ``GET /healthz`` liveness: 200 while the process runs.
- ``GET /readyz`` readiness: 200 once a model serves, else 503 (load balancers wait);
  the model or the reason only with the API key, when one is set.
- ``GET /version`` the serving model (name, version, alias, fingerprint, ...), the
  service's git commit, and the reloader's state (refused reloads, last error).
- ``GET /metrics`` Prometheus text: requests by endpoint/method/status, latency
  histogram, model info gauge, reload outcomes, answered/unanswered questions.
- ``GET /docs`` Swagger UI over ``/openapi.json``, its files served here (`qpr.serve.docs`).

Access (`qpr.serve.auth`): with an API key set, everything but /healthz and /readyz needs
it; a Host header outside ``allowed_hosts`` gets 400.

Input handling: bodies are read by `_BodyLimit` (an ASGI middleware, after the API key
check) up to ``max_body_bytes`` (Content-Length checked first, then the bytes actually
streamed), within ``body_timeout`` seconds (else 408; `qpr.serve.connections` bounds the
rest), and parsed here, not by FastAPI, so that invalid UTF-8, invalid JSON, wrong types, unknown
fields, empty or overlong questions and k out of range each get a 4xx with a message that
says what to fix. Anything unexpected becomes a 500 with the request id; the trace goes
to the log only.

Speed: the per-request path is parse → `Bundle.search` in a worker thread (ONNX Runtime
and FAISS release the GIL, so two searches use two cores) → `json.dumps`. Nothing on it
imports torch. With the query log on (``QPR_SERVE_QUERY_LOG``), a search also puts one
event into the log's bounded queue: no file I/O, JSON or redaction on the request path
(`qpr.querylog.log_writer`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import re
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from qpr.errors import printable
from qpr.quality.suites import ANSWER_ID_REGEX
from qpr.querylog.log_records import OUTCOMES
from qpr.querylog.log_writer import QueryLog
from qpr.redact import RedactingFilter, hide_paths, redact_tree
from qpr.retrieval.bundle import Bundle, SearchResult
from qpr.serve import docs
from qpr.serve.auth import AccessControl, resolve_key
from qpr.serve.log_throttle import install as install_log_throttle
from qpr.serve.metrics import CONTENT_TYPE, Telemetry
from qpr.serve.openmp import OpenMPThreads
from qpr.serve.refusals import error_body
from qpr.serve.reload import ModelHolder, Reloader, Served
from qpr.serve.settings import ServeSettings
from qpr.serve.sources import BundleSource, LocalSource, RegistrySource
from qpr.version import __version__

__all__ = ["ApiError", "create_app", "source_from_settings"]

log = logging.getLogger("qpr.serve")
# Every module of the service logs here: credentials in a message or traceback are masked
# before any handler writes them (qpr.redact).
if not any(isinstance(f, RedactingFilter) for f in log.filters):
    log.addFilter(RedactingFilter())

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Paths reported as themselves in metrics; anything else is "other", so that scanners
# probing random URLs cannot create unbounded label values.
_ENDPOINTS = frozenset(
    {
        "/search",
        "/search/batch",
        "/feedback",
        "/healthz",
        "/readyz",
        "/version",
        "/metrics",
        "/openapi.json",
    }
)
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_ANSWER_ID = re.compile(ANSWER_ID_REGEX)
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
# Characters of a request path an error message quotes.
_PATH_CHARS = 100


# ---------------------------------------------------------------- errors


class ApiError(Exception):
    """A request the service refuses: becomes ``{"error", "message", "request_id"}``."""

    def __init__(self, status: int, code: str, message: str, details: list[Any] | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details


def _json_bytes(payload: Any) -> bytes:
    # allow_nan=False: a NaN would be invalid JSON for most clients; better a 500 here.
    return json.dumps(payload, ensure_ascii=False, allow_nan=False).encode("utf-8")


# One JSON error shape for the app, the access check and the protocol (qpr.serve.refusals).
_error_body = error_body


def _shown_path(path: str) -> str:
    """A request path fit to quote back: a 100 KB URL is not echoed whole."""
    return printable(path, limit=_PATH_CHARS)


def _public(tree: Any) -> Any:
    """What the service says about itself, made fit to show: credentials masked, paths
    relative to the project directory (the host's layout is not the caller's business)."""
    return hide_paths(redact_tree(tree), Path.cwd())


def _request_id(request: Request) -> str:
    return str(request.scope.get("state", {}).get("request_id", "-"))


# ---------------------------------------------------------------- the guard middleware


class _Guard:
    """Outermost layer of the app: request id, catch-all, metrics.

    A pure ASGI middleware (not BaseHTTPMiddleware) because it sits on every request's
    path and must stay cheap. Inside it, `qpr.serve.auth.AccessControl` checks the Host
    and the API key, and only then `_BodyLimit` reads the body: a caller without the key
    never gets 256 KB read on its behalf.
    """

    def __init__(self, app: ASGIApp, *, telemetry: Telemetry) -> None:
        self.app = app
        self.telemetry = telemetry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        headers = {k.decode("latin-1").lower(): v for k, v in scope.get("headers", [])}
        given = headers.get("x-request-id", b"").decode("latin-1")
        request_id = given if _REQUEST_ID.fullmatch(given) else uuid.uuid4().hex
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        method = scope.get("method", "GET")
        path = scope.get("path", "")
        status = 500
        response_started = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, response_started
            if message["type"] == "http.response.start":
                status = message["status"]
                response_started = True
                message["headers"] = [
                    *message.get("headers", []),
                    (b"x-request-id", request_id.encode("latin-1")),
                ]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
            if not response_started and state.get("client_left"):
                status = 499  # the client left (or was evicted) mid-body
        except Exception:
            # The client gets the request id and nothing else; the trace goes to the log.
            log.exception(
                "unhandled error in %s %s (request id %s)", method, _shown_path(path), request_id
            )
            if not response_started:
                text = f"internal error; request id {request_id}"
                await _send_error(send_with_id, 500, "internal_error", text, request_id)
        finally:
            endpoint = path if path in _ENDPOINTS else "other"
            self.telemetry.observe(endpoint, method, status, time.perf_counter() - started)


async def _send_error(
    send: Send, status: int, code: str, message: str, request_id: str, *, close: bool = False
) -> None:
    body = _error_body(code, message, request_id)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _BodyLimit:
    """Reads a request body in full, up to ``max_body_bytes``, and replays it to the app:
    an oversize body is refused before anything parses it, whether it announced its size
    (Content-Length) or not (chunked), and the app sees one complete body."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, body_timeout: float = 10.0) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method", "GET") not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        headers = {k.decode("latin-1").lower(): v for k, v in scope.get("headers", [])}
        refusal = await self._read_body(headers, receive)
        if refusal is None:
            state["client_left"] = True
            return
        if isinstance(refusal, tuple):
            code, error, text = refusal
            request_id = str(state.get("request_id", "-"))
            # 408: the rest of the body may still come, so the connection is done.
            await _send_error(send, code, error, text, request_id, close=code == 408)
            return
        await self.app(scope, _replay(refusal, receive), send)

    async def _read_body(
        self, headers: dict[str, bytes], receive: Receive
    ) -> bytes | tuple[int, str, str] | None:
        """The whole body, (status, code, message) when it must be refused, or None when
        the client disconnected before sending it all."""
        limit = self.max_body_bytes
        raw = headers.get("content-length")
        declared = None if raw is None else raw.decode("latin-1")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                return 400, "bad_request", f"Content-Length {declared[:40]!r} is not a number"
            if size > limit:
                return 413, "body_too_large", f"body of {size} bytes; the limit is {limit}"
        chunks: list[bytes] = []
        total = 0
        # One deadline for the whole body, not one per chunk: a client dripping a byte every
        # few seconds would otherwise hold its connection for ever.
        deadline = time.monotonic() + self.body_timeout
        while True:
            try:
                message = await asyncio.wait_for(receive(), deadline - time.monotonic())
            except TimeoutError:
                return (
                    408,
                    "request_timeout",
                    f"the body did not arrive within {self.body_timeout:g} s ({total} bytes came)",
                )
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > limit:
                # Content-Length absent or understated: stop reading at the limit.
                return 413, "body_too_large", f"body larger than the limit of {limit} bytes"
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: wait for the disconnect, as servers do

    return replay


# ---------------------------------------------------------------- request bodies


class _SearchBody(BaseModel):
    # strict: "5" is not a k and true is not a number; forbid: a typo ("top_k") is an
    # error, not a silently ignored field.
    model_config = ConfigDict(extra="forbid", strict=True)
    question: str
    k: int | None = None
    threshold: float | None = None
    explain: bool = False  # each hit with the parts of its score (Bundle.search)
    # {field: value or [values]} on the questions' metadata (Bundle.filter_fields)
    filters: dict[str, str | list[str]] | None = None


class _BatchBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    questions: list[str]
    k: int | None = None
    threshold: float | None = None
    explain: bool = False
    filters: dict[str, str | list[str]] | None = None


class _FeedbackBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    request_id: str  # the X-Request-ID of the search
    outcome: str  # one of OUTCOMES
    answer_id: str | None = None  # the right answer, when the person named it
    position: int = 0  # which question of a /search/batch request


_SEARCH_EXAMPLE = '{"question": "how do i reset my password?", "k": 10}'
_BATCH_EXAMPLE = '{"questions": ["how do i reset my password?"], "k": 10}'
_FEEDBACK_EXAMPLE = '{"request_id": "3f2b9c1e8a7d4e6f9b0c1d2e3f4a5b6c", "outcome": "taken"}'


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _check_content_type(content_type: str) -> None:
    """415 unless application/json, in UTF-8 when a charset is named: a form post or a
    text/plain body from a browser is not a search (nor a cross-site request to allow)."""
    media, *params = (part.strip().lower() for part in content_type.split(";"))
    if media != "application/json":
        shown = f"got {content_type[:100]!r}" if content_type else "got none"
        raise ApiError(
            415, "unsupported_media_type", f"send Content-Type: application/json, {shown}"
        )
    for param in params:
        name, _, value = param.partition("=")
        if name.strip() == "charset" and value.strip().strip('"') not in {"utf-8", "utf8"}:
            raise ApiError(
                415, "unsupported_media_type", f"send UTF-8 JSON, got charset {value.strip()!r}"
            )


def _parse(body: bytes, headers: Any, model: type[BaseModel], example: str) -> Any:
    _check_content_type(headers.get("content-type", ""))
    if not body.strip():
        raise ApiError(400, "empty_body", f"the body is empty; send e.g. {example}")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(
            400, "invalid_utf8", f"the body is not valid UTF-8 (byte {exc.start}): send UTF-8 JSON"
        ) from None
    try:
        # NaN/Infinity are accepted by Python's json but are not JSON.
        payload = json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise ApiError(400, "invalid_json", f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        # A few KB of brackets reach the parser's recursion limit; no request nests deeper
        # than 2 levels.
        raise ApiError(400, "invalid_json", "the body is nested too deeply") from None
    try:
        # "\ud800" is valid JSON but no Unicode text: it would fail later, when the
        # response (which echoes the question) is encoded.
        json.dumps(payload, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ApiError(
            400,
            "invalid_unicode",
            f"the body holds a lone surrogate ({exc.object[exc.start : exc.end]!a}): send text",
        ) from None
    if not isinstance(payload, dict):
        raise ApiError(
            422,
            "invalid_request",
            f"the body must be a JSON object like {example}, got a JSON {type(payload).__name__}",
        )
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        details = [
            {"field": ".".join(str(p) for p in e["loc"]) or "body", "problem": e["msg"]}
            for e in exc.errors(include_url=False, include_input=False, include_context=False)
        ]
        summary = "; ".join(f"{d['field']}: {d['problem']}" for d in details[:5])
        raise ApiError(422, "invalid_request", summary, details) from None


def _check_question(question: str, settings: ServeSettings, where: str = "question") -> None:
    if not question.strip():
        raise ApiError(422, "empty_question", f"{where} is empty or only whitespace")
    if len(question) > settings.max_question_chars:
        raise ApiError(
            422,
            "question_too_long",
            f"{where} has {len(question):,} characters; the limit is "
            f"{settings.max_question_chars:,}",
        )


def _check_k(k: int | None, settings: ServeSettings) -> int:
    if k is None:
        return settings.default_k
    if not 1 <= k <= settings.max_k:
        raise ApiError(422, "k_out_of_range", f"k must be between 1 and {settings.max_k}, got {k}")
    return k


def _check_threshold(threshold: float | None) -> float | None:
    if threshold is not None and not (math.isfinite(threshold) and threshold >= 0):
        raise ApiError(
            422, "invalid_threshold", f"threshold must be a finite number >= 0, got {threshold}"
        )
    return threshold


def _check_filters(filters: dict[str, str | list[str]] | None, bundle: Bundle) -> None:
    """400 naming the fields this model keeps when a filter names another one: the
    request is well-formed JSON but asks for what this model cannot select on."""
    known = bundle.filter_fields
    unknown = sorted(set(filters or {}) - set(known))
    if unknown:
        raise ApiError(
            400,
            "unknown_filter_field",
            f"unknown filter field {unknown[0]!r}; this model keeps: {', '.join(known) or 'none'}",
            [{"field": f"filters.{name}", "known": list(known)} for name in unknown],
        )


# ---------------------------------------------------------------- responses


def _respond(payload: Any, status: int = 200) -> Response:
    return Response(_json_bytes(payload), status_code=status, media_type="application/json")


def _hits(result: SearchResult) -> list[dict[str, Any]]:
    # Hit.as_dict: the field names the CLI and the MLflow pyfunc use too, and the ids as
    # decimal strings (qpr.ids: JavaScript clients would round them as numbers).
    return [h.as_dict() for h in result.hits]


def _degraded(failed: dict[int, str]) -> str:
    """One line for a person: which deltas are left out and how to remove them."""
    numbers = sorted(failed)
    drops = " and ".join(f"`qpr index drop {n}`" for n in numbers)
    if len(numbers) == 1:
        return f"serving without delta {numbers[0]}, which fails its check: {drops} removes it"
    listed = ", ".join(map(str, numbers))
    return f"serving without deltas {listed}, which fail their check: {drops} remove them"


def _model_brief(served: Served) -> dict[str, Any]:
    info = served.info
    return {"name": info.name, "version": info.version, "fingerprint": info.fingerprint}


# ---------------------------------------------------------------- the app


@dataclass
class _ServiceState:
    """Everything the endpoints read, built once per app (`app.state.service`)."""

    settings: ServeSettings
    source: BundleSource
    holder: ModelHolder
    reloader: Reloader
    telemetry: Telemetry
    openmp: OpenMPThreads
    git_commit: str | None
    started_at: float
    query_log: QueryLog | None = None  # None: QPR_SERVE_QUERY_LOG unset or switched off

    def serving(self) -> Served:
        """The serving model, read once: a request uses it to the end. 503 when none."""
        served = self.holder.current
        if served is None:
            raise ApiError(503, "not_ready", "no model is loaded yet; see /version")
        return served


def source_from_settings(settings: ServeSettings) -> BundleSource:
    """The registry when a model name is set, else the local models directory."""
    if settings.registry_name:
        cache = settings.cache_dir or str(Path(settings.models_dir) / ".registry-cache")
        return RegistrySource(settings.registry_name, settings.alias, cache_dir=cache)
    return LocalSource(settings.models_dir)


def _git_commit() -> str | None:
    """The service code's commit: QPR_GIT_COMMIT (set in images without .git), else git."""
    given = os.environ.get("QPR_GIT_COMMIT")
    if given:
        return given
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=2,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and commit else None


def create_app(
    source: BundleSource | None = None,
    settings: ServeSettings | None = None,
    *,
    load: Callable[[Path], Bundle] | None = None,
) -> FastAPI:
    """Build the service. With no arguments (``uvicorn qpr.serve.app:create_app
    --factory``) everything comes from ``QPR_SERVE_*`` variables.

    The model is loaded in the reloader's thread, started by the lifespan: the port opens
    at once (after at most ``settings.startup_wait`` seconds), /healthz answers 200 and
    /readyz 503 with the reason until a model serves; a failing source is retried with a
    backoff (`qpr.serve.reload.Reloader`).

    load: how a bundle directory is loaded (default: Bundle.load with the settings'
        threads, nprobe and ef_search); tests substitute their own.
    """
    settings = settings or ServeSettings.from_env()
    key = resolve_key(settings)
    install_log_throttle(settings.log_burst, settings.log_interval)
    state = _service_state(source or source_from_settings(settings), settings, load)
    app = FastAPI(
        title="QPR search",
        version=__version__,
        description="Question paraphrase retrieval: the known questions that ask the same thing.",
        lifespan=_lifespan(state),
        # FastAPI's own /docs loads Swagger UI from a CDN: qpr.serve.docs serves it here.
        docs_url=None,
        redoc_url=None,
    )
    app.state.service = state
    _add_error_handlers(app)
    docs.add_docs_routes(app)
    _add_search_routes(app, state)
    _add_feedback_route(app, state)
    _add_status_routes(app, state)
    docs.add_openapi_extras(
        app, settings, keyed=key is not None, filter_fields=lambda: _filter_fields(state)
    )
    # The last added runs first: _Guard (request id, metrics) → AccessControl → _BodyLimit.
    # A refusal gets the request id and is counted; the key is checked before the body is
    # read (a caller without it costs no 256 KB buffer).
    body_limit: Any = _BodyLimit
    app.add_middleware(
        body_limit, max_body_bytes=settings.max_body_bytes, body_timeout=settings.body_timeout
    )
    access: Any = AccessControl
    app.add_middleware(access, key=key, allowed_hosts=settings.allowed_hosts, render=_error_body)
    guarded: Any = _Guard
    app.add_middleware(guarded, telemetry=state.telemetry)
    return app


def _filter_fields(state: _ServiceState) -> tuple[str, ...] | None:
    """The serving model's filter fields; None while none serves."""
    served = state.holder.current
    return None if served is None else tuple(served.bundle.filter_fields)


def _service_state(
    source: BundleSource, settings: ServeSettings, load: Callable[[Path], Bundle] | None
) -> _ServiceState:
    """The holder, the reloader that fills it and the telemetry that watches both."""
    # libgomp keeps the limit per thread: each thread that searches sets it (see
    # qpr.serve.openmp); qpr.serve.settings says why 1. The caller's thread only builds
    # the app, so it is left as it is.
    openmp = OpenMPThreads(settings.faiss_threads)

    def default_load(path: Path) -> Bundle:
        openmp.apply()  # the reloader's thread runs the canaries and the warm-up next
        return Bundle.load(
            path,
            threads=settings.threads,
            nprobe=settings.nprobe,
            ef_search=settings.ef_search,
            fold_encoder=settings.fold_encoder,
        )

    telemetry = Telemetry()
    holder = ModelHolder()
    reloader = Reloader(
        source,
        holder,
        load=load or default_load,
        canaries=settings.canaries,
        warmup_k=settings.default_k,
        poll_seconds=settings.poll_seconds,
        retry_max_seconds=settings.retry_max_seconds,
        on_event=lambda outcome, message: telemetry.reloads.labels(outcome).inc(),
    )
    telemetry.watch_model(lambda: holder.current)
    query_log = None
    if settings.query_log_on:
        # Its errors go to the service's logger, which is rate-limited (log_throttle).
        query_log = QueryLog(settings.query_log or "", settings.query_log_limits(), log=log)
        telemetry.watch_query_log(query_log)
    return _ServiceState(
        settings=settings,
        source=source,
        holder=holder,
        reloader=reloader,
        telemetry=telemetry,
        openmp=openmp,
        git_commit=_git_commit(),
        started_at=time.time(),
        query_log=query_log,
    )


def _lifespan(
    state: _ServiceState,
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """Load the model behind an open port, poll for new ones while serving."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Not awaited: a registry that does not answer must not keep the port closed (it
        # once did for 250 s, /healthz included).
        state.reloader.start()
        if state.query_log is not None:
            state.query_log.start()
            limits = state.query_log.limits
            log.info("query log: %s (sample %g)", state.query_log.folder, limits.sample)
        wait = state.settings.startup_wait
        if wait > 0:
            await run_in_threadpool(state.reloader.first_check.wait, wait)
        try:
            yield
        finally:
            state.reloader.stop()
            if state.query_log is not None:
                # What is queued is written, and the open files closed (renamed).
                await run_in_threadpool(state.query_log.close)

    return lifespan


def _add_error_handlers(app: FastAPI) -> None:
    """Every refusal has the same JSON shape and the request id."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        body = _error_body(exc.code, exc.message, _request_id(request), exc.details)
        return Response(body, status_code=exc.status, media_type="application/json")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        message = f"{exc.detail}: {request.method[:20]} {_shown_path(request.url.path)}"
        if exc.status_code == 404:
            message += f" (endpoints: {', '.join(sorted(_ENDPOINTS))})"
        body = _error_body(code, message, _request_id(request))
        return Response(
            body,
            status_code=exc.status_code,
            media_type="application/json",
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        details = [
            {"field": ".".join(map(str, e["loc"])), "problem": e["msg"]} for e in exc.errors()
        ]
        summary = "; ".join(f"{d['field']}: {d['problem']}" for d in details[:5])
        body = _error_body("invalid_request", summary, _request_id(request), details)
        return Response(body, status_code=422, media_type="application/json")


def _add_search_routes(app: FastAPI, state: _ServiceState) -> None:
    """POST /search and /search/batch."""
    settings, telemetry, openmp = state.settings, state.telemetry, state.openmp
    search_schema = {"requestBody": _body_schema(_SearchBody, _SEARCH_EXAMPLE, settings)}
    batch_schema = {"requestBody": _body_schema(_BatchBody, _BATCH_EXAMPLE, settings)}

    @app.post("/search", openapi_extra=search_schema, responses=docs.SEARCH_RESPONSES)
    async def search(request: Request) -> Response:
        """The k known questions closest to one question."""
        body = _parse(await request.body(), request.headers, _SearchBody, _SEARCH_EXAMPLE)
        _check_question(body.question, settings)
        k = _check_k(body.k, settings)
        threshold = _check_threshold(body.threshold)
        served = state.serving()
        _check_filters(body.filters, served.bundle)
        started = time.perf_counter()
        try:
            result = await run_in_threadpool(
                openmp.call,
                served.bundle.search,
                body.question,
                k,
                threshold=threshold,
                explain=body.explain,
                filters=body.filters,
            )
        except ValueError as exc:  # e.g. only punctuation: no words to search with
            raise ApiError(422, "invalid_question", str(exc)) from None
        took = time.perf_counter() - started
        telemetry.questions.labels("true" if result.answered else "false").inc()
        used = served.bundle.threshold if threshold is None else threshold
        model = _model_brief(served)
        _log_search(state, request, [result], model, k, used, took)
        return _respond(
            {
                "query": result.query,
                "answered": result.answered,
                "threshold": used,
                "hits": _hits(result),
                "model": model,
            }
        )

    @app.post("/search/batch", openapi_extra=batch_schema, responses=docs.BATCH_RESPONSES)
    async def search_batch(request: Request) -> Response:
        """`/search` for up to max_batch questions in one request (one encoder call)."""
        body = _parse(await request.body(), request.headers, _BatchBody, _BATCH_EXAMPLE)
        if not body.questions:
            raise ApiError(422, "empty_batch", "questions is empty: send at least one")
        if len(body.questions) > settings.max_batch:
            raise ApiError(
                422,
                "batch_too_large",
                f"{len(body.questions)} questions; the limit is {settings.max_batch} a request",
            )
        for i, question in enumerate(body.questions):
            _check_question(question, settings, where=f"questions[{i}]")
        k = _check_k(body.k, settings)
        threshold = _check_threshold(body.threshold)
        served = state.serving()
        _check_filters(body.filters, served.bundle)
        started = time.perf_counter()
        try:
            results = await run_in_threadpool(
                openmp.call,
                served.bundle.search_batch,
                body.questions,
                k,
                threshold=threshold,
                explain=body.explain,
                filters=body.filters,
            )
        except ValueError as exc:
            raise ApiError(422, "invalid_question", str(exc)) from None
        took = time.perf_counter() - started
        answered = sum(r.answered for r in results)
        if answered:
            telemetry.questions.labels("true").inc(answered)
        if len(results) - answered:
            telemetry.questions.labels("false").inc(len(results) - answered)
        used = served.bundle.threshold if threshold is None else threshold
        model = _model_brief(served)
        _log_search(state, request, results, model, k, used, took)
        return _respond(
            {
                "results": [
                    {"query": r.query, "answered": r.answered, "hits": _hits(r)} for r in results
                ],
                "threshold": used,
                "model": model,
            }
        )


def _log_search(
    state: _ServiceState,
    request: Request,
    results: list[SearchResult],
    model: dict[str, Any],
    k: int,
    threshold: float | None,
    seconds: float,
) -> None:
    """Hand a search to the query log, when it is on: one queued event, no I/O here."""
    if state.query_log is not None:
        state.query_log.queries(
            _request_id(request),
            results,
            endpoint=request.scope["path"],
            model=model,
            k=k,
            threshold=threshold,
            latency_ms=seconds * 1000,
        )


def _add_feedback_route(app: FastAPI, state: _ServiceState) -> None:
    """POST /feedback: a verdict on a search's answer, into the query log."""
    settings = state.settings
    schema = {"requestBody": _body_schema(_FeedbackBody, _FEEDBACK_EXAMPLE, settings)}

    @app.post("/feedback", status_code=202, openapi_extra=schema, responses=docs.FEEDBACK_RESPONSES)
    async def feedback(request: Request) -> Response:
        """Whether the answer of a search was taken or rejected (and, when known, the right
        answer), joined to the search's query log line by its request id."""
        body = _parse(await request.body(), request.headers, _FeedbackBody, _FEEDBACK_EXAMPLE)
        _check_feedback(body, settings)
        if state.query_log is None:
            reason: str | None = "the query log is off"
        else:
            reason = state.query_log.feedback(
                body.request_id,
                body.outcome,
                position=body.position,
                answer_id=body.answer_id,
                feedback_id=_request_id(request),
            )
        return _respond(
            {
                "request_id": body.request_id,
                "position": body.position,
                "outcome": body.outcome,
                "answer_id": body.answer_id,
                "logged": reason is None,
                "reason": reason,
            },
            status=202,
        )


def _check_feedback(body: _FeedbackBody, settings: ServeSettings) -> None:
    if not _REQUEST_ID.fullmatch(body.request_id):
        raise ApiError(
            422,
            "invalid_request_id",
            "request_id must be the X-Request-ID of a search: 1 to 64 letters, digits or ._:-",
        )
    if body.outcome not in OUTCOMES:
        got = printable(body.outcome, limit=40)
        raise ApiError(
            422, "invalid_outcome", f"outcome must be one of {', '.join(OUTCOMES)}, got {got!r}"
        )
    if body.answer_id is not None and not _ANSWER_ID.search(body.answer_id):
        raise ApiError(
            422,
            "invalid_answer_id",
            "answer_id must be an answer's id: a letter or digit, then up to 127 of them or ._:-",
        )
    if not 0 <= body.position < settings.max_batch:
        raise ApiError(
            422,
            "position_out_of_range",
            f"position must be between 0 and {settings.max_batch - 1}, got {body.position}",
        )


def _add_status_routes(app: FastAPI, state: _ServiceState) -> None:
    """GET /healthz, /readyz, /version, /metrics."""
    settings, holder, reloader = state.settings, state.holder, state.reloader

    @app.get("/healthz", responses=docs.HEALTH_RESPONSES)
    async def healthz() -> Response:
        """Liveness: the process answers."""
        return _respond({"status": "ok"})

    @app.get("/readyz", responses=docs.READY_RESPONSES)
    async def readyz(request: Request) -> Response:
        """Readiness: 200 when a model serves, 503 (with the reason) when none does. A
        bundle served without a delta that fails its check is ready: `degraded` and
        `failed_deltas` say which."""
        served = holder.current
        if not request.scope.get("state", {}).get("authenticated", True):
            # Open to probes; the model and the reason are for callers with the key.
            status = "not ready" if served is None else "ready"
            return _respond({"status": status}, status=503 if served is None else 200)
        if served is None:
            reason = (
                reloader.last_refusal.reason
                if reloader.last_refusal is not None
                else reloader.last_error or "loading the model"
            )
            return _respond({"status": "not ready", "reason": _public(reason)}, status=503)
        ready: dict[str, Any] = {"status": "ready", "model": _model_brief(served)}
        if served.info.failed_deltas:
            # Serving without a delta that fails its check: still ready, but say which.
            ready["degraded"] = _degraded(served.info.failed_deltas)
            ready["failed_deltas"] = _public(served.info.failed_deltas_list())
        if reloader.source_down is not None:
            # Serving a kept copy while the source is unreachable: still ready, but say so.
            ready["source_unreachable"] = _public(reloader.source_down)
        return _respond(ready)

    @app.get("/version", responses=docs.VERSION_RESPONSES)
    async def version() -> Response:
        """The serving model, the service's commit, and the reloader's state."""
        served = holder.current
        return _respond(
            _public(
                {
                    "model": None if served is None else served.info.as_dict(),
                    "service": {
                        "package_version": __version__,
                        "git_commit": state.git_commit,
                        "started_at": time.strftime(
                            "%Y-%m-%dT%H:%M:%SZ", time.gmtime(state.started_at)
                        ),
                    },
                    "reload": reloader.status(),
                    "limits": {
                        "max_k": settings.max_k,
                        "default_k": settings.default_k,
                        "max_question_chars": settings.max_question_chars,
                        "max_body_bytes": settings.max_body_bytes,
                        "max_batch": settings.max_batch,
                        "header_timeout": settings.header_timeout,
                        "body_timeout": settings.body_timeout,
                    },
                }
            )
        )

    @app.get("/metrics", responses=docs.METRICS_RESPONSES)
    async def metrics() -> Response:
        """Prometheus text format."""
        return Response(state.telemetry.render(), media_type=CONTENT_TYPE)


def _body_schema(model: type[BaseModel], example: str, settings: ServeSettings) -> dict[str, Any]:
    """OpenAPI request body for endpoints that parse their body themselves, with the
    limits they enforce."""
    return {
        "required": True,
        "content": {
            "application/json": {
                "schema": docs.request_schema(model.model_json_schema(), settings),
                "example": json.loads(example),
            }
        },
    }
