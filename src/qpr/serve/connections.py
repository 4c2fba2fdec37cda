"""Bounded connections: idle and half-sent requests cannot take the service down.

Measured before this module: 300 connections that each sent part of a body (open-files
limit 256) made every normal request time out, because nothing ever closed them and
accept() then failed on every try. Here each stage a client controls has a bound:

- the request head must arrive within ``header_timeout`` seconds of the connection opening
  (or of the previous response on a keep-alive connection); uvicorn's h11 protocol has no
  such timeout, so `guarded_protocol` adds it (a partial head gets a JSON 408);
- the body must arrive within ``body_timeout`` seconds (`qpr.serve.app._BodyLimit`
  answers 408 and closes);
- an idle keep-alive connection closes after ``keep_alive`` seconds (uvicorn);
- at most ``max_connections`` are open, lowered below the process's open-files limit
  (`connection_cap`), and `AcceptGate` never accepts past it.

Why a gate of our own: asyncio's accept loop (``selector_events._accept_connection``)
accepts up to ``backlog`` sockets per wake-up, before any protocol has seen one, so a
cap checked in ``connection_made`` comes too late. Under ``ulimit -n 256`` (the hard
limit too, so the cap cannot raise it) and 1,000 held connections, accept() then failed
with EMFILE over and over: asyncio's EMFILE branch logs, takes the listener off the loop
for a second, and yet goes on trying the rest of its ``backlog`` accepts.

`AcceptGate` calls accept() only while a slot is free, so descriptors stay `FD_RESERVE`
below the limit (for files the process opens: a model reload, logs, the registry's HTTP
connections). At the cap it first closes the connection that has *stalled* longest:
one inside a request (part of a head or body sent, or silent since it opened) before
one idle between requests, never one being answered, and only once it has stalled
`MIN_STALL_SECONDS`; one halfway through a request gets a JSON 503 first
(``too_many_connections``). Its slot frees when its close has run; then the next
connection waiting in the listen queue is accepted. Held connections therefore cost
their holder the slot, not the clients that send whole requests.

`CappedServer` is uvicorn's server with the gate in place of asyncio's listener; `serve`
runs it as ``uvicorn.run`` would.

uvicorn's own ``limit_concurrency`` is off unless ``QPR_SERVE_LIMIT_CONCURRENCY`` sets it:
it counts stalled connections, and evicted ones until their close has run, so under a
flood it answers 503 to normal requests. Set one above the cap, it answered 503 to 2,547
of 6,432 normal requests while 1,000 connections were held (benchmarks/reliability.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import resource
import socket
import sys
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, ClassVar

import uvicorn
from uvicorn.config import STARTUP_FAILURE

from qpr.serve.refusals import JsonRefusals
from qpr.serve.settings import ServeSettings

__all__ = [
    "FD_RESERVE",
    "AcceptGate",
    "CappedServer",
    "connection_cap",
    "guarded_protocol",
    "serve",
    "uvicorn_options",
]

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


# Seconds a connection must have stalled before it is closed to make room. A flood that
# reopens every closed connection then turns each slot over at most twice a second, and
# a newcomer waits about (held - cap) * MIN_STALL_SECONDS / cap seconds in the listen
# queue. Less churns more (each turn costs the loop and the kernel CPU that normal
# requests need); more makes newcomers wait longer. Figures: docs/reliability.md.
MIN_STALL_SECONDS = 0.5
# Seconds a new connection may stay silent before it ranks with half-sent requests: a
# client that just connected has sent its request by then.
SILENT_GRACE = 1.0
# Seconds before looking again for a connection to evict when every open one is being
# answered.
BUSY_RETRY_SECONDS = 0.05


class _GuardedH11(JsonRefusals):
    """uvicorn's h11 protocol with a head timeout, in the stalled-first eviction order
    (its refusals in JSON: `qpr.serve.refusals`)."""

    header_timeout: float = 10.0
    min_stall: float = MIN_STALL_SECONDS
    # Open connections, least recently active first (opened, or last answered): eviction
    # takes the first stalled one without scanning them all, which under a flood of
    # reconnecting held connections costs a millisecond a time at 1,000.
    by_activity: ClassVar[OrderedDict[_GuardedH11, None]] = OrderedDict()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._seen_cycle: object | None = None
        self.answered = 0  # requests answered on this connection
        self.heard = False  # bytes received since it opened or last answered
        self.active_at = self.loop.time()  # when it opened or last answered
        self.on_lost: Callable[[], None] | None = None  # set by AcceptGate: frees the slot

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

    def data_received(self, data: bytes) -> None:
        self.heard = True
        super().data_received(data)
        self._note_cycle()

    def on_response_complete(self) -> None:
        self.answered += 1
        self.heard = False
        self.active_at = self.loop.time()
        if self in self.by_activity:
            self.by_activity.move_to_end(self)
        if not self.transport.is_closing():
            self._arm_head_timer()
        super().on_response_complete()
        self._note_cycle()  # a pipelined request may have started

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        self.by_activity.pop(self, None)
        try:
            super().connection_lost(exc)
        finally:
            if self.on_lost is not None:
                self.on_lost()

    # -- eviction -------------------------------------------------------------------------

    def stalled(self) -> bool:
        """Waiting for the client: for a head, for the rest of a body, or idle."""
        cycle = self.cycle
        return cycle is None or cycle.response_complete or cycle.more_body

    def rank(self, now: float) -> int | None:
        """Eviction order: 0 stalled inside a request (part of a head or body sent, or
        silent for over `SILENT_GRACE` s since it opened), 1 idle between requests or just
        opened, None being answered."""
        if self.transport.is_closing() or not self.stalled():
            return None
        if self.heard or (self.answered == 0 and now - self.active_at > SILENT_GRACE):
            return 0
        return 1

    @classmethod
    def evict_stalled(cls) -> float:
        """Close the rank-0 connection that stalled longest (else the oldest rank-1 one)
        once it has stalled `min_stall` seconds. Returns 0 when one was closed, else the
        seconds until one may be."""
        now = asyncio.get_running_loop().time()
        victim: _GuardedH11 | None = None
        for conn in cls.by_activity:  # oldest first; closing ones await connection_lost
            rank = conn.rank(now)
            if rank == 0:
                victim = conn
                break
            if rank == 1 and victim is None:
                victim = conn  # unless a rank-0 one comes
        if victim is None:  # every one is being answered
            return BUSY_RETRY_SECONDS
        wait = cls.min_stall - (now - victim.active_at)
        if wait > 0:
            return wait
        # A victim halfway through a request is told why (503); an idle one, or one silent
        # since it opened, is closed silently.
        message = "too many open connections: this one had stalled longest"
        victim.refuse_and_close(503, "too_many_connections", message)
        # abort, not only close: a client that reads nothing would keep a closing socket
        # (and its descriptor) open for ever; the slot must free at once. The refusal went
        # to the socket at once when nothing was queued before it; the kernel still sends
        # it after the close.
        victim.transport.abort()
        return 0.0


def guarded_protocol(
    header_timeout: float, min_stall: float = MIN_STALL_SECONDS
) -> type[_GuardedH11]:
    """An h11 protocol class for ``uvicorn.Config(http=...)``: its head timeout, and how
    long a connection must have stalled before `AcceptGate` may close it to make room."""
    return type(
        "GuardedH11Protocol",
        (_GuardedH11,),
        {
            "header_timeout": header_timeout,
            "min_stall": min_stall,
            "by_activity": OrderedDict(),  # one per server
        },
    )


# accept() errors that mean "no descriptor or memory now": wait, do not spin.
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# Seconds before accepting again after such an error.
RESOURCE_RETRY_SECONDS = 1.0


class AcceptGate:
    """Accepts connections from a listening socket while fewer than `cap` are open.

    A slot is taken at accept() and freed when the connection's protocol has lost it (its
    socket is closed then). At the cap the listener is taken off the event loop; `evict`
    closes one stalled connection to make room and returns 0, or returns the seconds until
    it may. A freed slot, or that wait, puts the listener back.
    """

    def __init__(
        self,
        sock: socket.socket,
        cap: int,
        protocol_factory: Callable[[], asyncio.Protocol],
        *,
        evict: Callable[[], float] = lambda: BUSY_RETRY_SECONDS,
        ssl: Any = None,
    ) -> None:
        self.sock = sock
        self.cap = max(1, cap)
        self.open = 0  # accepted and not yet closed
        self.evictions = 0
        self._factory = protocol_factory
        self._evict = evict
        self._ssl = ssl
        self._loop = asyncio.get_running_loop()
        self._reading = False
        self._closed = False
        self._retry: asyncio.TimerHandle | None = None
        self._starved = False  # the pending retry follows an accept() out of resources
        self._tasks: set[asyncio.Task[None]] = set()
        sock.setblocking(False)

    def start(self) -> None:
        self._resume()

    def close(self) -> None:
        """Stop accepting and close the listening socket (open connections stay)."""
        self._closed = True
        self._pause()
        if self._retry is not None:
            self._retry.cancel()
        self.sock.close()

    def _resume(self) -> None:
        self._retry = None
        if not self._reading and not self._closed:
            self._loop.add_reader(self.sock.fileno(), self._on_readable)
            self._reading = True

    def _pause(self) -> None:
        if self._reading:
            self._loop.remove_reader(self.sock.fileno())
            self._reading = False

    def _resume_later(self, seconds: float, *, starved: bool) -> None:
        if self._retry is None and not self._closed:
            self._starved = starved
            self._retry = self._loop.call_later(seconds, self._resume)

    def _on_readable(self) -> None:
        # Bounded like asyncio's loop, so that a flood cannot starve other callbacks.
        for _ in range(64):
            if self.open >= self.cap:
                self._pause()
                wait = self._evict()
                if wait == 0:
                    self.evictions += 1  # its slot frees on connection_lost: resumes then
                else:
                    self._resume_later(wait, starved=False)
                return
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as err:
                if err.errno not in _OUT_OF_RESOURCES:
                    raise
                # Files opened elsewhere ate the reserve: wait rather than spin.
                log.warning(
                    "accept() failed (%s) with %d connections open; retrying in %.0f s",
                    err.strerror,
                    self.open,
                    RESOURCE_RETRY_SECONDS,
                )
                self._pause()
                self._resume_later(RESOURCE_RETRY_SECONDS, starved=True)
                return
            self.open += 1
            task = self._loop.create_task(self._connect(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _connect(self, conn: socket.socket) -> None:
        freed = False

        def free() -> None:
            nonlocal freed
            if not freed:
                freed = True
                self._freed()

        def protocol() -> asyncio.Protocol:
            made = self._factory()
            made.on_lost = free  # type: ignore[attr-defined]
            return made

        conn.setblocking(False)
        if conn.family in (socket.AF_INET, socket.AF_INET6):
            # asyncio sets this only on sockets whose proto is TCP, and a socket made with
            # socket.socket(family) says 0: without it a keep-alive answer waited 40 ms
            # (Nagle against delayed ACKs) where asyncio's own listener took 0.2 ms.
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await self._loop.connect_accepted_socket(protocol, conn, ssl=self._ssl)
        except Exception:  # a client gone mid-handshake: its slot frees, nothing more
            conn.close()
            free()

    def _freed(self) -> None:
        self.open -= 1
        if self.open >= self.cap or self._closed:
            return
        if self._retry is not None:
            if self._starved:
                return  # the descriptors went elsewhere: wait out the retry
            self._retry.cancel()
        self._resume()


class CappedServer(uvicorn.Server):
    """uvicorn's server, accepting through an `AcceptGate` of `max_connections` slots.

    uvicorn binds no listener of its own (``startup(sockets=[])``, the path its process
    manager uses); this one binds with ``Config.bind_socket`` and listens once the app
    has started, as uvicorn does.
    """

    def __init__(self, config: uvicorn.Config, max_connections: int) -> None:
        super().__init__(config)
        self.max_connections = max_connections
        self.gate: AcceptGate | None = None

    @property
    def port(self) -> int:
        """The port listened on (a port of 0 asked for any free one)."""
        assert self.gate is not None, "not started"
        return int(self.gate.sock.getsockname()[1])

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        config = self.config
        listener = config.bind_socket()  # exits with uvicorn's status if the port is taken
        try:
            await super().startup(sockets=[])
        except BaseException:
            listener.close()
            raise
        # uvicorn says started here, but nothing listens until the gate is up: a caller
        # waiting on `started` would find no port yet.
        self.started = False
        protocol_class = config.http_protocol_class
        if not (isinstance(protocol_class, type) and issubclass(protocol_class, _GuardedH11)):
            listener.close()
            raise TypeError("CappedServer needs http=guarded_protocol(...): it frees slots")

        def factory() -> asyncio.Protocol:
            return protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state
            )

        listener.listen(config.backlog)
        self.gate = AcceptGate(
            listener,
            self.max_connections,
            factory,
            evict=protocol_class.evict_stalled,
            ssl=config.ssl,
        )
        self.gate.start()
        self.started = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.gate is not None:
            self.gate.close()
        await super().shutdown(sockets=sockets)


def uvicorn_options(settings: ServeSettings) -> dict[str, Any]:
    """The ``uvicorn.Config`` arguments that bound connections (the cap is the gate's)."""
    return {
        "http": guarded_protocol(settings.header_timeout),
        # No WebSocket endpoint: an upgrade would hand the socket to another protocol,
        # whose close would never free the gate's slot.
        "ws": "none",
        "limit_concurrency": settings.limit_concurrency,
        "timeout_keep_alive": settings.keep_alive,
        "backlog": settings.backlog,
        "timeout_graceful_shutdown": settings.shutdown_seconds,
    }


def serve(app: Any, settings: ServeSettings, **config: Any) -> None:
    """Run `app` as ``uvicorn.run(app, **config)`` would, through a `CappedServer` whose
    cap is ``settings.max_connections`` fitted to the open-files limit."""
    server = CappedServer(
        uvicorn.Config(app, **config, **uvicorn_options(settings)),
        connection_cap(settings.max_connections),
    )
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    if not server.started:
        sys.exit(STARTUP_FAILURE)
