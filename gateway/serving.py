"""Deadlines on the client side of every connection, and a cap on how many are open.

aiohttp's server has a keep-alive timeout but no deadline for a request's headers or body: a client that sends a
byte now and then (slowloris) holds its connection, and a file descriptor, for as long as it likes. Here each
connection goes through these phases, each with its own deadline:

    connect / first byte of the next request ──▶ headers complete ──▶ body complete ──▶ (response) ──▶ idle
              server.header_timeout_s               server.body_timeout_s                 server.keepalive_timeout_s

- Headers: the first request's headers must be complete ``header_timeout_s`` after the connection opened; a later
  request's, ``header_timeout_s`` after its first byte. Otherwise the connection is closed (nothing was parsed, so
  there is no one to answer).
- Body: on routes kvgate reads whole (``WHOLE_BODY_PATHS``) the body must be complete ``body_timeout_s`` after its
  headers; the read fails with ``RequestTimeout`` (408 in the route's dialect) and the connection is closed after
  the answer. Bodies streamed through (``/api/blobs`` uploads can be gigabytes) get an idle deadline instead: no
  byte for ``body_timeout_s`` closes the connection.
- A client that stops reading a response is the relay's business (``gateway.streaming``,
  ``server.client_write_timeout_s``); it reports it here for the log line and the metric.

The cap. At ``max_connections`` open connections, a new one closes the connection that has waited longest for its
headers (a slow client, or one that never sent anything), or else the longest idle keep-alive one; when every
connection is busy with a request, the new one is answered 503 with ``Retry-After`` and closed. Unset, the cap is half
the open-file limit left after a reserve (each proxied request holds a second descriptor, upstream).

Closes for these reasons are counted (``kvgate_client_closes_total{reason}``) and logged as one WARNING line, then at
most one summary line per ``LOG_INTERVAL_S``: never one line, let alone a traceback, per connection.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.config import ServerSettings
from gateway.errors import RequestTimeout
from gateway.routes import ROUTES, Handling

log = logging.getLogger(__name__)

LOG_INTERVAL_S = 60.0
"""After one WARNING about closed connections, the next comes as a summary no sooner than this."""
FD_RESERVE = 64
"""Descriptors kept out of the connection cap: the listening socket, the event loop, logs, tokenizer files."""
REASONS = ("header_timeout", "body_timeout", "client_write_timeout", "evicted", "over_cap")

WHOLE_BODY_PATHS = frozenset({*(r.path for r in ROUTES if r.handling is Handling.PARSED), "/kvgate/count"})
"""Paths whose body kvgate reads whole before acting; the rest stream their body through."""

_OVER_CAP_BODY = b'{"error": "kvgate has too many open connections (server.max_connections); try again in a second"}'
_OVER_CAP = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
             b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_OVER_CAP_BODY), _OVER_CAP_BODY))


@dataclass(frozen=True, slots=True)
class ClientLimits:
    header_timeout_s: float
    body_timeout_s: float
    client_write_timeout_s: float
    keepalive_timeout_s: float
    max_connections: int

    @classmethod
    def from_settings(cls, server: ServerSettings) -> ClientLimits:
        cap = server.max_connections if server.max_connections is not None else default_max_connections()
        return cls(server.header_timeout_s, server.body_timeout_s, server.client_write_timeout_s,
                   server.keepalive_timeout_s, cap)


def default_max_connections() -> int:
    """Half the open-file limit left after ``FD_RESERVE``: every proxied request holds two descriptors."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1_000_000
    return max(16, (soft - FD_RESERVE) // 2)


class Connections:
    """The limits, the open connections in the order they began waiting, and the counts of closes by reason."""

    def __init__(self, limits: ClientLimits) -> None:
        self.limits = limits
        self.closed = dict.fromkeys(REASONS, 0)
        self.open = 0
        self.waiting: dict[GuardedRequestHandler, None] = {}
        """Connections waiting for request headers, oldest first."""
        self._unlogged = dict.fromkeys(REASONS, 0)
        self._flush: asyncio.TimerHandle | None = None

    def note(self, reason: str, detail: str) -> None:
        """Count a close and log it: at once when nothing was logged lately, else in the next summary."""
        self.closed[reason] += 1
        if self._flush is None:
            log.warning("closed a client connection: %s; further closes are summed up every %g s", detail,
                        LOG_INTERVAL_S)
            self._flush = asyncio.get_running_loop().call_later(LOG_INTERVAL_S, self._summary)
        else:
            self._unlogged[reason] += 1

    def _summary(self) -> None:
        counts = {reason: n for reason, n in self._unlogged.items() if n}
        if not counts:
            self._flush = None
            return
        log.warning("closed client connections in the last %g s: %s", LOG_INTERVAL_S,
                    ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in counts.items()))
        self._unlogged = dict.fromkeys(REASONS, 0)
        self._flush = asyncio.get_running_loop().call_later(LOG_INTERVAL_S, self._summary)

    def make_room(self, server: web.Server) -> bool:
        """At the cap: close the connection longest waiting for headers, else the longest idle one. False when
        every connection is busy with a request."""
        if self.open < self.limits.max_connections:
            return True
        victim = next(iter(self.waiting), None)
        if victim is None:
            victim = next((c for c in server.connections if isinstance(c, GuardedRequestHandler) and c.is_idle()),
                          None)
        if victim is None:
            return False
        victim.drop("evicted", "made room for a new connection at server.max_connections "
                               f"({self.limits.max_connections})")
        return True

    def close_timers(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None


class _Phase:
    HEADERS = "headers"
    BODY = "body"
    IDLE = "idle"


class GuardedRequestHandler(RequestHandler):
    """aiohttp's connection protocol with the header and body deadlines of the module docstring."""

    def __init__(self, manager: web.Server, *, connections: Connections, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._connections = connections
        self._phase = _Phase.IDLE
        self._deadline: asyncio.TimerHandle | None = None
        self._body: Any = None
        self._body_streamed = False
        self._body_last_s = 0.0
        self._counted = False
        self._peer = "?"

    # -- connection lifecycle

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        self._peer = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        room = self._connections.make_room(self._manager) if self._manager is not None else True
        super().connection_made(transport)
        self._connections.open += 1
        self._counted = True
        if not room:
            self._connections.note("over_cap", f"{self._peer}: over server.max_connections "
                                               f"({self._connections.limits.max_connections}); answered 503")
            if self.transport is not None:
                self.transport.write(_OVER_CAP)
            self.force_close()
            return
        self._begin_headers()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._cancel_deadline()
        self._connections.waiting.pop(self, None)
        if self._counted:
            self._counted = False
            self._connections.open -= 1
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if data and self._phase == _Phase.IDLE and not self._messages:
            self._begin_headers()
        before = self._request_count
        super().data_received(data)
        if self._request_count != before and self._messages:
            self._headers_done()
        elif self._phase == _Phase.BODY:
            if self._body is None or self._body.is_eof():
                self._to_idle()
            else:
                self._body_last_s = self._loop.time()

    def is_idle(self) -> bool:
        """Between requests on a keep-alive connection: nothing being read, handled or queued."""
        return (self._phase == _Phase.IDLE and not self._request_in_progress and not self._messages
                and self.transport is not None)

    def drop(self, reason: str, detail: str) -> None:
        self._connections.waiting.pop(self, None)
        self._cancel_deadline()
        if self._counted:  # its descriptor is freed on the next loop turn; count the room now
            self._counted = False
            self._connections.open -= 1
        self._connections.note(reason, f"{self._peer}: {detail}")
        if self.transport is not None:
            self.transport.abort()
        self.force_close()

    # -- phases

    def _begin_headers(self) -> None:
        self._phase = _Phase.HEADERS
        self._connections.waiting[self] = None
        self._arm(self._loop.time() + self._connections.limits.header_timeout_s, self._headers_late)

    def _headers_done(self) -> None:
        self._connections.waiting.pop(self, None)
        message, payload = self._messages[-1]
        if payload.is_eof():
            self._to_idle()
            return
        self._phase = _Phase.BODY
        self._body = payload
        url = getattr(message, "url", None)
        self._body_streamed = url is None or url.path not in WHOLE_BODY_PATHS
        self._body_last_s = self._loop.time()
        self._arm(self._body_last_s + self._connections.limits.body_timeout_s, self._body_late)

    def _to_idle(self) -> None:
        self._phase = _Phase.IDLE
        self._body = None
        self._cancel_deadline()

    def _arm(self, when_s: float, callback: Callable[[], None]) -> None:
        self._cancel_deadline()
        self._deadline = self._loop.call_at(when_s, callback)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_late(self) -> None:
        self._deadline = None
        if self._phase == _Phase.HEADERS:
            limit_s = self._connections.limits.header_timeout_s
            self.drop("header_timeout", f"no complete request headers within {limit_s:g} s (server.header_timeout_s)")

    def _body_late(self) -> None:
        self._deadline = None
        body = self._body
        if self._phase != _Phase.BODY or body is None or body.is_eof():
            return
        limit_s = self._connections.limits.body_timeout_s
        if self._body_streamed:
            due_s = self._body_last_s + limit_s
            if self._loop.time() < due_s:
                self._deadline = self._loop.call_at(due_s, self._body_late)
                return
            self.drop("body_timeout", f"no byte of a streamed request body for {limit_s:g} s (server.body_timeout_s)")
            return
        self._connections.note("body_timeout", f"{self._peer}: request body not complete within {limit_s:g} s "
                                               "(server.body_timeout_s); answered 408")
        self._phase = _Phase.IDLE
        self._body = None
        self.close()  # after the answer
        body.set_exception(RequestTimeout(
            f"the request body did not arrive within {limit_s:g} s (server.body_timeout_s); send it faster"))


class GuardedServer(web.Server):
    """aiohttp's server, building ``GuardedRequestHandler`` connections."""

    def __init__(self, plain: web.Server, connections: Connections) -> None:
        super().__init__(plain.request_handler, request_factory=plain.request_factory,
                         handler_cancellation=plain.handler_cancellation, loop=plain._loop, **plain._kwargs)
        self.guard = connections

    def __call__(self) -> RequestHandler:
        return GuardedRequestHandler(self, connections=self.guard, loop=self._loop, **self._kwargs)


class GuardedRunner(web.AppRunner):
    def __init__(self, app: web.Application, connections: Connections, **kwargs: Any) -> None:
        limits = connections.limits
        super().__init__(app, keepalive_timeout=limits.keepalive_timeout_s, **kwargs)
        self.guard = connections

    async def _make_server(self) -> web.Server:
        return GuardedServer(await super()._make_server(), self.guard)

    async def _cleanup_server(self) -> None:
        self.guard.close_timers()
        await super()._cleanup_server()


class ConnectionCollector(Collector):
    def __init__(self, connections: Connections) -> None:
        self._connections = connections

    def collect(self) -> Iterator[Metric]:
        closes = CounterMetricFamily("kvgate_client_closes", "Client connections kvgate closed or cut short, by "
                                     "reason (the client was slow or stopped reading)", labels=["reason"])
        for reason, n in self._connections.closed.items():
            closes.add_metric([reason], n)
        yield closes


CONNECTIONS = web.AppKey("connections", Connections)
