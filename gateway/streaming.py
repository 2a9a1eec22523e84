"""Relay a backend's response to the client chunk by chunk, never buffering a stream whole.

Status, content type and end-to-end headers pass through. An error after the headers were sent (the backend stalls
or breaks the stream) becomes a final event in the client's dialect when the body is NDJSON or SSE; any other body
is cut off by closing the connection, so the client can't mistake a partial body for a whole one.

Coalescing. A chunk that arrives after a quiet gap (longer than ``coalesce_s`` since the last write) is written at
once, so a model's tokens reach the client as they come. While chunks arrive faster than that, the relay writes at
most once per ``coalesce_s``: it waits out the rest of the interval (or the end of the body, whichever comes first)
and writes everything that came meanwhile in one piece. The bytes are the same; only their grouping into writes
changes. A fast backend then costs the client and kvgate one write and one wake-up per interval instead of per chunk.

    backend:  c1 . . . . . . . c2 c3 c4 c5 c6 . . . . . . . . . c7  (end)
    client:   c1 . . . . . . . c2 . . .|c3-c6 . . . . . . . . . c7  (end)
                                 <- coalesce_s ->

Held bodies. A body that is not a stream is read whole before the headers go out when it is small
(``SMALL_BODY_BYTES``), or, when the caller wants headers that depend on the body (``RelayPlan.truncation``:
kvgate names a silent truncation it read in the reply) or a notice in it, when it ends within ``HELD_BODY_BYTES``. A
larger one is sent on as it comes: what was held goes first, the rest streams (and gets no notice). Streams (NDJSON,
SSE) are never held.

Notices (``gateway.notice``, ``fitting.notice``). A 200 reply to a request kvgate trimmed or summarized may carry one
line saying so: a held JSON body is rewritten with it, a stream gets one extra event before its first text (the rest
of its bytes pass unchanged). The observer reads the backend's own bytes, so usage is never the notice's. A body
with a Content-Encoding kvgate can't read gets none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from gateway import dialects
from gateway.admission.elastic import Growth
from gateway.admission.shared.fencing import FenceSignal
from gateway.backends.client import broken_off
from gateway.dialects.stream_end import StreamEnding, stream_end_event
from gateway.domain import Dialect
from gateway.edge.headers import downstream_response_headers, stream_kind
from gateway.edge.serving import CONNECTIONS
from gateway.errors import BackendTimeout, GatewayError
from gateway.notice import Notice, NoticeStream
from gateway.observability.reply_checks import TruncationCheck, truncation_header
from gateway.observability.usage import UsageObserver
from gateway.support.hop_headers import NDJSON
from gateway.support.stream_drain import read_any, take_buffered

log = logging.getLogger(__name__)

SMALL_BODY_BYTES = 256 * 1024
"""Bodies of known length up to this size that are not streams are read whole and sent in one write."""
HELD_BODY_BYTES = 4 * 1024 * 1024
"""With a truncation check or a notice: non-stream bodies up to this size are read whole before the headers are
sent. A chat reply is far smaller; the bound keeps a huge body from sitting in memory."""


class ClientGone(Exception):
    """Raised when the client disconnected while the response was being written."""


class ClientStalled(ClientGone):
    """Raised when a write to the client could not drain within ``server.client_write_timeout_s``: the client
    stopped reading. Its fault, not the backend's: the connection is dropped and the reservation released."""


DEFAULT_CLIENT_WRITE_S = 60.0
"""``server.client_write_timeout_s`` for an app that has no ``gateway.edge.serving.Connections``."""


def _client_write_s(request: web.Request) -> float:
    connections = request.app.get(CONNECTIONS)
    return DEFAULT_CLIENT_WRITE_S if connections is None else connections.limits.client_write_timeout_s


@dataclass(frozen=True, slots=True)
class RelayPlan:
    """How one answer is relayed: whose it is, how long the backend may go quiet, and what kvgate does on the way."""

    dialect: Dialect
    request_id: str
    backend_label: str
    idle_s: float
    extra_headers: Mapping[str, str] = field(default_factory=dict)
    coalesce_s: float = 0.0
    observer: UsageObserver | None = None
    truncation: TruncationCheck | None = None
    """A reply held whole names a silent truncation of the forwarded prompt in a header (needs ``observer``)."""
    notice: Notice | None = None
    """The line a 200 reply gets (module docstring)."""
    fence: FenceSignal | None = None
    """The shared ledger may end the request (``gateway.admission.shared.fencing``): a stream then gets the
    fence's error as its final event."""
    growth: Growth | None = None
    """An elastic reservation (``gateway.admission.elastic``): fed the stream's events as they come (needs
    ``observer``, which counts them); when kvgate ends the reply, the stream stops at an event boundary and gets
    ``ending``'s normal final event."""
    ending: StreamEnding | None = None


