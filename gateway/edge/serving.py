"""Guarded client connections: a deadline on each phase of every connection, and a cap on how many are open.

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

- Body rate: past ``body_grace_s`` after its headers, a body slower on average than ``min_body_bytes_per_s`` is cut
  as at its deadline (408 read whole, closed streamed through): a byte every few seconds holds no slot for long.

The cap. At ``max_connections`` open connections, a new one closes a connection over its peer's limit, else the one
that has waited longest for its headers (a slow client, or one that never sent anything), else the longest idle
keep-alive one, else the one whose body arrives slowest; when every connection is busy with a request, the new one
is answered 503 with ``Retry-After`` and closed. Unset, the cap is half the open-file limit left after a reserve
(each proxied request holds a second descriptor, upstream). One client address may hold ``max_connections_per_peer``
(default half the cap); a request on a connection past it is answered 429 in its route's dialect and the connection
closed (``gateway.edge.refusals``). A connection accepted within ``FD_RESERVE`` descriptors of RLIMIT_NOFILE is
answered 503 and closed, so the upstream pool keeps descriptors and accept() never fails unanswered. The decisions
are ``gateway.edge.limits``.

Closes for these reasons are counted (``kvgate_client_closes_total{reason}``) and logged as one WARNING line, then at
most one summary line per ``LOG_INTERVAL_S``: never one line, let alone a traceback, per connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway import dialects
from gateway.domain import Dialect
from gateway.edge.limits import FD_RESERVE, ClientLimits, body_too_slow, near_fd_limit, slowest
from gateway.edge.routes import ROUTES, Handling
from gateway.errors import ConnectionsExhausted, RequestTimeout

log = logging.getLogger(__name__)

LOG_INTERVAL_S = 60.0
"""After one WARNING about closed connections, the next comes as a summary no sooner than this."""
REASONS = ("header_timeout", "body_timeout", "slow_body", "client_write_timeout", "evicted", "over_cap",
           "over_peer_limit", "out_of_fds")
RATE_CHECK_S = 1.0
"""A body's rate is checked this often once its grace period has passed."""

WHOLE_BODY_PATHS = frozenset({*(r.path for r in ROUTES if r.handling is Handling.PARSED), "/kvgate/count"})
"""Paths whose body kvgate reads whole before acting; the rest stream their body through."""

def _raw_503(error: ConnectionsExhausted) -> bytes:
    """The whole response, written to the transport before any request is read (no route, so no dialect: Ollama's
    shape, which the OpenAI clients read too)."""
    body = dialects.error_body(Dialect.OLLAMA, error)
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


_OVER_CAP = _raw_503(ConnectionsExhausted(
    "kvgate has too many open connections (server.max_connections); try again in a second"))
_NO_FDS = _raw_503(ConnectionsExhausted("kvgate is out of file descriptors (RLIMIT_NOFILE); try again in a second"))


