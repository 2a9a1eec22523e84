"""Writing responses the way the real servers do: JSON bodies, and streams whose headers wait for the first
chunk (so an error before any output still gets its real status, as Ollama's ``streamResponse`` and
llama-server's "await the first result" both do)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from kvsim.ollama import gojson

JSON_TYPE = "application/json; charset=utf-8"


def json_response(status: int, body: Any, *, newline: bool = False) -> web.Response:
    """A Go-encoded JSON body (Ollama); ``newline`` for ``json.Encoder`` output (its /v1 layer)."""
    data = gojson.dumps(body)
    return web.Response(
        status=status, body=data + (b"\n" if newline else b""), content_type="application/json", charset="utf-8"
    )


class LazyStream:
    """A streaming response prepared on its first write."""

    def __init__(self, request: web.Request, content_type: str) -> None:
        self.request = request
        self.response = web.StreamResponse(status=200)
        self.response.content_type = content_type
        self.started = False

    async def write(self, data: bytes) -> None:
        if not self.started:
            self.started = True
            await self.response.prepare(self.request)
        await self.response.write(data)

    async def finish(self) -> web.StreamResponse:
        if not self.started:
            self.started = True
            await self.response.prepare(self.request)
        await self.response.write_eof()
        return self.response
