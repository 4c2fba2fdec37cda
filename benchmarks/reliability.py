#!/usr/bin/env python
"""Reliability of the search service under hostile input, held connections and hot swaps.

    python benchmarks/reliability.py                # all sections, writes docs/results/
    python benchmarks/reliability.py --only held    # one section (others kept from the JSON)
    python benchmarks/reliability.py --fresh        # every section again
    python benchmarks/reliability.py --quick --out /tmp/rel   # smoke run, ~2 min

Each section starts its own `qpr serve` subprocess on 127.0.0.1 (where API keys, when
configured, are not required) over a copy of the models bundle (default models/), and
talks to it over raw sockets with keep-alive (one asyncio loop: fast enough to send a few
thousand requests a second on 2 cores, and able to send what no HTTP library would):

1. fuzz: a hand-made hostile set (~90 requests: deep nesting, lone surrogates, wrong
   types, huge numbers, bad content types, truncated and oversize bodies, broken framing),
   then ``--fuzz-requests`` random and mutated requests. Target: no 5xx.
2. held: normal /search traffic (4 keep-alive connections) measured idle, then while a
   second process holds ``--held`` connections that each sent a head and part of a body
   (reconnecting whenever the server closes one), with the server's open-files limit at
   ``--server-fd-limit`` (256: the limit under which 300 such connections once made every
   request time out). Targets: no timeouts, p99 within 2x the idle p99; the server log's
   growth is recorded.
3. swaps: the models dir is a symlink flipped between two valid bundles (different
   search configs, so different fingerprints) ``--swaps`` times while 4 connections
   hammer /search. Target: no failed request.
4. corrupt: two deltas added, the first one's vectors file overwritten, `qpr serve`
   started on it (poll 0.5 s). Targets: /readyz 200 naming that delta, the base and the
   good delta served, `qpr index add` refused in one line with nothing written, and the
   state after `qpr index drop` served within 5 s (the reloader's backoff once reached 60 s).

Resumable: each finished section is stored in the JSON at once; a later run skips the
sections already there (``--fresh`` or ``--only`` to redo them).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import random
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Run as scripts (python benchmarks/x.py): their own folder is on sys.path.
from machine_info import describe

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "docs" / "results"
NAME = "reliability"
SECTIONS = ("fuzz", "held", "swaps", "corrupt")
SEED = 27
CLIENT_TIMEOUT = 5.0  # a normal request slower than this counts as timed out
NORMAL_CONNECTIONS = 4
# Planted in the fuzzed server's environment, as a password in MLFLOW_TRACKING_URI and a
# secret-named variable: no response body and no log line may ever hold it.
PLANTED = "planted-s3cret-7f2c9a"
PLANTED_ENV = {
    "MLFLOW_TRACKING_URI": f"http://qpr:{PLANTED}@127.0.0.1:9",
    "QPR_BENCH_API_TOKEN": PLANTED,
}


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def raise_fd_limit(wanted: int) -> int:
    """The soft open-files limit, raised towards `wanted` where the hard limit allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# --------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------


class Server:
    """`qpr serve` in a subprocess; its log goes to a file whose size is watched."""

    def __init__(self, models: Path, log_path: Path, fd_limit: int | None = None, **env: str):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.log_path = log_path
        environ = {
            **os.environ,
            "QPR_SERVE_POLL_SECONDS": "0",
            "QPR_SERVE_ACCESS_LOG": "false",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
            **env,
        }
        command = [sys.executable, "-m", "qpr.cli", "serve", "--models-dir", str(models)]
        command += ["--host", "127.0.0.1", "--port", str(self.port)]

        def limit_fds() -> None:
            if fd_limit is not None:
                hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
                resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, hard))

        self._log = open(log_path, "wb")  # noqa: SIM115 - lives with the process
        self.process = subprocess.Popen(
            command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=environ,
            cwd=ROOT,
            preexec_fn=limit_fds,
        )
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: {self.log_path.read_text()[-2000:]}")
            if get(self.port, "/readyz")[0] == 200:
                return
            time.sleep(0.25)
        raise RuntimeError("server not ready within 300 s")

    def log_bytes(self) -> int:
        return self.log_path.stat().st_size

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self._log.close()


def get(port: int, path: str) -> tuple[int, bytes]:
    """A one-off GET (status 0 when the server does not answer)."""
    import http.client

    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", path)
        response = conn.getresponse()
        status, body = response.status, response.read()
        conn.close()
        return status, body
    except OSError:
        return 0, b""


# --------------------------------------------------------------------------------------
# A raw HTTP/1.1 client: sends bytes as given, reads one response
# --------------------------------------------------------------------------------------


def http_request(
    method: str, path: str, body: bytes = b"", content_type: str | None = "application/json"
) -> bytes:
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    if content_type is not None:
        head.append(f"Content-Type: {content_type}")
    if body or method in {"POST", "PUT", "PATCH"}:
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


