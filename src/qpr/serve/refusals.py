"""Refusals below the app, in the service's JSON error shape.

The app answers every refusal it makes with ``{"error", "message", "request_id"}``. Some
requests never reach it: uvicorn and h11 answer a malformed head with a plain-text 400
("Invalid HTTP request received."), uvicorn's ``limit_concurrency`` with a plain-text 503,
and a connection closed by a timeout or by the connection cap got no answer at all.
`JsonRefusals` gives each of those the same JSON body, an ``X-Request-ID`` and
``Connection: close``:

- a head h11 cannot parse: its status hint (400; 431 for a head over h11's 16 KB buffer;
  501 for a Transfer-Encoding other than chunked) and h11's reason;
- an upgrade request (WebSocket, h2c): answered as plain HTTP, as no endpoint upgrades;
- past ``limit_concurrency``: 503 ``too_busy``;
- `refuse_and_close`, for `qpr.serve.connections`: a partial head that timed out gets 408,
  a stalled connection closed for a newcomer gets 503. A connection that sent nothing since
  its last answer is closed silently, as an idle keep-alive connection is.

The body is written as raw bytes just before the transport closes, so h11's state does
not matter; nothing is written once a response has started.
"""

from __future__ import annotations

import json
import logging
import sys
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from http import HTTPStatus
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from qpr.errors import printable

__all__ = ["JsonRefusals", "error_body", "raw_response"]

log = logging.getLogger("qpr.serve")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
    Awaitable[None],
]

# Characters of h11's reason an error message quotes.
_REASON_CHARS = 200


def error_body(code: str, message: str, request_id: str, details: list[Any] | None = None) -> bytes:
    """The service's JSON error body (docs/serving.md, "Errors")."""
    body: dict[str, Any] = {"error": code, "message": message, "request_id": request_id}
    if details:
        body["details"] = details
    return json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8")


def raw_response(status: int, code: str, message: str) -> bytes:
    """A whole HTTP/1.1 response with the JSON error body, closing the connection."""
    request_id = uuid.uuid4().hex
    body = error_body(code, message, request_id)
    phrase = HTTPStatus(status).phrase
    head = (
        f"HTTP/1.1 {status} {phrase}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n"
        f"x-request-id: {request_id}\r\n\r\n"
    )
    return head.encode("ascii") + body


_CODES = {400: "bad_request", 431: "headers_too_large", 501: "not_implemented"}


class JsonRefusals(H11Protocol):
    """uvicorn's h11 protocol whose own refusals carry the JSON error body."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # uvicorn's own check answers plain text: the same bound, checked in `_limited`.
        self._concurrency = self.limit_concurrency
        self.limit_concurrency = None
        if self._concurrency is not None:
            self.app = self._limited(self.app)

    def _should_upgrade(self) -> bool:
        # No endpoint speaks WebSocket (or h2c): an upgrade request is answered as plain
        # HTTP, so a WebSocket handshake to /search gets the JSON 405, not an empty 403.
        return False

    def send_400_response(self, msg: str) -> None:
        # Called by H11Protocol.handle_events inside its `except h11.RemoteProtocolError`.
        error = sys.exc_info()[1]
        status = 400
        reason = "the request is not valid HTTP/1.1"
        if isinstance(error, h11.RemoteProtocolError):
            status = error.error_status_hint if error.error_status_hint in _CODES else 400
            # h11 appends the offending bytes ("illegal header line: bytearray(b'...')"):
            # its reason is enough, and the bytes may hold a credential.
            said = str(error).split(": bytearray(", 1)[0]
            if said:
                reason += f": {printable(said, limit=_REASON_CHARS)}"
        if status == 431:
            reason = "the request head is larger than 16 KB"
        self.refuse_and_close(status, _CODES[status], reason, always=True)

    def refuse_and_close(
        self, status: int, code: str, message: str, *, always: bool = False
    ) -> None:
        """Answer `status` with the JSON body and close. Unless `always`, only a connection
        that is waiting for the rest of a request gets an answer: one that sent nothing
        since its last response is closed silently. Nothing is written after a response
        started."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        cycle = self.cycle
        in_request = cycle is not None and not cycle.response_complete
        if in_request and cycle is not None and cycle.response_started:
            transport.close()
            return
        partial_head = bool(self.conn.trailing_data[0])
        if always or in_request or partial_head:
            transport.write(raw_response(status, code, message))
            if cycle is not None and in_request:
                # The app may still be waiting for the body: it sees a disconnect, and
                # anything it would send is dropped rather than written after ours.
                cycle.disconnected = True
        transport.close()

    def _limited(self, app: ASGIApp) -> ASGIApp:
        limit = self._concurrency
        assert limit is not None

        async def limited(scope: Scope, receive: Any, send: Any) -> None:
            # The running request is in `tasks` already (uvicorn counts before adding it).
            if len(self.connections) >= limit or len(self.tasks) > limit:
                request_id = uuid.uuid4().hex
                body = error_body(
                    "too_busy",
                    f"the service has {limit} requests or connections open; retry shortly",
                    request_id,
                )
                log.warning("refused a request: more than %d in progress", limit)
                await send(
                    {
                        "type": "http.response.start",
                        "status": 503,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"),
                            (b"x-request-id", request_id.encode("ascii")),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
            await app(scope, receive, send)

        return limited
