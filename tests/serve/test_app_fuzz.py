"""Property: whatever a client sends to /search or /search/batch, the service answers with
a JSON success or a JSON 4xx, never a 5xx (Hypothesis, derandomized: the same cases on
every run, so CI is stable)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qpr.serve.app import create_app
from qpr.serve.sources import LocalSource
from tests.serve.test_app import QIDS, QUESTIONS, SETTINGS, build_bundle

KEY = "fuzz-key-0123456789abcdef"
FUZZ = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,  # no .hypothesis/ folder in the checkout
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Any text, lone surrogates included (st.text leaves out category Cs by default).
TEXT = st.text(st.characters(exclude_categories=()), max_size=40)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=10**18, max_value=10**40)
    | st.floats(allow_nan=True, allow_infinity=True)
    | TEXT
    | st.sampled_from(QUESTIONS)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TEXT, inner, max_size=5),
    max_leaves=20,
)
SURROGATES = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1)
QUESTION = (
    TEXT
    | st.sampled_from(QUESTIONS)
    | st.text(max_size=300)
    | st.tuples(st.sampled_from(QUESTIONS), SURROGATES).map("".join)
)
K = st.integers(-5, 30) | st.none() | SCALARS
THRESHOLD = st.floats() | st.none() | SCALARS
# Well-formed requests with odd values, so that the checks past parsing (and the search
# itself) are reached, and objects whose fields are each right or wrong.
SEARCHES = st.fixed_dictionaries({"question": QUESTION}, optional={"k": K, "threshold": THRESHOLD})
BATCHES = st.fixed_dictionaries(
    {"questions": st.lists(QUESTION, max_size=6)}, optional={"k": K, "threshold": THRESHOLD}
)
REQUESTS = (
    SEARCHES
    | BATCHES
    | st.fixed_dictionaries(
        {},
        optional={
            "question": QUESTION | JSON,
            "questions": st.lists(QUESTION | SCALARS, max_size=6) | JSON,
            "k": K | JSON,
            "threshold": THRESHOLD | JSON,
            "top_k": SCALARS,
        },
    )
)


def _dumps(value: Any, ascii_only: bool) -> bytes:
    # ensure_ascii=False + surrogatepass: a lone surrogate as raw (invalid UTF-8) bytes.
    return json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


# Around the limits: ints of 4300+ digits (Python's int-from-text limit), floats past
# 1e308, nesting around the parser's recursion limit (about 1000).
DIGITS = st.integers(1, 40) | st.integers(4200, 5000)
DEPTH = st.integers(1, 50) | st.integers(900, 4000)
BODIES = st.one_of(
    st.binary(max_size=300),
    st.builds(_dumps, JSON, st.booleans()),
    st.builds(_dumps, REQUESTS, st.booleans()),
    st.builds(_dumps, REQUESTS, st.just(True)),
    DIGITS.map(lambda n: b'{"question": "hi", "k": 1' + b"0" * n + b"}"),
    DIGITS.map(lambda n: b'{"question": "hi", "threshold": 1e' + b"9" * n + b"}"),
    DEPTH.map(lambda n: b"[" * n + b"]" * n),
    DEPTH.map(lambda n: b'{"questions": ' + b"[" * n + b"]" * n + b"}"),
)
HEADER_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60)
CONTENT_TYPES = st.sampled_from(
    [
        "application/json",
        "application/json; charset=utf-8",
        "application/json; charset=latin-1",
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        ";;;",
    ]
) | HEADER_TEXT.map(lambda t: "application/json; " + t)
HEADERS = st.fixed_dictionaries(
    {},
    optional={
        "content-type": CONTENT_TYPES,
        "x-request-id": HEADER_TEXT,
        "authorization": st.sampled_from([f"Bearer {KEY}", "Bearer", "Basic x"]) | HEADER_TEXT,
        "x-api-key": st.sampled_from([KEY, ""]) | HEADER_TEXT,
        "host": st.sampled_from(["localhost", "localhost:8000", "[::1]:1", "evil.example"])
        | HEADER_TEXT,
        "accept": HEADER_TEXT,
    },
)
PATHS = st.sampled_from(["/search", "/search/batch"])
# (path, body): any body at either endpoint, or a well-formed request for its own one.
CASES = (
    st.tuples(PATHS, BODIES)
    | st.tuples(st.just("/search"), st.builds(_dumps, SEARCHES, st.booleans()))
    | st.tuples(st.just("/search/batch"), st.builds(_dumps, BATCHES, st.booleans()))
)


@pytest.fixture(scope="module")
def clients(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, TestClient]]:
    """An open service, and one with a key and a Host list."""
    bundle = LocalSource(build_bundle(tmp_path_factory.mktemp("models"), QUESTIONS, QIDS))
    keyed = SETTINGS.replace(api_key=KEY, allowed_hosts=("localhost", "::1"))
    with (
        TestClient(create_app(bundle, SETTINGS)) as open_client,
        TestClient(create_app(bundle, keyed), base_url="http://localhost") as keyed_client,
    ):
        yield {"open": open_client, "keyed": keyed_client}


def _assert_answered(response: Any) -> None:
    """2xx with the endpoint's fields, or a 4xx in the service's error shape."""
    assert response.status_code < 500, response.text
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    if response.status_code >= 400:
        assert {"error", "message", "request_id"} <= set(body), body
        assert isinstance(body["message"], str) and body["message"], body
    else:
        assert "hits" in body or "results" in body, body


@FUZZ
@given(case=CASES)
def test_any_body_gets_json_and_no_5xx(
    clients: dict[str, TestClient], case: tuple[str, bytes]
) -> None:
    path, body = case
    headers = {"content-type": "application/json"}  # other types: the test below
    _assert_answered(clients["open"].post(path, content=body, headers=headers))


@FUZZ
@given(path=PATHS, body=st.builds(_dumps, REQUESTS, st.just(True)) | BODIES, headers=HEADERS)
def test_any_headers_get_json_and_no_5xx(
    clients: dict[str, TestClient], path: str, body: bytes, headers: dict[str, str]
) -> None:
    response = clients["keyed"].post(path, content=body, headers=headers)
    _assert_answered(response)
    if response.status_code < 300:
        # only a request with the key gets through
        assert headers.get("x-api-key", "").strip() == KEY or KEY in headers.get(
            "authorization", ""
        )
