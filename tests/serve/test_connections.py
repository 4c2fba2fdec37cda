"""Bounded connections, against a real uvicorn server on a free port (in a thread).

Held connections (a head without its body, or nothing at all) must be closed by the
timeouts, and past the connection cap the longest-stalled one must make room: clients
that send whole requests keep being answered.
"""

from __future__ import annotations

import contextlib
import resource
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from qpr.serve.app import create_app
from qpr.serve.connections import FD_RESERVE, connection_cap, uvicorn_options
from qpr.serve.settings import ServeSettings
from qpr.serve.sources import LocalSource
from tests.serve.test_reload import IDS1, Q1, build_bundle

SETTINGS = ServeSettings(poll_seconds=0, canaries=4, default_k=3, startup_wait=60)
PARTIAL = (
    b"POST /search HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
    b"Content-Length: 100\r\n\r\n" + b'{"question": "how'
)


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bundle(tmp_path_factory.mktemp("bundle") / "v1", Q1, IDS1, seed=0)


@contextlib.contextmanager
def serving(bundle_dir: Path, settings: ServeSettings) -> Iterator[tuple[str, uvicorn.Server]]:
    app = create_app(LocalSource(bundle_dir), settings)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="warning", **uvicorn_options(settings)
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(15)


def held(url: str, payload: bytes) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    if payload:
        sock.sendall(payload)
    return sock


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def search_ok(client: httpx.Client, url: str) -> bool:
    response = client.post(f"{url}/search", json={"question": Q1[3]}, timeout=5)
    return response.status_code == 200 and response.json()["hits"][0]["question_id"] == IDS1[3]


def test_half_sent_body_gets_408_and_is_closed(bundle_dir: Path) -> None:
    settings = SETTINGS.replace(body_timeout=0.5)
    with serving(bundle_dir, settings) as (url, _), httpx.Client() as client:
        stalled = held(url, PARTIAL)
        started = time.monotonic()
        assert search_ok(client, url)  # answered meanwhile
        reply = read_all(stalled)  # ends: the server closed the connection
        assert time.monotonic() - started < 5
        assert reply.startswith(b"HTTP/1.1 408 ") and b"request_timeout" in reply
        assert b"connection: close" in reply.lower()
        stalled.close()


def test_silent_connection_is_closed_after_the_header_timeout(bundle_dir: Path) -> None:
    settings = SETTINGS.replace(header_timeout=0.5)
    with serving(bundle_dir, settings) as (url, _), httpx.Client() as client:
        silent = held(url, b"")
        half_head = held(url, b"GET /healthz HTTP/1.1\r\nHo")
        started = time.monotonic()
        assert search_ok(client, url)
        # Nothing sent: closed silently. Half a head: told why (qpr.serve.refusals).
        assert read_all(silent) == b""
        assert read_all(half_head).startswith(b"HTTP/1.1 408 ")
        assert time.monotonic() - started < 5
        silent.close()
        half_head.close()


def test_held_connections_past_the_cap_do_not_block_requests(bundle_dir: Path) -> None:
    """50 connections hold a partial body (timeouts far away); the cap is 20."""
    settings = SETTINGS.replace(max_connections=20, body_timeout=60, header_timeout=60)
    with serving(bundle_dir, settings) as (url, server):
        sockets = [held(url, PARTIAL) for _ in range(50)]
        time.sleep(0.3)
        assert len(server.server_state.connections) <= 20
        with httpx.Client() as client:
            answered = [search_ok(client, url) for _ in range(20)]
        fresh = []
        for _ in range(20):  # a new connection each time: each must displace a held one
            with httpx.Client() as client:
                fresh.append(search_ok(client, url))
        assert all(answered) and all(fresh)
        assert len(server.server_state.connections) <= 20
        for sock in sockets:
            sock.close()


def test_connection_cap_fits_the_open_files_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert connection_cap(10) == 10
    if hard != resource.RLIM_INFINITY:
        assert connection_cap(10 * hard) == hard - FD_RESERVE
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= soft  # raised, never lowered