@dataclass(frozen=True, slots=True)
class Relayed:
    response: web.StreamResponse
    cut: str | None = None
    """Why the backend's stream broke off after the answer began (the connection dropped, or it went silent for
    ``idle_s``): too late to retry, but the backend is suspect. None when it ended whole (or the fence ended it)."""
    ended: str | None = None
    """Why kvgate ended the reply itself (an elastic reservation with no room to grow); None: it did not."""


@dataclass(frozen=True, slots=True)
class Ended:
    """What ``pump`` returns when kvgate ended the reply (``RelayPlan.growth``): the reason, for the final event."""

    reason: str


async def relay(request: web.Request, upstream: aiohttp.ClientResponse, plan: RelayPlan) -> Relayed:
    """Relay the backend's answer as ``plan`` says; what broke it off, if anything, comes back with the response."""
    dialect, request_id = plan.dialect, plan.request_id
    observer, notice, fence = plan.observer, plan.notice, plan.fence
    headers = downstream_response_headers(upstream.headers, request_id=request_id)
    headers.update(plan.extra_headers)
    kind = stream_kind(upstream.headers.get("Content-Type", ""))
    if observer is not None:
        observer.begin(upstream.headers.get("Content-Type", ""))
    if notice is not None and (upstream.status != 200 or upstream.headers.get("Content-Encoding", "identity").lower()
                               not in ("", "identity")):
        notice = None
    rewriter = None if notice is None or kind is None else notice.stream(kind)
    if rewriter is not None:
        headers.popall("Content-Length", None)  # one event longer
    length = upstream.content_length
    holding = (plan.truncation is not None and observer is not None) or notice is not None
    hold_bytes = HELD_BODY_BYTES if holding else SMALL_BODY_BYTES
    held = b""
    held_whole = holding if length is None else length <= hold_bytes
    if kind is None and held_whole:
        held, whole = await _hold(upstream, hold_bytes, idle_s=plan.idle_s, backend_label=plan.backend_label)
        if observer is not None:
            observer.feed(held)
        if whole:
            if plan.truncation is not None and observer is not None:
                headers.update(truncation_header(observer, plan.truncation, upstream.status))
            told = None if notice is None else notice.rewrite_body(held)
            if told is not None:
                headers.popall("Content-Length", None)
            return Relayed(web.Response(status=upstream.status, reason=upstream.reason, headers=headers,
                                        body=held if told is None else told))

    response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
    await response.prepare(request)
    write_s = _client_write_s(request)
    try:
        if held:
            await _write_held(response, held, write_s)
        error = await pump(upstream, response, plan, write_s=write_s, rewriter=rewriter)
    except ClientStalled:
        _client_stalled(request, write_s)
        return Relayed(response)
    except ClientGone:
        log.info("client disconnected mid-stream; upstream request closed")
        return Relayed(response)
    if error is None:
        await response.write_eof(rewriter.end() if rewriter is not None else b"")
        return Relayed(response)
    if isinstance(error, Ended):
        return await _end_cleanly(response, plan, error, rewriter)
    fenced = fence is not None and fence.error is error  # the backend is not to blame
    log.warning("stream ended by the shared ledger's fence: %s" if fenced else "stream from backend ended early: %s",
                error.message)
    if kind is not None:
        try:
            if rewriter is not None:
                await response.write(rewriter.end())
            await response.write(dialects.stream_error_event(dialect, error))
            await response.write_eof()
        except ConnectionError:
            log.info("client disconnected before the error event could be sent")
    elif request.transport is not None:
        request.transport.close()
    return Relayed(response, cut=None if fenced else error.message)


