"""The backend's out-of-memory answer, caught before it reaches the client (the rules: oom.py)."""

from __future__ import annotations

import aiohttp
import orjson
from aiohttp import web

from gateway.loads.oom import MAX_ERROR_BYTES, GpuOutOfMemory, names_gpu_oom
from gateway.support.hop_headers import downstream_response_headers


def _words(raw: bytes) -> str:
    """The message of an error body: Ollama's ``{"error": "..."}``, OpenAI's ``{"error": {"message"}}``, or text."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode("utf-8", "replace").strip()
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        error = error.get("message")
    return error if isinstance(error, str) else raw.decode("utf-8", "replace").strip()


async def held_unless_oom(upstream: aiohttp.ClientResponse, *, request_id: str,
                          extra_headers: dict[str, str]) -> web.Response | None:
    """For a short 500: raise GpuOutOfMemory when it says the GPU ran out, else the answer as it came (read whole,
    so it is relayed from here). None for anything else: relayed as usual."""
    length = upstream.content_length
    encoding = upstream.headers.get("Content-Encoding", "identity").lower()
    if upstream.status != 500 or length is None or length > MAX_ERROR_BYTES or encoding not in ("", "identity"):
        return None
    raw = await upstream.read()
    words = _words(raw)
    if names_gpu_oom(upstream.status, words):
        raise GpuOutOfMemory(words)
    headers = downstream_response_headers(upstream.headers, request_id=request_id)
    headers.update(extra_headers)
    return web.Response(status=upstream.status, reason=upstream.reason, headers=headers, body=raw)