async def read_response(
    reader: asyncio.StreamReader, head_request: bool = False
) -> tuple[int, bytes, bool]:
    """(status, body, server closes) of one response; raises on EOF or bad framing."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    # A response to HEAD announces its length but sends no body.
    body = await reader.readexactly(length) if length and not head_request else b""
    return status, body, headers.get("connection", "").lower() == "close"


class Connection:
    """One keep-alive connection, reopened when the server closes it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def send(self, raw: bytes, timeout: float = CLIENT_TIMEOUT) -> tuple[int, bytes]:
        """Status and body; status 0: the server closed without answering."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        try:
            self.writer.write(raw)
            reading = read_response(self.reader, raw.startswith(b"HEAD "))
            status, body, closes = await asyncio.wait_for(reading, timeout)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, IndexError):
            await self.close()  # closed unanswered, or a reply that is not HTTP
            return 0, b""
        except BaseException:
            await self.close()
            raise
        if closes:
            await self.close()
        return status, body

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await self.writer.wait_closed()
        self.reader = self.writer = None


def percentiles_ms(latencies: Sequence[float]) -> dict[str, float]:
    if not latencies:
        return {"p50": float("nan"), "p99": float("nan")}
    ordered = sorted(latencies)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {
        "p50": round(pick(0.50) * 1000, 3),
        "p99": round(pick(0.99) * 1000, 3),
        "max": round(ordered[-1] * 1000, 3),
        "mean": round(statistics.fmean(ordered) * 1000, 3),
    }


def questions(models: Path, n: int = 200) -> list[str]:
    import pyarrow.parquet as pq

    texts = pq.read_table(models / "index" / "questions.parquet", columns=["text"])
    column = texts.column("text").to_pylist()
    return [column[i] for i in random.Random(SEED).sample(range(len(column)), min(n, len(column)))]


def search_request(question: str) -> bytes:
    return http_request("POST", "/search", json.dumps({"question": question}).encode())


# --------------------------------------------------------------------------------------
# 1. fuzz
# --------------------------------------------------------------------------------------


def hostile_set() -> list[tuple[str, bytes]]:
    """Hand-made requests, each a known way to break a JSON service."""
    post = lambda body, ct="application/json": http_request("POST", "/search", body, ct)  # noqa: E731
    batch = lambda body: http_request("POST", "/search/batch", body)  # noqa: E731
    cases: list[tuple[str, bytes]] = []
    for depth in (10, 100, 1000, 10_000, 50_000):
        cases.append((f"nested arrays {depth}", post(b"[" * depth + b"]" * depth)))
        cases.append((f"nested objects {depth}", post(b'{"a":' * depth + b"1" + b"}" * depth)))
        cases.append((f"unclosed nesting {depth}", post(b"[" * depth)))
    for escape in ("\\ud800", "\\udfff", "\\ud800\\ud800", "a\\udc00b", "\\ud83d"):
        cases.append((f"lone surrogate {escape}", post(f'{{"question": "{escape}"}}'.encode())))
        cases.append(
            (f"surrogate in batch {escape}", batch(f'{{"questions": ["{escape}"]}}'.encode()))
        )
    for name, value in [
        ("int question", "1"),
        ("null question", "null"),
        ("list question", '["a"]'),
        ("object question", '{"a": 1}'),
        ("bool question", "true"),
        ("float question", "1.5"),
    ]:
        cases.append((name, post(f'{{"question": {value}}}'.encode())))
    for name, k in [
        ("k string", '"5"'),
        ("k float", "5.0"),
        ("k huge", "1" + "0" * 400),
        ("k negative", "-1"),
        ("k zero", "0"),
        ("k bool", "true"),
        ("k 1e400", "1e400"),
        ("k list", "[5]"),
    ]:
        cases.append((name, post(f'{{"question": "how", "k": {k}}}'.encode())))
    for name, t in [
        ("threshold huge", "1e400"),
        ("threshold -huge", "-1e400"),
        ("threshold NaN", "NaN"),
        ("threshold Infinity", "Infinity"),
        ("threshold negative", "-0.5"),
        ("threshold string", '"0.5"'),
        ("threshold huge int", "9" * 5000),
    ]:
        cases.append((name, post(f'{{"question": "how", "threshold": {t}}}'.encode())))
    for ct in (
        "text/plain",
        "application/xml",
        "multipart/form-data; boundary=x",
        "application/x-www-form-urlencoded",
        "application/json; charset=latin-1",
        "\x00\x01",
        "a" * 4000,
        "",
    ):
        cases.append((f"content type {ct[:24]!r}", post(b'{"question": "how"}', ct)))
    cases.append(("no content type", post(b'{"question": "how"}', None)))
    cases += [
        ("empty body", post(b"")),
        ("whitespace body", post(b"   \n ")),
        ("invalid utf-8", post(b'{"question": "\xff\xfe"}')),
        ("utf-16 body", post('{"question": "how"}'.encode("utf-16"))),
        ("bom", post(b'\xef\xbb\xbf{"question": "how"}')),
        ("json string", post(b'"how"')),
        ("json array", post(b'["how"]')),
        ("json null", post(b"null")),
        ("duplicate keys", post(b'{"question": "a", "question": 1}')),
        ("unknown field", post(b'{"question": "how", "top_k": 3}')),
        ("question 1 MB", post(json.dumps({"question": "a " * 500_000}).encode())),
        ("question 999 chars", post(json.dumps({"question": "é" * 999}).encode())),
        ("only punctuation", post(b'{"question": "?!?!"}')),
        ("control characters", post(json.dumps({"question": "\x00\x1b[31m\x07"}).encode())),
        ("batch of 10k", batch(json.dumps({"questions": ["a"] * 10_000}).encode())),
        ("batch not list", batch(b'{"questions": "a"}')),
        ("batch of ints", batch(b'{"questions": [1, 2]}')),
        ("batch empty", batch(b'{"questions": []}')),
    ]
    return cases + framing_cases()


def framing_cases() -> list[tuple[str, bytes]]:
    """Requests broken at the HTTP level: lengths, chunking, heads, methods, paths."""
    return [
        ("truncated body", b'POST /search HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{"q'),
        (
            "content-length lies high",
            b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{}",
        ),
        (
            "content-length negative",
            b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
        ),
        (
            "content-length not a number",
            b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        ),
        (
            "content-length huge",
            b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n",
        ),
        (
            "two content-lengths",
            b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        ),
        (
            "chunked oversize",
            b"POST /search HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"".join(b"4000\r\n" + b"a" * 0x4000 + b"\r\n" for _ in range(20))
            + b"0\r\n\r\n",
        ),
        (
            "chunked truncated",
            b"POST /search HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
        ),
        (
            "bad chunk size",
            b"POST /search HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        ),
        ("garbage request line", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n"),
        ("http/0.9", b"GET /healthz\r\n\r\n"),
        ("no host", b"GET /healthz HTTP/1.1\r\n\r\n"),
        (
            "header 100 KB",
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n",
        ),
        ("header without colon", b"GET /healthz HTTP/1.1\r\nHost: x\r\nbroken\r\n\r\n"),
        ("bad method", b"G\x00T /healthz HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("unknown method", http_request("BREW", "/search", b"{}")),
        ("path traversal", http_request("GET", "/../../etc/passwd")),
        ("path 10 KB", http_request("GET", "/" + "a" * 10_000)),
        ("percent garbage path", http_request("GET", "/%ff%fe%00")),
        (
            "bad request id",
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Request-ID: \xff\x00<script>\r\n\r\n",
        ),
        (
            "headers only, no body",
            b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n",
        ),
        ("incomplete head", b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Le"),
    ]


async def send_once(port: int, raw: bytes, timeout: float) -> int:
    """Status of a request on a fresh connection; 0 when closed unanswered, -1 timeout."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return 0
    try:
        writer.write(raw)
        reading = read_response(reader, raw.startswith(b"HEAD "))
        status, _, _ = await asyncio.wait_for(reading, timeout)
        return status
    except (asyncio.IncompleteReadError, ConnectionError, ValueError, IndexError):
        return 0
    except TimeoutError:
        return -1
    finally:
        writer.close()