async def _end_cleanly(response: web.StreamResponse, plan: RelayPlan, ended: Ended,
                       rewriter: NoticeStream | None) -> Relayed:
    """kvgate ended the reply: the stream gets a normal final event naming why (``dialects.stream_end``)."""
    try:
        if rewriter is not None:
            await response.write(rewriter.end())
        if plan.ending is not None:
            await response.write(stream_end_event(plan.ending, ended.reason))
        await response.write_eof()
    except ConnectionError:
        log.info("client disconnected before kvgate's final event could be sent")
    return Relayed(response, ended=ended.reason)


async def _hold(
    upstream: aiohttp.ClientResponse, limit_bytes: int, *, idle_s: float, backend_label: str
) -> tuple[bytes, bool]:
    """Read the body until it ends or passes ``limit_bytes``: what came, and whether that is all of it."""
    content = upstream.content
    chunks: list[bytes] = []
    size = 0
    try:
        while size <= limit_bytes:
            chunk = content.read_nowait()  # what came with the headers: no timer for bytes already here
            if not chunk and not content.is_eof():
                async with asyncio.timeout(idle_s):
                    chunk = await content.readany()
            if not chunk:
                return b"".join(chunks), True
            chunks.append(chunk)
            size += len(chunk)
    except TimeoutError:
        raise BackendTimeout(f"{backend_label} stalled: no data for {idle_s:g} s (timeouts.idle_s)") from None
    except aiohttp.ClientError as exc:
        raise broken_off(exc, backend_label) from None
    return b"".join(chunks), content.at_eof()


def _client_stalled(request: web.Request, write_s: float) -> None:
    """Drop the connection of a client that stopped reading (``abort``: a close would wait for the unsent bytes)
    and report it as the client's fault."""
    detail = (f"client stopped reading: a response write did not drain within {write_s:g} s "
              "(server.client_write_timeout_s); response ended, upstream request closed")
    connections = request.app.get(CONNECTIONS)
    if connections is not None:
        connections.note("client_write_timeout", f"{request.remote}: {detail}")
    else:
        log.warning("%s", detail)
    if request.transport is not None:
        request.transport.abort()


async def _write_held(response: web.StreamResponse, held: bytes, write_s: float) -> None:
    try:
        async with asyncio.timeout(write_s):
            await response.write(held)
    except ConnectionError:
        raise ClientGone from None
    except TimeoutError:
        raise ClientStalled from None


