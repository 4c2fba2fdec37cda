"""Bounded connections, against a real uvicorn server on a free port (in a thread, or
a `qpr serve` subprocess under a low open-files limit).

Held connections (a head without its body, or nothing at all) must be closed by the
timeouts, and past the connection cap the longest-stalled one must make room: clients
that send whole requests keep being answered, and accept() never runs out of descriptors.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from qpr.serve.app import create_app
from qpr.serve.connections import FD_RESERVE, CappedServer, connection_cap, uvicorn_options
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
def serving(bundle_dir: Path, settings: ServeSettings) -> Iterator[tuple[str, CappedServer]]:
    app = create_app(LocalSource(bundle_dir), settings)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="warning", **uvicorn_options(settings)
    )
    server = CappedServer(config, connection_cap(settings.max_connections))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    try:
        yield f"http://127.0.0.1:{server.port}", server
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


def search_ok(client: httpx.Client, url: str, timeout: float = 5) -> bool:
    response = client.post(f"{url}/search", json={"question": Q1[3]}, timeout=timeout)
    return response.status_code == 200 and response.json()["hits"][0]["question_id"] == str(IDS1[3])


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
        assert server.gate is not None and server.gate.open <= 20  # queued ones wait unaccepted
        for sock in sockets:
            sock.close()


def ask(sock: socket.socket, question: str) -> bytes:
    """One search over an open keep-alive socket: the response's status line."""
    body = json.dumps({"question": question}).encode()
    sock.sendall(
        b"POST /search HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body
    )
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    while len(rest) < length:
        rest += sock.recv(65536)
    return head.split(b"\r\n")[0]


def test_an_idle_keep_alive_client_outlasts_held_connections(bundle_dir: Path) -> None:
    """Cap 10: a client answered once, then idle, is not closed to make room while
    connections that sent half a request are there to close instead."""
    settings = SETTINGS.replace(max_connections=10, body_timeout=60, header_timeout=60)
    settings = settings.replace(keep_alive=60)
    with serving(bundle_dir, settings) as (url, _):
        client = held(url, b"")
        assert ask(client, Q1[3]).startswith(b"HTTP/1.1 200")
        sockets = [held(url, PARTIAL) for _ in range(30)]  # 9 get a slot, 21 queue
        time.sleep(2.5)  # the queued ones displace held ones, 9 every MIN_STALL_SECONDS
        assert ask(client, Q1[4]).startswith(b"HTTP/1.1 200")
        client.close()
        for sock in sockets:
            sock.close()


def test_started_means_listening(bundle_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`started` waits for the gate: uvicorn sets it before the gate exists, and a busy
    machine (two test workers on 2 cores) once found `started` true and no port."""
    from qpr.serve import connections

    class SlowGate(connections.AcceptGate):
        def __init__(self, *args, **kwargs) -> None:
            time.sleep(0.5)  # the window a busy machine opened, made wide
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(connections, "AcceptGate", SlowGate)
    with serving(bundle_dir, SETTINGS) as (url, server), httpx.Client() as client:
        assert isinstance(server.gate, SlowGate)
        assert search_ok(client, url)


def test_accepted_connections_send_small_writes_at_once(bundle_dir: Path) -> None:
    """TCP_NODELAY on every accepted socket: without it a keep-alive answer waits for the
    client's delayed ACK (40 ms on Linux)."""
    with serving(bundle_dir, SETTINGS) as (url, server), httpx.Client() as client:
        assert search_ok(client, url)
        (conn,) = server.server_state.connections
        sock = conn.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_websocket_upgrades_free_their_slots(bundle_dir: Path) -> None:
    """Cap 3: upgrade requests are answered as plain HTTP, and each closed one frees its
    slot (a socket handed to a WebSocket protocol never would)."""
    upgrade = (
        b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    with serving(bundle_dir, SETTINGS.replace(max_connections=3)) as (url, server):
        for _ in range(5):
            sock = held(url, upgrade)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
            sock.close()
        with httpx.Client() as client:
            assert search_ok(client, url)
        deadline = time.monotonic() + 5
        while server.gate is not None and server.gate.open and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.gate is not None and server.gate.open == 0


def hold_connections(url: str, count: int, stop: threading.Event) -> dict[str, int]:
    """`count` connections that send a head and part of a body, each reopened when the
    server closes it, in a thread until `stop`; returns its live counts."""
    host, port = url.removeprefix("http://").split(":")
    counts = {"opened": 0, "closed": 0}

    async def one() -> None:
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection(host, int(port))
                counts["opened"] += 1
                writer.write(PARTIAL)
                while not stop.is_set():
                    with contextlib.suppress(TimeoutError):
                        if not await asyncio.wait_for(reader.read(65536), 0.2):
                            counts["closed"] += 1
                            break
                writer.close()
            except OSError:
                await asyncio.sleep(0.05)

    async def all_of_them() -> None:
        await asyncio.gather(*(one() for _ in range(count)))

    threading.Thread(target=asyncio.run, args=(all_of_them(),), daemon=True).start()
    return counts


@contextlib.contextmanager
def limited_server(bundle_dir: Path, log: Path, fd_limit: int) -> Iterator[str]:
    """`qpr serve` in a subprocess under `ulimit -n fd_limit` (soft and hard)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    def ulimit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

    command = [sys.executable, "-m", "qpr.cli", "serve", "--models-dir", str(bundle_dir)]
    env = {**os.environ, "QPR_SERVE_POLL_SECONDS": "0", "QPR_SERVE_STARTUP_WAIT": "60"}
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [*command, "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=ulimit,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            assert server.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "not ready in 60 s"
            time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(30)


@pytest.mark.slow
def test_held_connections_under_a_low_open_files_limit(bundle_dir: Path, tmp_path: Path) -> None:
    """`ulimit -n 128` (a cap of 64) and 300 connections holding partial bodies, each
    reopened when closed: normal requests are all answered, and accept() never fails for
    want of a descriptor (asyncio's own accept loop did, and logged it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.skip("the holder needs 1,024 open files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1024), hard))
    log = tmp_path / "server.log"
    stop = threading.Event()
    try:
        with limited_server(bundle_dir, log, fd_limit=128) as url:
            counts = hold_connections(url, 300, stop)
            time.sleep(2)  # 64 slots held, the rest queued
            with httpx.Client() as client:  # keep-alive
                kept = [search_ok(client, url, 15) for _ in range(20)]
            fresh = []
            for _ in range(3):  # each waits its turn in the listen queue
                with httpx.Client() as client:
                    fresh.append(search_ok(client, url, 15))
            stop.set()
    finally:
        stop.set()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert all(kept) and all(fresh)
    assert counts["closed"] > 0  # the cap was reached: held ones made room
    text = log.read_text(errors="replace")
    assert "Too many open files" not in text and "out of system resource" not in text
    assert "Traceback" not in text


def test_connection_cap_fits_the_open_files_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert connection_cap(10) == 10
    if hard != resource.RLIM_INFINITY:
        assert connection_cap(10 * hard) == hard - FD_RESERVE
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= soft  # raised, never lowered