def random_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 4 else 6)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.choice([0, -1, 1, 2**63, -(2**64), 10**30, rng.randrange(-1000, 1000)])
    if kind == 2:
        return rng.choice([0.5, -1e308, 1e-308, 3.14, float(rng.random())])
    if kind in (3, 4, 5):
        alphabet = 'abc xyz?!éß中\x00\n"\\' + chr(rng.randrange(0x20, 0x2FFF))
        return "".join(rng.choice(alphabet) for _ in range(rng.choice([0, 1, 5, 40, 300, 1200])))
    if kind in (6, 7):
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(5))]
    keys = ["question", "questions", "k", "threshold", "x", ""]
    return {rng.choice(keys): random_json(rng, depth + 1) for _ in range(rng.randrange(4))}


def random_request(rng: random.Random, texts: list[str]) -> bytes:
    """One random request: mostly well-formed HTTP with a hostile body, some valid ones."""
    roll = rng.random()
    path = rng.choice(["/search", "/search", "/search/batch"])
    if roll < 0.15:
        return search_request(rng.choice(texts))
    if roll < 0.45:
        payload = random_json(rng)
        if rng.random() < 0.6:
            field = "questions" if path.endswith("batch") else "question"
            payload = {field: payload, **({"k": random_json(rng)} if rng.random() < 0.3 else {})}
        body = json.dumps(payload, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")
        return http_request("POST", path, body)
    if roll < 0.75:  # a valid body, mutated byte by byte
        body = bytearray(json.dumps({"question": rng.choice(texts), "k": 5}).encode())
        for _ in range(rng.randrange(1, 6)):
            op, at = rng.randrange(3), rng.randrange(len(body))
            if op == 0:
                body[at] = rng.randrange(256)
            elif op == 1:
                del body[at : at + rng.randrange(1, 8)]
            else:
                body[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 8)))
            if not body:
                break
        return http_request("POST", path, bytes(body))
    if roll < 0.85:
        body = bytes(rng.randrange(256) for _ in range(rng.choice([1, 10, 100, 2000])))
        content_type = rng.choice(
            ["application/json", "text/plain", None, "application/octet-stream"]
        )
        return http_request("POST", path, body, content_type)
    method = rng.choice(["GET", "DELETE", "PUT", "OPTIONS", "HEAD", "PATCH"])
    target = rng.choice(
        ["/search", "/healthz", "/readyz", "/version", "/metrics", "/x", "/search?k=5"]
    )
    return http_request(method, target, b"{}" if method in {"PUT", "PATCH"} else b"")