class _IdleWatchdog:
    """Fires ``on_idle`` once the backend sent nothing for ``idle_s`` (``last_s``, the end of the last write), or a
    write to the client did not finish within ``write_s`` (``writing_since``); ``fired`` says which: "backend" or
    "client". The time spent writing is not the backend's. Feeding costs float stores, not a timer: the one timer
    is moved earlier only when a write's deadline comes before it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, idle_s: float, on_idle: Callable[[], object],
                 write_s: float = math.inf) -> None:
        self._loop = loop
        self._idle_s = idle_s
        self._write_s = write_s
        self._on_idle = on_idle
        self.last_s = loop.time()
        self.writing_since: float | None = None
        self.fired: str | None = None
        self._due_s = self.last_s + idle_s
        self._handle = loop.call_at(self._due_s, self._check)

    def start_write(self) -> None:
        now = self.writing_since = self._loop.time()
        due = now + self._write_s
        if due < self._due_s:
            self._handle.cancel()
            self._due_s = due
            self._handle = self._loop.call_at(due, self._check)

    def _check(self) -> None:
        writing = self.writing_since is not None
        due = self.writing_since + self._write_s if self.writing_since is not None else self.last_s + self._idle_s
        if self._loop.time() >= due:
            self.fired = "client" if writing else "backend"
            self._on_idle()
        else:
            self._due_s = due
            self._handle = self._loop.call_at(due, self._check)

    def cancel(self) -> None:
        self._handle.cancel()


async def pump(
    upstream: aiohttp.ClientResponse, response: web.StreamResponse, plan: RelayPlan, *, write_s: float = math.inf,
    rewriter: NoticeStream | None = None,
) -> GatewayError | Ended | None:
    """Copy chunks until the backend's body ends, coalescing fast ones (module docstring); returns the backend's
    failure, if any. Raises ``ClientGone`` when the client left, ``ClientStalled`` when a write did not drain
    within ``write_s``. With a ``rewriter``, the client gets what it makes of each chunk (the plan's observer, the
    backend's own). The plan's fence, when it fires, ends the copy with the fence's error."""
    idle_s, coalesce_s, backend_label, observer, fence = (plan.idle_s, plan.coalesce_s, plan.backend_label,
                                                          plan.observer, plan.fence)
    loop = asyncio.get_running_loop()
    content = upstream.content
    task = asyncio.current_task()
    assert task is not None
    watchdog = _IdleWatchdog(loop, idle_s, task.cancel, write_s)
    last_write_s = -math.inf
    growth = plan.growth if observer is not None and plan.growth is not None and plan.growth.streamed else None
    events = None if growth is None else _EventEdges(stream_kind(upstream.headers.get("Content-Type", "")))
    if growth is not None:
        growth.interrupt = task.cancel  # another reply's growth may end this one (admission/elastic.py)
    try:
        while True:
            chunk = b""
            error: GatewayError | None = None
            try:
                chunk = await read_any(content)
                due_s = last_write_s + coalesce_s
                if chunk and loop.time() < due_s and not content.is_eof():
                    # It came fast: wait out the interval (the body's end or failure cuts the wait short), then
                    # write all that came meanwhile.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout_at(due_s):
                            await content.wait_eof()
                    chunk += take_buffered(content)
            except aiohttp.ClientError as exc:
                error = broken_off(exc, backend_label, "stream")
                if not chunk:
                    return error
            if not chunk:
                if events is not None:  # the body ended after a chunk that did not say so: what was held goes now
                    await _write_last(response, events.whole(b"", True), watchdog)
                return None
            if observer is not None:
                observer.feed(chunk)
            at_end = error is None and content.at_eof()
            if events is not None and growth is not None:
                chunk = events.whole(chunk, at_end)  # written up to an event's end, so kvgate can end it cleanly
                if not growth.seen(observer.streamed_chunks if observer is not None else 0):
                    await _write_last(response, chunk if rewriter is None else rewriter.feed(chunk), watchdog)
                    return Ended(growth.ended or "kvgate ended the reply")
            if rewriter is not None:
                chunk = rewriter.feed(chunk) + (rewriter.end() if at_end else b"")
            watchdog.start_write()
            try:
                if at_end:  # the body's end came with it: send both in one write
                    await response.write_eof(chunk)
                    return None
                if chunk:
                    await response.write(chunk)
            except ConnectionError:
                raise ClientGone from None
            watchdog.writing_since = None
            if error is not None:
                return error
            last_write_s = watchdog.last_s = loop.time()
    except asyncio.CancelledError:
        if growth is not None and growth.ended is not None and watchdog.fired is None:
            task.uncancel()  # another reply's growth ended this one: what was copied ends at an event boundary
            return Ended(growth.ended)
        fenced = None if fence is None or watchdog.fired is not None else fence.absorb()
        if fenced is not None:
            return fenced
        if watchdog.fired is None:
            raise
        task.uncancel()
        if watchdog.fired == "client":
            raise ClientStalled from None
        return BackendTimeout(f"{backend_label} stalled: no data for {idle_s:g} s (timeouts.idle_s)")
    finally:
        watchdog.cancel()
        if growth is not None:
            growth.interrupt = None


async def _write_last(response: web.StreamResponse, chunk: bytes, watchdog: _IdleWatchdog) -> None:
    """The events that came before kvgate ended the reply."""
    if not chunk:
        return
    watchdog.start_write()
    try:
        await response.write(chunk)
    except ConnectionError:
        raise ClientGone from None
    watchdog.writing_since = None


class _EventEdges:
    """Holds back the part of a chunk after its last whole event (NDJSON line, SSE event), so every write ends at
    an event boundary; the bytes and their order are unchanged. A server whose events kvgate can't find is passed
    through once ``MAX_PARTIAL_BYTES`` are held (its reply then can't be ended cleanly, only closed)."""

    MAX_PARTIAL_BYTES = 64 * 1024
    __slots__ = ("_held", "_separators")

    def __init__(self, kind: str | None) -> None:
        self._separators = (b"\n",) if kind == NDJSON else (b"\n\n", b"\r\n\r\n")
        self._held = b""

    def whole(self, chunk: bytes, at_end: bool) -> bytes:
        data = self._held + chunk if self._held else chunk
        if at_end or len(data) > self.MAX_PARTIAL_BYTES:
            self._held = b""
            return data
        edge = max(data.rfind(sep) + len(sep) if data.rfind(sep) >= 0 else 0 for sep in self._separators)
        self._held = data[edge:]
        return data[:edge]
