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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable

import aiohttp
from aiohttp import web

from gateway import dialects
from gateway.domain import Dialect
from gateway.errors import BackendTimeout, BackendUnavailable, GatewayError
from gateway.framing import stream_kind
from gateway.headers import downstream_response_headers
from gateway.usage import UsageObserver

log = logging.getLogger(__name__)

SMALL_BODY_BYTES = 256 * 1024
"""Bodies of known length up to this size that are not streams are read whole and sent in one write."""


class ClientGone(Exception):
    """Raised when the client disconnected while the response was being written."""


async def relay(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    *,
    dialect: Dialect,
    idle_s: float,
    request_id: str,
    backend_label: str,
    extra_headers: dict[str, str],
    observer: UsageObserver | None = None,
    coalesce_s: float = 0.0,
) -> web.StreamResponse:
    headers = downstream_response_headers(upstream.headers, request_id=request_id)
    headers.update(extra_headers)
    kind = stream_kind(upstream.headers.get("Content-Type", ""))
    if observer is not None:
        observer.begin(upstream.headers.get("Content-Type", ""))
    length = upstream.content_length
    if kind is None and length is not None and length <= SMALL_BODY_BYTES:
        try:
            async with asyncio.timeout(idle_s):
                body = await upstream.read()
        except TimeoutError:
            raise BackendTimeout(f"{backend_label} stalled: no data for {idle_s:g} s (timeouts.idle_s)") from None
        except aiohttp.ClientError as exc:
            raise BackendUnavailable(f"{backend_label} broke off its response: {exc or type(exc).__name__}") from None
        if observer is not None:
            observer.feed(body)
        return web.Response(status=upstream.status, reason=upstream.reason, headers=headers, body=body)

    response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
    await response.prepare(request)
    try:
        error = await pump(upstream, response, idle_s=idle_s, coalesce_s=coalesce_s, backend_label=backend_label,
                            observer=observer)
    except ClientGone:
        log.info("client disconnected mid-stream; upstream request closed")
        return response
    if error is None:
        await response.write_eof()
        return response
    log.warning("stream from backend ended early: %s", error.message)
    if kind is not None:
        try:
            await response.write(dialects.stream_error_event(dialect, error))
            await response.write_eof()
        except ConnectionError:
            log.info("client disconnected before the error event could be sent")
    elif request.transport is not None:
        request.transport.close()
    return response


class _IdleWatchdog:
    """Fires ``on_idle`` once nothing was fed for ``idle_s``; feeding costs one float store, not a timer."""

    def __init__(self, loop: asyncio.AbstractEventLoop, idle_s: float, on_idle: Callable[[], object]) -> None:
        self._loop = loop
        self._idle_s = idle_s
        self._on_idle = on_idle
        self.last_s = loop.time()
        self.fired = False
        self._handle = loop.call_at(self.last_s + idle_s, self._check)

    def _check(self) -> None:
        due = self.last_s + self._idle_s
        if self._loop.time() >= due:
            self.fired = True
            self._on_idle()
        else:
            self._handle = self._loop.call_at(due, self._check)

    def cancel(self) -> None:
        self._handle.cancel()


async def pump(
    upstream: aiohttp.ClientResponse,
    response: web.StreamResponse,
    *,
    idle_s: float,
    coalesce_s: float,
    backend_label: str,
    observer: UsageObserver | None,
) -> GatewayError | None:
    """Copy chunks until the backend's body ends, coalescing fast ones (module docstring); returns the backend's
    failure, if any."""
    loop = asyncio.get_running_loop()
    content = upstream.content
    task = asyncio.current_task()
    assert task is not None
    watchdog = _IdleWatchdog(loop, idle_s, task.cancel)
    last_write_s = -math.inf
    try:
        while True:
            chunk = b""
            error: GatewayError | None = None
            try:
                chunk = await content.readany()
                due_s = last_write_s + coalesce_s
                if chunk and loop.time() < due_s and not content.is_eof():
                    # It came fast: wait out the interval (the body's end or failure cuts the wait short), then
                    # write all that came meanwhile.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout_at(due_s):
                            await content.wait_eof()
                    chunk += content.read_nowait()
            except aiohttp.ClientError as exc:
                error = BackendUnavailable(f"{backend_label} broke off the stream: {exc or type(exc).__name__}")
                if not chunk:
                    return error
            if not chunk:
                return None
            if observer is not None:
                observer.feed(chunk)
            try:
                if error is None and content.at_eof():  # the body's end came with it: send both in one write
                    await response.write_eof(chunk)
                    return None
                await response.write(chunk)
            except ConnectionError:
                raise ClientGone from None
            if error is not None:
                return error
            last_write_s = watchdog.last_s = loop.time()
    except asyncio.CancelledError:
        if not watchdog.fired:
            raise
        task.uncancel()
        return BackendTimeout(f"{backend_label} stalled: no data for {idle_s:g} s (timeouts.idle_s)")
    finally:
        watchdog.cancel()