async def fuzz_random(port: int, total: int, texts: list[str], workers: int = 16) -> dict[str, Any]:
    statuses: Counter[int] = Counter()
    remaining, leaks = total, 0

    async def worker(index: int) -> None:
        nonlocal remaining, leaks
        rng = random.Random(SEED * 1000 + index)
        conn = Connection(port)
        while remaining > 0:
            remaining -= 1
            try:
                status, body = await conn.send(random_request(rng, texts), timeout=30)
                leaks += PLANTED.encode() in body
            except TimeoutError:
                status = -1
                await conn.close()
            statuses[status] += 1
        await conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(workers)))
    seconds = time.perf_counter() - started
    return {
        "requests": total,
        "seconds": round(seconds, 1),
        "requests_per_s": round(total / seconds, 1),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "status_5xx": sum(v for k, v in statuses.items() if k >= 500),
        "unanswered": statuses.get(0, 0),
        "timeouts": statuses.get(-1, 0),
        "bodies_with_the_secret": leaks,
    }


def section_fuzz(models: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    server = Server(models, work / "fuzz.log", **PLANTED_ENV)
    try:
        cases = hostile_set()
        say(f"fuzz: {len(cases)} hostile requests")

        async def hostile() -> list[int]:
            return await asyncio.gather(*(send_once(server.port, raw, 30) for _, raw in cases))

        codes = asyncio.run(hostile())
        by_case = {name: code for (name, _), code in zip(cases, codes, strict=True)}
        say(f"fuzz: {args.fuzz_requests:,} random requests")
        texts = questions(models)
        random_part = asyncio.run(fuzz_random(server.port, args.fuzz_requests, texts))
        alive = get(server.port, "/readyz")[0]
        status_pages = [get(server.port, p)[1] for p in ("/readyz", "/version", "/metrics")]
        log_bytes = server.log_bytes()
    finally:
        server.stop()
    leaked = sum(PLANTED.encode() in page for page in status_pages)
    leaked_log = (work / "fuzz.log").read_bytes().count(PLANTED.encode())
    hostile_codes = Counter(by_case.values())
    return {
        "hostile": {
            "requests": len(cases),
            "statuses": {str(k): v for k, v in sorted(hostile_codes.items())},
            "status_5xx": sum(v for k, v in hostile_codes.items() if k >= 500),
            "cases": by_case,
        },
        "random": random_part,
        "ready_after": alive,
        "server_log_bytes": log_bytes,
        "secret": {
            "status_pages_with_it": leaked,
            "log_lines_with_it": leaked_log,
            "bodies_with_it": random_part["bodies_with_the_secret"],
        },
    }


# --------------------------------------------------------------------------------------
# 2. held connections
# --------------------------------------------------------------------------------------

PARTIAL = (
    b"POST /search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Content-Length: 1000\r\n\r\n" + b'{"question": "how do'
)


async def hold(port: int, count: int, seconds: float) -> None:
    """`count` connections that send a head and part of a body, reopened when closed."""
    opened = closed = 0
    stop = time.monotonic() + seconds

    async def one() -> None:
        nonlocal opened, closed
        while time.monotonic() < stop:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                opened += 1
                writer.write(PARTIAL)
                await asyncio.wait_for(reader.read(), stop - time.monotonic())  # until closed
                closed += 1
                writer.close()
            except (OSError, TimeoutError):
                await asyncio.sleep(0.05)

    async def report() -> None:
        while time.monotonic() < stop:
            await asyncio.sleep(1)
            print(json.dumps({"opened": opened, "closed": closed}), flush=True)

    await asyncio.gather(report(), *(one() for _ in range(count)))


async def normal_traffic(port: int, texts: list[str], seconds: float) -> dict[str, Any]:
    latencies: list[float] = []
    outcomes: Counter[str] = Counter()
    stop = time.monotonic() + seconds

    async def worker(index: int) -> None:
        conn = Connection(port)
        i = index
        while time.monotonic() < stop:
            i += NORMAL_CONNECTIONS
            t0 = time.perf_counter()
            try:
                status, _ = await conn.send(search_request(texts[i % len(texts)]))
            except TimeoutError:
                outcomes["timeout"] += 1
                await conn.close()
                continue
            except OSError:
                outcomes["connection error"] += 1
                await conn.close()
                continue
            if status == 200:
                latencies.append(time.perf_counter() - t0)
                outcomes["ok"] += 1
            else:
                outcomes[f"status {status}" if status else "closed unanswered"] += 1
        await conn.close()

    await asyncio.gather(*(worker(i) for i in range(NORMAL_CONNECTIONS)))
    return {
        "requests": sum(outcomes.values()),
        "outcomes": dict(outcomes),
        **percentiles_ms(latencies),
    }


def section_held(models: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    client_limit = raise_fd_limit(args.held + 256)
    runs = [held_run(models, work, args, int(limit)) for limit in args.server_fd_limits.split(",")]
    return {
        "held_connections": args.held,
        "client_fd_limit": client_limit,
        "phase_seconds": args.phase_seconds,
        "normal_connections": NORMAL_CONNECTIONS,
        "client_timeout_s": CLIENT_TIMEOUT,
        "runs": runs,
    }


def held_run(models: Path, work: Path, args: argparse.Namespace, fd_limit: int) -> dict[str, Any]:
    """Idle, then held, against one server whose open-files limit is `fd_limit`."""
    server = Server(models, work / f"held-{fd_limit}.log", fd_limit=fd_limit)
    texts = questions(models)
    try:
        asyncio.run(normal_traffic(server.port, texts, 3))  # warm-up, not counted
        say(f"held: idle run, server open-files limit {fd_limit}")
        log0 = server.log_bytes()
        idle = asyncio.run(normal_traffic(server.port, texts, args.phase_seconds))
        idle["log_bytes"] = server.log_bytes() - log0
        say(f"held: {args.held} held connections")
        attacker = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "_hold",
                str(server.port),
                str(args.held),
                str(args.phase_seconds + 10),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(5)  # let them all connect and settle
        log0 = server.log_bytes()
        loaded = asyncio.run(normal_traffic(server.port, texts, args.phase_seconds))
        loaded["log_bytes"] = server.log_bytes() - log0
        out, _ = attacker.communicate(timeout=120)
        counts = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        loaded["held_opened"] = counts[-1]["opened"] if counts else None
        loaded["held_closed_by_server"] = counts[-1]["closed"] if counts else None
        alive = get(server.port, "/readyz")[0]
        log_total = server.log_bytes()
        log_tail = server.log_path.read_text(errors="replace").splitlines()[-8:]
    finally:
        server.stop()
    return {
        "server_fd_limit": fd_limit,
        "idle": idle,
        "held": loaded,
        "p99_ratio": round(loaded["p99"] / idle["p99"], 2) if idle["p99"] else None,
        "ready_after": alive,
        "server_log_bytes": log_total,
        "server_log_tail": log_tail,
    }


# --------------------------------------------------------------------------------------
# 3. hot swaps
# --------------------------------------------------------------------------------------


def two_bundles(models: Path, work: Path) -> tuple[Path, Path]:
    """Copies of the bundle that differ in their search config (so in fingerprint)."""
    first = Path(shutil.copytree(models, work / "bundle-a", ignore=shutil.ignore_patterns(".*")))
    second = Path(shutil.copytree(first, work / "bundle-b"))
    config = json.loads((second / "search.json").read_text())
    config["threshold"] = float(config.get("threshold") or 1.0) * 1.001
    (second / "search.json").write_text(json.dumps(config, indent=2))
    return first, second


def fingerprint(port: int) -> str | None:
    status, body = get(port, "/version")
    return json.loads(body)["model"]["fingerprint"] if status == 200 else None


async def hammer_while_swapping(
    port: int, texts: list[str], link: Path, targets: tuple[Path, Path], swaps: int
) -> dict[str, Any]:
    outcomes: Counter[str] = Counter()
    by_model: Counter[str] = Counter()
    latencies: list[float] = []
    done = asyncio.Event()

    async def worker(index: int) -> None:
        conn = Connection(port)
        i = index
        while not done.is_set():
            i += NORMAL_CONNECTIONS
            t0 = time.perf_counter()
            try:
                status, body = await conn.send(search_request(texts[i % len(texts)]))
            except (TimeoutError, OSError):
                outcomes["timeout or error"] += 1
                await conn.close()
                continue
            if status == 200:
                latencies.append(time.perf_counter() - t0)
                outcomes["ok"] += 1
                by_model[json.loads(body)["model"]["fingerprint"][:12]] += 1
            else:
                outcomes[f"status {status}" if status else "closed unanswered"] += 1
        await conn.close()

    seen = []

    async def flipper() -> None:
        await asyncio.sleep(1)
        for n in range(swaps):
            before = await asyncio.to_thread(fingerprint, port)
            staged = link.with_name(".flip")
            staged.unlink(missing_ok=True)
            staged.symlink_to(targets[(n + 1) % 2])
            os.replace(staged, link)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                now = await asyncio.to_thread(fingerprint, port)
                if now != before:
                    seen.append(round(60 - (deadline - time.monotonic()), 2))
                    break
            await asyncio.sleep(1)
        done.set()

    await asyncio.gather(flipper(), *(worker(i) for i in range(NORMAL_CONNECTIONS)))
    return {
        "swaps_asked": swaps,
        "swaps_seen": len(seen),
        "seconds_to_swap": seen,
        "requests": sum(outcomes.values()),
        "outcomes": dict(outcomes),
        "failed": sum(v for k, v in outcomes.items() if k != "ok"),
        "answered_by_model": dict(by_model),
        **percentiles_ms(latencies),
    }


def section_swaps(models: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    first, second = two_bundles(models, work)
    link = work / "current"
    link.unlink(missing_ok=True)
    link.symlink_to(first)
    server = Server(link, work / "swaps.log", QPR_SERVE_POLL_SECONDS="0.5")
    try:
        result = asyncio.run(
            hammer_while_swapping(server.port, questions(models), link, (first, second), args.swaps)
        )
        result["poll_seconds"] = 0.5
        status, body = get(server.port, "/version")
        result["reloader"] = json.loads(body)["reload"] if status == 200 else None
    finally:
        server.stop()
    return result


# --------------------------------------------------------------------------------------
# 4. a corrupt delta
# --------------------------------------------------------------------------------------

# Questions no bundle serves yet: the two deltas' (the first one is then corrupted).
DELTA_QUESTIONS = (
    ("how do i descale my espresso machine", "can i freeze fresh basil leaves"),
    ("how do i clean a cast iron skillet", "why does my sourdough not rise"),
)
REPAIR_BOUND_S = 5.0


def search_top(port: int, question: str) -> tuple[int, str | None]:
    """(status, text of the top hit) of one POST /search."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request(
        "POST",
        "/search",
        json.dumps({"question": question, "k": 1}),
        {"Content-Type": "application/json"},
    )
    response = conn.getresponse()
    status, body = response.status, json.loads(response.read())
    conn.close()
    hits = body.get("hits") or [{}]
    return status, hits[0].get("text")


def qpr_command(*args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "qpr.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def section_corrupt(models: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "src"))
    import pandas as pd

    from qpr.artifacts import DELTA_VECTORS_FILE, DELTAS_MANIFEST_FILE
    from qpr.deltas.add import add_questions
    from qpr.deltas.format import delta_dir
    from qpr.io import file_sha256

    bundle = Path(shutil.copytree(models, work / "corrupt", ignore=shutil.ignore_patterns(".*")))
    numbers = []
    for i, texts in enumerate(DELTA_QUESTIONS):
        ids = [9_000_000_000 + 10 * i + j for j in range(len(texts))]
        frame = pd.DataFrame({"question_id": ids, "text": list(texts), "cluster_id": -1})
        numbers.append(int(add_questions(bundle, frame)["number"]))
    bad, good = numbers
    (bundle / delta_dir(bad) / DELTA_VECTORS_FILE).write_bytes(b"not an index")

    started = time.perf_counter()
    server = Server(bundle, work / "corrupt.log", QPR_SERVE_POLL_SECONDS="0.5")
    try:
        out: dict[str, Any] = {
            "poll_seconds": 0.5,
            "seconds_to_ready": round(time.perf_counter() - started, 2),
        }
        status, body = get(server.port, "/readyz")
        ready = json.loads(body)
        out["readyz_status"] = status
        out["readyz_failed_deltas"] = [d["delta"] for d in ready.get("failed_deltas", [])]
        out["bad_delta"], out["good_delta"] = bad, good
        base = questions(models, 1)[0]
        served = {
            "base question": search_top(server.port, base)[1] == base,
            "good delta's question": search_top(server.port, DELTA_QUESTIONS[1][0])[1]
            == DELTA_QUESTIONS[1][0],
            "bad delta's question": search_top(server.port, DELTA_QUESTIONS[0][0])[1]
            == DELTA_QUESTIONS[0][0],
        }
        out["found_at_top"] = served

        more = work / "more.txt"
        more.write_text("how do i sharpen a kitchen knife\n")
        manifest = file_sha256(bundle / DELTAS_MANIFEST_FILE)
        refused = qpr_command("index", "add", str(more), "--models-dir", str(bundle), "--local")
        out["add_exit_code"] = refused.returncode
        out["add_output_lines"] = len((refused.stdout + refused.stderr).strip().splitlines())
        out["add_said"] = " ".join((refused.stdout + refused.stderr).split())[:300]
        out["add_wrote_nothing"] = file_sha256(bundle / DELTAS_MANIFEST_FILE) == manifest

        dropped = qpr_command("index", "drop", str(bad), "--models-dir", str(bundle), "--local")
        out["drop_exit_code"] = dropped.returncode
        repaired_at = time.perf_counter()
        deadline = repaired_at + 90
        while time.perf_counter() < deadline:
            status, body = get(server.port, "/readyz")
            if status == 200 and "failed_deltas" not in json.loads(body):
                break
            time.sleep(0.05)
        out["seconds_to_repaired_state"] = round(time.perf_counter() - repaired_at, 2)
        out["repaired_readyz"] = json.loads(get(server.port, "/readyz")[1])
        out["good_delta_after_drop"] = (
            search_top(server.port, DELTA_QUESTIONS[1][1])[1] == DELTA_QUESTIONS[1][1]
        )
        out["tracebacks_in_log"] = server.log_path.read_text(errors="replace").count("Traceback")
    finally:
        server.stop()
    return out


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    import fastapi
    import h11
    import uvicorn

    return describe(
        ROOT,
        {"fastapi": fastapi.__version__, "uvicorn": uvicorn.__version__, "h11": h11.__version__},
        load_average=[round(x, 2) for x in os.getloadavg()],
    )


def targets(sections: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    rows = []
    if "fuzz" in sections:
        f = sections["fuzz"]
        n = f["hostile"]["status_5xx"] + f["random"]["status_5xx"]
        total = f["hostile"]["requests"] + f["random"]["requests"]
        rows.append((f"5xx over {total:,} hostile and random requests", "0", str(n), n == 0))
        if "secret" in f:
            seen = sum(f["secret"].values())
            rows.append(
                (
                    "planted secret in a response body, status page or log line",
                    "0",
                    str(seen),
                    seen == 0,
                )
            )
    if "held" in sections:
        h = sections["held"]
        for run in h["runs"]:
            where = f"{h['held_connections']:,} held connections, fd limit {run['server_fd_limit']}"
            failed = sum(v for k, v in run["held"]["outcomes"].items() if k != "ok")
            rows.append(
                (f"normal requests failed or timed out ({where})", "0", str(failed), failed == 0)
            )
            ratio = run["p99_ratio"]
            rows.append(
                (
                    f"p99 held / p99 idle ({where})",
                    "<= 2",
                    f"{ratio}",
                    ratio is not None and ratio <= 2,
                )
            )
    if "swaps" in sections:
        s = sections["swaps"]
        rows.append(
            (
                f"failed requests over {s['swaps_seen']} hot swaps (at least 5 wanted)",
                "0",
                str(s["failed"]),
                s["failed"] == 0 and s["swaps_seen"] >= 5,
            )
        )
    if "corrupt" in sections:
        c = sections["corrupt"]
        found = c["found_at_top"]
        served = found["base question"] and found["good delta's question"]
        served = served and not found["bad delta's question"]
        refused = c["add_exit_code"] == 1 and c["add_output_lines"] == 1
        wrote = "nothing" if c["add_wrote_nothing"] else "something"
        rows += [
            (
                "corrupt delta: /readyz status, deltas named",
                f"200, [{c['bad_delta']}]",
                f"{c['readyz_status']}, {c['readyz_failed_deltas']}",
                c["readyz_status"] == 200 and c["readyz_failed_deltas"] == [c["bad_delta"]],
            ),
            (
                "corrupt delta: base and good delta served, bad one not",
                "yes",
                "yes" if served else "no",
                served,
            ),
            (
                "corrupt delta: `qpr index add` on top (exit code, lines, wrote)",
                "1, 1, nothing",
                f"{c['add_exit_code']}, {c['add_output_lines']}, {wrote}",
                refused and c["add_wrote_nothing"],
            ),
            (
                "corrupt delta: seconds from `qpr index drop` to the repaired state "
                f"(poll {c['poll_seconds']} s)",
                f"<= {REPAIR_BOUND_S:g}",
                f"{c['seconds_to_repaired_state']}",
                c["seconds_to_repaired_state"] <= REPAIR_BOUND_S and c["good_delta_after_drop"],
            ),
        ]
    return rows


def when(section: dict[str, Any]) -> str:
    commit = str(section.get("git_commit"))[:12]
    return f"_Measured {section['measured_at']}, commit {commit}, in {section['wall_seconds']} s._"


def render(report: dict[str, Any]) -> str:
    m = report["machine"]
    sections = report["sections"]
    lines = [
        "# Service reliability: hostile input, held connections, hot swaps",
        "",
        f"Measured by `benchmarks/reliability.py` (last run at commit "
        f"{str(m.get('git_commit'))[:12]}{', dirty tree' if m.get('dirty') else ''}); each "
        "section says when and at which commit it ran (a run skips sections already stored).",
        "",
        f"**Machine**: {m['cpu_model']}, {m['cpus_usable']} usable cores, {m['memory_gib']} GiB, "
        f"{m['platform']}, Python {m['python']}; "
        + ", ".join(f"{k} {v}" for k, v in m["versions"].items())
        + f". Load average at start {m.get('load_average')}. The client runs on the same "
        "cores as the server.",
        "",
        "## Targets",
        "",
        "| target | bound | measured | met |",
        "|---|---|---|---|",
    ]
    for what, bound, got, met in targets(sections):
        lines.append(f"| {what} | {bound} | {got} | {'yes' if met else 'NO'} |")
    if "fuzz" in sections:
        f = sections["fuzz"]
        r = f["random"]
        lines += [
            "",
            "## Fuzz",
            "",
            when(f),
            "",
            f"One `qpr serve` on the bundle. {f['hostile']['requests']} hand-made hostile "
            f"requests, each on its own connection, all at once: statuses "
            f"{f['hostile']['statuses']} (0: closed without an answer, as for broken framing "
            "or a head that never ends). Then "
            f"{r['requests']:,} random requests over 16 keep-alive connections in "
            f"{r['seconds']} s ({r['requests_per_s']:,}/s): statuses {r['statuses']}. "
            f"/readyz afterwards: {f['ready_after']}; server log {f['server_log_bytes']:,} bytes.",
            ""
            if "secret" not in f
            else (
                " A secret was planted in the server's environment (a password in "
                "MLFLOW_TRACKING_URI, a secret-named variable): found in "
                f"{f['secret']['bodies_with_it']} random-request bodies, "
                f"{f['secret']['status_pages_with_it']} of /readyz, /version and /metrics, "
                f"{f['secret']['log_lines_with_it']} places in the server log."
            ),
            "",
            "| hostile request | status |",
            "|---|---:|",
        ]
        lines += [f"| {name} | {code} |" for name, code in f["hostile"]["cases"].items()]
    if "held" in sections:
        h = sections["held"]
        lines += [
            "",
            "## Held connections",
            "",
            when(h),
            "",
            f"Normal traffic: {h['normal_connections']} keep-alive connections sending "
            f"POST /search back to back for {h['phase_seconds']} s, timeout "
            f"{h['client_timeout_s']} s. Held: a second process keeps {h['held_connections']:,} "
            "connections that sent a head and part of a body, reopening each one the server "
            "closes at once. The server's connection cap is its open-files limit minus 64 "
            f"(at most QPR_SERVE_MAX_CONNECTIONS, 1000); client limit {h['client_fd_limit']}.",
            "",
            "| server fd limit | run | requests | outcomes | p50 ms | p99 ms | max ms | log |",
            "|---:|---|---:|---|---:|---:|---:|---:|",
        ]
        for run in h["runs"]:
            for name in ("idle", "held"):
                r = run[name]
                lines.append(
                    f"| {run['server_fd_limit']} | {name} | {r['requests']:,} | {r['outcomes']} | "
                    f"{r['p50']} | {r['p99']} | {r['max']} | {r['log_bytes']:,} |"
                )
        lines.append("")
        for run in h["runs"]:
            lines.append(
                f"- fd limit {run['server_fd_limit']}: held connections opened "
                f"{run['held'].get('held_opened'):,}, closed by the server "
                f"{run['held'].get('held_closed_by_server'):,} (evicted past the cap or timed "
                f"out); /readyz afterwards {run['ready_after']}; whole server log "
                f"{run['server_log_bytes']:,} bytes."
            )
    if "swaps" in sections:
        s = sections["swaps"]
        lines += [
            "",
            "## Hot swaps under load",
            "",
            when(s),
            "",
            f"The models dir is a symlink flipped between two valid bundles (same files, "
            f"search configs differ) {s['swaps_asked']} times; poll every {s['poll_seconds']} s; "
            f"{NORMAL_CONNECTIONS} keep-alive connections send POST /search throughout. Swaps "
            f"seen in /version: {s['swaps_seen']} (seconds from flip to swap: "
            f"{s['seconds_to_swap']}). Requests {s['requests']:,}: {s['outcomes']}; answered "
            f"by model {s['answered_by_model']}; p50 {s['p50']} ms, p99 {s['p99']} ms.",
        ]
    if "corrupt" in sections:
        c = sections["corrupt"]
        lines += [
            "",
            "## A corrupt delta",
            "",
            when(c),
            "",
            f"Two deltas added to a copy of the bundle ({c['bad_delta']} and {c['good_delta']}); "
            f"delta {c['bad_delta']}'s vectors file overwritten; `qpr serve` started on it "
            f"(poll {c['poll_seconds']} s), ready in {c['seconds_to_ready']} s. /readyz "
            f"{c['readyz_status']}, failed deltas {c['readyz_failed_deltas']}; found at the top: "
            f"{c['found_at_top']}. `qpr index add` on top: exit {c['add_exit_code']}, "
            f'{c["add_output_lines"]} line: "{c["add_said"]}". After `qpr index drop '
            f"{c['bad_delta']}` (exit {c['drop_exit_code']}), /readyz showed no failed delta "
            f"{c['seconds_to_repaired_state']} s later; the good delta still served: "
            f"{c['good_delta_after_drop']}. Tracebacks in the server log: "
            f"{c['tracebacks_in_log']}.",
        ]
    return "\n".join(lines) + "\n"


def write(out: Path, report: dict[str, Any]) -> None:
    sys.path.insert(0, str(ROOT / "src"))
    from qpr.io import write_json_atomic, write_text_atomic

    write_json_atomic(out / f"{NAME}.json", report)
    write_text_atomic(out / f"{NAME}.md", render(report))


# --------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, default=ROOT / "models", help="bundle to serve")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--only", help=f"comma-separated sections of {','.join(SECTIONS)}")
    parser.add_argument("--fresh", action="store_true", help="redo sections already stored")
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    parser.add_argument("--render", action="store_true", help="rewrite the .md from the JSON")
    parser.add_argument("--fuzz-requests", type=int, default=100_000)
    parser.add_argument("--held", type=int, default=1000)
    parser.add_argument(
        "--server-fd-limits",
        default="256,4096",
        help="the server's open-files limits, one held run each (256: the issue's)",
    )
    parser.add_argument("--phase-seconds", type=float, default=30.0)
    parser.add_argument("--swaps", type=int, default=6)
    args = parser.parse_args(argv)
    if args.quick:
        args.fuzz_requests, args.held, args.phase_seconds, args.swaps = 5000, 300, 8.0, 2
        args.server_fd_limits = "256"
    return args


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "_hold":
        raise_fd_limit(int(sys.argv[3]) + 256)
        asyncio.run(hold(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])))
        return 0
    args = parse_args(argv)
    models = args.models.resolve()
    wanted = args.only.split(",") if args.only else list(SECTIONS)
    path = args.out / f"{NAME}.json"
    if args.render:
        write(args.out, json.loads(path.read_text()))
        return 0
    report: dict[str, Any] = {"sections": {}}
    if path.is_file() and not args.fresh:
        report = json.loads(path.read_text())
    report["machine"] = machine()
    run = {
        "fuzz": section_fuzz,
        "held": section_held,
        "swaps": section_swaps,
        "corrupt": section_corrupt,
    }
    with tempfile.TemporaryDirectory(prefix="qpr-reliability-") as tmp:
        work = Path(tmp)
        copy = Path(shutil.copytree(models, work / "models", ignore=shutil.ignore_patterns(".*")))
        for name in wanted:
            if name in report["sections"] and not (args.fresh or args.only):
                say(f"{name}: stored, skipped (--fresh to redo)")
                continue
            started = time.perf_counter()
            result = run[name](copy, work, args)
            result["measured_at"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
            result["wall_seconds"] = round(time.perf_counter() - started, 1)
            result["git_commit"] = report["machine"]["git_commit"]  # sections may differ
            report["sections"][name] = result
            write(args.out, report)  # at once: a killed run keeps what it finished
            say(f"{name}: done in {result['wall_seconds']} s")
    write(args.out, report)
    for what, bound, got, met in targets(report["sections"]):
        say(f"{'ok ' if met else 'MISSED'} {what}: {got} (bound {bound})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
