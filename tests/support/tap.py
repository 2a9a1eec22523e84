"""Byte-exact recordings of HTTP traffic for tests that must show kvgate passes bytes through unchanged.

- :class:`Tap` is a real aiohttp server between kvgate and a backend: it forwards every request and streams the
  backend's answer back chunk by chunk, keeping a copy of each answer's body (``bodies[path]``, in order).
- :class:`RecordingTransport` (httpx, for the official ``ollama`` client) and :class:`RecordingTransport2` (httpx2,
  for the official ``openai`` client) are transports the unmodified clients take: they keep the headers and the body
  bytes of the last response the client read (``last``).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator

import aiohttp
import httpx
import httpx2
from aiohttp import web

from tests.support.fake_backend import serve

HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "host"})


class Tap:
    def __init__(self, backend_url: str) -> None:
        self.backend_url = backend_url
        self.bodies: dict[str, list[bytes]] = defaultdict(list)
        self.url = ""

    def last(self, path: str) -> bytes:
        return self.bodies[path][-1]

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        body = await request.read()
        async with aiohttp.ClientSession(auto_decompress=False) as http, http.request(
                request.method, self.backend_url + request.path_qs, data=body or None, headers=headers) as upstream:
            response = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in HOP})
            await response.prepare(request)
            copy = bytearray()
            async for chunk in upstream.content.iter_any():
                copy += chunk
                await response.write(chunk)
            await response.write_eof()
        self.bodies[request.path].append(bytes(copy))
        return response


@contextlib.asynccontextmanager
async def tapped(backend_url: str) -> AsyncIterator[Tap]:
    tap = Tap(backend_url)
    app = web.Application(client_max_size=64 << 20)
    app.router.add_route("*", "/{tail:.*}", tap._forward)
    async with serve(app) as url:
        tap.url = url
        yield tap


class _Recorded(httpx.AsyncByteStream):
    def __init__(self, stream: httpx.AsyncByteStream, into: bytearray) -> None:
        self._stream, self._into = stream, into

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            self._into += chunk
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


class RecordingTransport(httpx.AsyncHTTPTransport):
    """An httpx transport (the ``ollama`` client's) that keeps the headers and the body bytes (as sent) of the last
    response the client read."""

    def __init__(self) -> None:
        super().__init__()
        self._body = bytearray()
        self.headers: dict[str, str] = {}

    @property
    def last(self) -> bytes:
        return bytes(self._body)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        self._body = bytearray()
        self.headers = {k.lower(): v for k, v in response.headers.items()}
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _Recorded(response.stream, self._body)
        return response


class _Recorded2(httpx2.AsyncByteStream):
    def __init__(self, stream: httpx2.AsyncByteStream, into: bytearray) -> None:
        self._stream, self._into = stream, into

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            self._into += chunk
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


class RecordingTransport2(httpx2.AsyncHTTPTransport):
    """The same for the ``openai`` client, which is built on httpx2."""

    def __init__(self) -> None:
        super().__init__()
        self._body = bytearray()
        self.headers: dict[str, str] = {}

    @property
    def last(self) -> bytes:
        return bytes(self._body)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await super().handle_async_request(request)
        self._body = bytearray()
        self.headers = {k.lower(): v for k, v in response.headers.items()}
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        response.stream = _Recorded2(response.stream, self._body)
        return response
