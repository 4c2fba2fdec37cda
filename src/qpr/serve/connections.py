"""Bounded connections: idle and half-sent requests cannot take the service down.

Measured before this module: 300 connections that each sent part of a body (open-files
limit 256) made every normal request time out, because nothing ever closed them and
accept() then failed on every try. Here each stage a client controls has a bound:

- the request head must arrive within ``header_timeout`` seconds of the connection opening
  (or of the previous response on a keep-alive connection); uvicorn's h11 protocol has no
  such timeout, so `guarded_protocol` adds it;
- the body must arrive within ``body_timeout`` seconds (`qpr.serve.app._BodyLimit`
  answers 408 and closes);
- an idle keep-alive connection closes after ``keep_alive`` seconds (uvicorn);
- at most ``max_connections`` are open, lowered below the process's open-files limit so
  that accept() never runs out of descriptors. A connection past the cap closes the one
  that has *stalled* longest: waiting for a head or a body, or idle between requests,
  never one whose request is being answered. Held connections therefore cost their
  holder the slot, not the clients that send whole requests.

uvicorn's own ``limit_concurrency`` is off unless ``QPR_SERVE_LIMIT_CONCURRENCY`` sets it:
it counts stalled connections, and evicted ones until their close has run, so under a
flood it answers 503 to normal requests. Set one above the cap, it answered 503 to 2,547
of 6,432 normal requests while 1,000 connections were held (benchmarks/reliability.py).
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections import OrderedDict
from typing import Any, ClassVar

from uvicorn.protocols.http.h11_impl import H11Protocol

from qpr.serve.refusals import JsonRefusals
from qpr.serve.settings import ServeSettings

__all__ = ["FD_RESERVE", "connection_cap", "guarded_protocol", "uvicorn_options"]

log = logging.getLogger("qpr.serve")

# Descriptors kept for everything that is not a client connection: the bundle's files,
# the log, the registry's HTTP connections, the event loop's own.
FD_RESERVE = 64


def connection_cap(wanted: int) -> int:
    """`wanted`, lowered to fit the open-files limit (raised first, up to the hard limit,
    where the system allows)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = wanted + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # keep the soft limit we have; the cap below fits it
    if soft == resource.RLIM_INFINITY:
        return wanted
    cap = max(1, min(wanted, soft - FD_RESERVE))
    if cap < wanted:
        log.warning(
            "at most %d connections (not %d): the open-files limit is %d", cap, wanted, soft
        )
    return cap


class _GuardedH11(JsonRefusals):
    """uvicorn's h11 protocol with a head timeout and the stalled-first connection cap
    (its refusals in JSON: `qpr.serve.refusals`)."""

    header_timeout: float = 10.0
    max_connections: int = 1000
    # Open connections, least recently active first (opened, or last answered): the
    # eviction takes the first stalled one without scanning them all, which under a
    # flood of reconnecting held connections costs a millisecond a time at 1,000.
    by_activity: ClassVar[OrderedDict[_GuardedH11, None]] = OrderedDict()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._seen_cycle: object | None = None

    # -- the head timeout -----------------------------------------------------------------

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        # 408 to a partial head; a connection that sent nothing is closed silently.
        message = f"the request head did not arrive within {self.header_timeout:g} s"
        self.refuse_and_close(408, "request_timeout", message)

    def _note_cycle(self) -> None:
        # A new cycle means a complete head arrived: the body has its own timeout.
        if self.cycle is not None and self.cycle is not self._seen_cycle:
            self._seen_cycle = self.cycle
            self._cancel_head_timer()

    # -- protocol events ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.by_activity[self] = None
        self._arm_head_timer()
        if len(self.connections) > self.max_connections:
            self._evict()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._note_cycle()

    def on_response_complete(self) -> None:
        if self in self.by_activity:
            self.by_activity.move_to_end(self)
        if not self.transport.is_closing():
            self._arm_head_timer()
        super().on_response_complete()
        self._note_cycle()  # a pipelined request may have started

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        self.by_activity.pop(self, None)
        super().connection_lost(exc)

    # -- the cap --------------------------------------------------------------------------

    def stalled(self) -> bool:
        """Waiting for the client: for a head, for the rest of a body, or idle."""
        cycle = self.cycle
        return cycle is None or cycle.response_complete or cycle.more_body

    def _evict(self) -> None:
        victim: _GuardedH11 = self
        for conn in self.by_activity:  # oldest first; closing ones await connection_lost
            if conn is not self and not conn.transport.is_closing() and conn.stalled():
                victim = conn
                break
        # Nothing stalled: every slot is answering a request; this newcomer waits its turn
        # by reconnecting, which costs less than queueing it. A victim halfway through a
        # request is told why (503); an idle one is closed silently.
        message = "too many open connections: this one had stalled longest"
        victim.refuse_and_close(503, "too_many_connections", message)


def guarded_protocol(header_timeout: float, max_connections: int) -> type[H11Protocol]:
    """An h11 protocol class for ``uvicorn.Config(http=...)`` with these bounds."""
    return type(
        "GuardedH11Protocol",
        (_GuardedH11,),
        {
            "header_timeout": header_timeout,
            "max_connections": max_connections,
            "by_activity": OrderedDict(),  # one order per server
        },
    )


def uvicorn_options(settings: ServeSettings) -> dict[str, Any]:
    """The ``uvicorn.run``/``uvicorn.Config`` arguments that bound connections."""
    cap = connection_cap(settings.max_connections)
    return {
        "http": guarded_protocol(settings.header_timeout, cap),
        "limit_concurrency": settings.limit_concurrency,
        "timeout_keep_alive": settings.keep_alive,
        "backlog": settings.backlog,
        "timeout_graceful_shutdown": settings.shutdown_seconds,
    }