class Connections:
    """The limits, the open connections in the order they began waiting, and the counts of closes by reason."""

    def __init__(self, limits: ClientLimits) -> None:
        self.limits = limits
        self.closed = dict.fromkeys(REASONS, 0)
        self.open = 0
        self.peers: Counter[str] = Counter()
        """Open connections by client address."""
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
        """At the cap: close a connection over its peer's limit, else the one longest waiting for headers, else the
        longest idle one, else the slowest body. False when every connection is busy with a request."""
        if self.open < self.limits.max_connections:
            return True
        guarded = [c for c in server.connections if isinstance(c, GuardedRequestHandler) and c.counted]
        victim = next((c for c in guarded if c.over_peer_limit is not None), None)
        if victim is None:
            victim = next(iter(self.waiting), None)
        if victim is None:
            victim = next((c for c in guarded if c.is_idle()), None)
        if victim is None:
            victim = slowest(c.body_progress() for c in guarded if c.in_body())
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
        self._peer_counted = False
        self.over_peer_limit: str | None = None
        """Why this connection is past its peer's limit (``gateway.edge.refusals`` answers 429), None when not."""
        self._body_started_s = 0.0
        self._body_bytes = 0
        self._rate_check: asyncio.TimerHandle | None = None

    # -- connection lifecycle

    @property
    def counted(self) -> bool:
        return self._counted

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        self._peer = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        connections, limits = self._connections, self._connections.limits
        sock = transport.get_extra_info("socket")
        if sock is not None and near_fd_limit(sock.fileno(), limits.fd_soft_limit):
            super().connection_made(transport)
            connections.note("out_of_fds", f"{self._peer}: descriptor {sock.fileno()} is within {FD_RESERVE} of "
                                           f"RLIMIT_NOFILE ({limits.fd_soft_limit}); answered 503")
            transport.write(_NO_FDS)  # type: ignore[attr-defined]
            self.force_close()
            return
        room = connections.make_room(self._manager) if self._manager is not None else True
        super().connection_made(transport)
        connections.open += 1
        self._counted = True
        connections.peers[self._peer] += 1
        self._peer_counted = True
        if connections.peers[self._peer] > limits.max_connections_per_peer:
            self.over_peer_limit = (f"{self._peer} has {connections.peers[self._peer]} connections open to kvgate; "
                                    f"the limit (server.max_connections_per_peer) is "
                                    f"{limits.max_connections_per_peer}; close some or reuse them")
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
        self._cancel_rate_check()
        self._connections.waiting.pop(self, None)
        if self._peer_counted:
            self._peer_counted = False
            peers = self._connections.peers
            peers[self._peer] -= 1
            if peers[self._peer] <= 0:
                del peers[self._peer]
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
            self._body_bytes += len(data)
            if self._body is None or self._body.is_eof():
                self._to_idle()
            else:
                self._body_last_s = self._loop.time()

    def is_idle(self) -> bool:
        """Between requests on a keep-alive connection: nothing being read, handled or queued."""
        return (self._phase == _Phase.IDLE and not self._request_in_progress and not self._messages
                and self.transport is not None)

    def in_body(self) -> bool:
        """Reading a request's body (the slowest such is closed at the cap)."""
        return self._phase == _Phase.BODY and self.transport is not None

    def body_progress(self) -> tuple[GuardedRequestHandler, int, float]:
        """This connection, its body's bytes so far and the seconds since its headers (``edge_limits.slowest``)."""
        return self, self._body_bytes, self._loop.time() - self._body_started_s

    def drop(self, reason: str, detail: str) -> None:
        self._connections.waiting.pop(self, None)
        self._cancel_deadline()
        self._cancel_rate_check()
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
        self._body_last_s = self._body_started_s = self._loop.time()
        self._body_bytes = 0
        limits = self._connections.limits
        self._arm(self._body_last_s + limits.body_timeout_s, self._body_late)
        if limits.min_body_bytes_per_s > 0:
            self._cancel_rate_check()
            self._rate_check = self._loop.call_at(self._body_started_s + limits.body_grace_s, self._check_rate)

    def _to_idle(self) -> None:
        self._phase = _Phase.IDLE
        self._body = None
        self._cancel_deadline()
        self._cancel_rate_check()

    def _cancel_rate_check(self) -> None:
        if self._rate_check is not None:
            self._rate_check.cancel()
            self._rate_check = None

    def _check_rate(self) -> None:
        self._rate_check = None
        body = self._body
        if self._phase != _Phase.BODY or body is None or body.is_eof():
            return
        limits = self._connections.limits
        _, received_bytes, elapsed_s = self.body_progress()
        if not body_too_slow(received_bytes=received_bytes, elapsed_s=elapsed_s,
                             min_bytes_per_s=limits.min_body_bytes_per_s, grace_s=limits.body_grace_s):
            self._rate_check = self._loop.call_later(RATE_CHECK_S, self._check_rate)
            return
        what = (f"{received_bytes:,} bytes of request body in {elapsed_s:.1f} s, under "
                f"{limits.min_body_bytes_per_s:g} bytes/s (server.min_body_bytes_per_s) past "
                f"{limits.body_grace_s:g} s (server.body_grace_s)")
        if self._body_streamed:
            self.drop("slow_body", f"{what}; closed")
            return
        self._cut_body("slow_body", f"{what}; answered 408", f"the request body arrived at {received_bytes:,} bytes "
                       f"in {elapsed_s:.1f} s, under {limits.min_body_bytes_per_s:g} bytes/s "
                       "(server.min_body_bytes_per_s); send it faster")

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
        self._cut_body("body_timeout", f"request body not complete within {limit_s:g} s (server.body_timeout_s); "
                       "answered 408",
                       f"the request body did not arrive within {limit_s:g} s (server.body_timeout_s); send it faster")

    def _cut_body(self, reason: str, logged: str, answered: str) -> None:
        """End a body kvgate reads whole: its read fails with RequestTimeout (408), then the connection closes."""
        body = self._body
        self._connections.note(reason, f"{self._peer}: {logged}")
        self._phase = _Phase.IDLE
        self._body = None
        self._cancel_deadline()
        self._cancel_rate_check()
        self.close()  # after the answer
        if body is not None:
            body.set_exception(RequestTimeout(answered))


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
