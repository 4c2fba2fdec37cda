"""Refusals made below the app, against a real uvicorn server on a free port (in a thread):
each answers with the service's JSON error body, as the app's own refusals do."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from qpr.serve.refusals import error_body, raw_response
from tests.serve.test_connections import PARTIAL, SETTINGS, held, read_all, serving
from tests.serve.test_reload import IDS1, Q1, build_bundle

HEAD = b"Host: localhost\r\nContent-Type: application/json\r\n"


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bundle(tmp_path_factory.mktemp("bundle") / "v1", Q1, IDS1, seed=0)


def assert_json_refusal(reply: bytes, status: int, code: str, *words: str) -> dict:
    """A whole HTTP response: the status, the JSON error shape, the request id echoed."""
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith(f"HTTP/1.1 {status} "), reply[:300]
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    assert headers["content-type"] == "application/json", reply[:300]
    assert int(headers["content-length"]) == len(body)
    parsed = json.loads(body)
    assert parsed["error"] == code and parsed["request_id"] == headers["x-request-id"], parsed
    for word in words:
        assert word in parsed["message"], parsed["message"]
    return parsed


# A head h11 cannot parse: its reason, never the bytes it quotes.
MALFORMED = [
    ("request line", b"GARBAGE\r\n\r\n", 400, "bad_request", "illegal request line"),
    ("no Host", b"GET /healthz HTTP/1.1\r\n\r\n", 400, "bad_request", "Host"),
    ("header name", b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Name: x\r\n\r\n", 400, "", ""),
    ("non-ASCII target", b"GET /caf\xc3\xa9 HTTP/1.1\r\nHost: x\r\n\r\n", 400, "", ""),
    (
        "Content-Length",
        b"POST /search HTTP/1.1\r\n" + HEAD + b"Content-Length: abc\r\n\r\n",
        400,
        "bad_request",
        "Content-Length",
    ),
    (
        "two lengths",
        b"POST /search HTTP/1.1\r\n" + HEAD + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        400,
        "bad_request",
        "conflicting",
    ),
    (
        "transfer coding",
        b"POST /search HTTP/1.1\r\n" + HEAD + b"Transfer-Encoding: gzip\r\n\r\n",
        501,
        "not_implemented",
        "chunked",
    ),
    (
        "chunk header",
        b"POST /search HTTP/1.1\r\n" + HEAD + b"Transfer-Encoding: chunked\r\n\r\nZZ\r\n{}\r\n",
        400,
        "bad_request",
        "chunk",
    ),
    # Over h11's 16 KB buffer before the head ends.
    ("head too large", b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 20_000, 431, "", "16 KB"),
]


def test_protocol_refusals_carry_the_json_error_body(bundle_dir: Path) -> None:
    with serving(bundle_dir, SETTINGS) as (url, _):
        for name, request, status, code, word in MALFORMED:
            sock = held(url, request)
            reply = read_all(sock)
            sock.close()
            body = assert_json_refusal(reply, status, code or _code(status), word)
            assert "bytearray" not in body["message"] and "caf" not in body["message"], name
            assert reply.count(b"\r\n\r\n") == 1, name  # one response, nothing after


def _code(status: int) -> str:
    return {400: "bad_request", 431: "headers_too_large"}[status]


def test_an_upgrade_request_is_answered_as_plain_http(bundle_dir: Path) -> None:
    upgrade = (
        b"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nConnection: close\r\n\r\n"
    )
    with serving(bundle_dir, SETTINGS) as (url, _):
        sock = held(url, b"GET /search HTTP/1.1\r\nHost: localhost\r\n" + upgrade)
        assert_json_refusal(read_all(sock), 405, "method_not_allowed", "GET /search")
        sock.close()


def _wait_for_heads(server, count: int) -> None:
    """Until `count` connections have sent a whole head (their request is under way)."""
    deadline = time.monotonic() + 10
    while sum(c.cycle is not None for c in server.server_state.connections) < count:
        assert time.monotonic() < deadline, "the held requests did not arrive"
        time.sleep(0.01)


def test_past_limit_concurrency_the_503_is_json(bundle_dir: Path) -> None:
    with serving(bundle_dir, SETTINGS.replace(limit_concurrency=2, body_timeout=30)) as (
        url,
        server,
    ):
        holding = held(url, PARTIAL)
        _wait_for_heads(server, 1)
        sock = held(url, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert_json_refusal(read_all(sock), 503, "too_busy", "retry")
        sock.close()
        holding.close()


def test_a_connection_evicted_mid_request_is_told_why(bundle_dir: Path) -> None:
    settings = SETTINGS.replace(max_connections=2, body_timeout=30, header_timeout=30)
    with serving(bundle_dir, settings) as (url, server):
        first, second = held(url, PARTIAL), held(url, PARTIAL)
        _wait_for_heads(server, 2)
        newcomer = held(url, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        # The longest stalled one makes room, and its client reads why.
        assert_json_refusal(read_all(first), 503, "too_many_connections", "stalled")
        reply = newcomer.recv(65536)
        assert reply.startswith(b"HTTP/1.1 200 ")
        for sock in (first, second, newcomer):
            sock.close()


def test_an_idle_connection_is_closed_silently(bundle_dir: Path) -> None:
    # After a whole request and its answer, a head timeout or an eviction says nothing:
    # there is no request to answer.
    with serving(bundle_dir, SETTINGS.replace(header_timeout=0.3, keep_alive=30)) as (url, _):
        sock = held(url, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        reply = read_all(sock)
        assert reply.startswith(b"HTTP/1.1 200 ") and reply.count(b"\r\n\r\n") == 1
        sock.close()


def test_raw_response_is_whole() -> None:
    reply = raw_response(408, "request_timeout", "late")
    assert_json_refusal(reply, 408, "request_timeout", "late")
    assert b"connection: close" in reply
    assert json.loads(error_body("x", "y", "z", [{"a": 1}]))["details"] == [{"a": 1}]
