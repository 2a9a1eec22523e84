"""A scripted fake LLM server: a real aiohttp application on 127.0.0.1:0 speaking just enough Ollama, OpenAI
and llama-server for the gateway's tests, with faults on demand.

Each fault is one attribute of :class:`Script`; the server records every request it saw and every request whose
handler was cancelled (the client, i.e. the gateway, closed the connection).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from gateway.app import start_server

MODELS = ("llama3.1:8b", "qwen2.5:7b")
CONTEXT_TOKENS = 8192
"""Loaded models have this context (/api/ps), and /props reports it per slot."""
PROBES = frozenset({"/api/ps", "/props", "/api/tags", "/v1/models"})
"""What kvgate asks to learn a KV pool; faults in the script apply to the other paths."""


@dataclass
class Script:
    """What the fake does next; tests change fields between requests."""

    chunks: int = 3
    first_byte_delay_s: float = 0.0
    stall_after_chunks: int | None = None
    disconnect_after_chunks: int | None = None
    malformed_after_chunks: int | None = None
    hold_after_chunks: int | None = None
    release: asyncio.Event = field(default_factory=asyncio.Event)
    extra_headers: dict[str, str] = field(default_factory=dict)
    status: int = 200
    error_body: bytes = b'{"error":"boom"}'
    models: tuple[str, ...] = MODELS


@dataclass
class Seen:
    method: str
    path_qs: str
    headers: dict[str, str]
    body: bytes


@dataclass
class FakeLLM:
    script: Script = field(default_factory=Script)
    seen: list[Seen] = field(default_factory=list)
    cancelled: list[tuple[str, float]] = field(default_factory=list)
    url: str = ""
    loaded: set[str] = field(default_factory=set)
    """Models loaded by a request; the first model is loaded from the start."""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append(Seen(request.method, request.path_qs, dict(request.headers), body))
        try:
            return await self._respond(request, body)
        except asyncio.CancelledError:
            self.cancelled.append((request.path, time.monotonic()))
            raise

    async def _respond(self, request: web.Request, body: bytes) -> web.StreamResponse:
        s = self.script
        if s.first_byte_delay_s:
            await asyncio.sleep(s.first_byte_delay_s)
        path = request.path
        if s.status != 200 and path not in PROBES:
            return web.Response(status=s.status, body=s.error_body, content_type="application/json")
        if path == "/props":
            return web.json_response({"default_generation_settings": {"n_ctx": CONTEXT_TOKENS}, "total_slots": 4,
                                      "model_path": "/models/fake.gguf", "model_alias": ""})
        if path == "/api/tags":
            return web.json_response({"models": [{"name": m, "model": m, "size": 1} for m in s.models]})
        if path == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": m, "object": "model"} for m in s.models]})
        if path == "/api/ps":
            loaded = [m for m in s.models if m == s.models[0] or m in self.loaded]
            return web.json_response({"models": [{"name": m, "model": m, "size": 1, "size_vram": 1,
                                                  "context_length": CONTEXT_TOKENS} for m in loaded]})
        if path == "/api/version":
            return web.json_response({"version": "0.33.0"})
        if path == "/":
            return web.Response(text="Ollama is running")
        if path.startswith("/api/blobs/"):
            return web.Response(status=201)
        try:
            request_json: dict[str, Any] = json.loads(body.decode("utf-8", "surrogateescape")) if body else {}
        except ValueError:
            request_json = {}
        model = request_json.get("model", "")
        if path in ("/api/embed", "/v1/embeddings", "/api/embeddings"):
            return self._embedding(path, model)
        if path in ("/api/chat", "/api/generate"):
            self.loaded.add(model)  # Ollama loads the model for any chat or generate, a load request included
            stream = request_json.get("stream", True) is not False
            return await self._ollama(request, path, model, stream)
        if path in ("/v1/chat/completions", "/v1/completions", "/completion", "/v1/messages", "/v1/responses"):
            return await self._openai(request, path, model, bool(request_json.get("stream")))
        return web.json_response({"echo": path})

    def _embedding(self, path: str, model: str) -> web.Response:
        vector = [0.1, 0.2, 0.3]
        if path == "/api/embed":
            return web.json_response({"model": model, "embeddings": [vector], "prompt_eval_count": 2})
        if path == "/api/embeddings":
            return web.json_response({"embedding": vector})
        return web.json_response({
            "object": "list", "model": model,
            "data": [{"object": "embedding", "index": 0, "embedding": vector}],
            "usage": {"prompt_tokens": 2, "total_tokens": 2},
        })

    def _ollama_chunk(self, path: str, model: str, index: int, done: bool) -> dict[str, Any]:
        chunk: dict[str, Any] = {"model": model, "created_at": "2026-11-29T00:00:00Z", "done": done}
        text = "" if done else f"tok{index} "
        if path == "/api/chat":
            chunk["message"] = {"role": "assistant", "content": text}
        else:
            chunk["response"] = text
        if done:
            chunk.update(done_reason="stop", prompt_eval_count=7, eval_count=self.script.chunks,
                         total_duration=1000, eval_duration=500)
        return chunk

    async def _ollama(self, request: web.Request, path: str, model: str, stream: bool) -> web.StreamResponse:
        n = self.script.chunks
        if not stream:
            final = self._ollama_chunk(path, model, 0, True)
            text = "".join(f"tok{i} " for i in range(n))
            if path == "/api/chat":
                final["message"] = {"role": "assistant", "content": text}
            else:
                final["response"] = text
            return web.json_response(final)
        lines = [orjson.dumps(self._ollama_chunk(path, model, i, False)) + b"\n" for i in range(n)]
        lines.append(orjson.dumps(self._ollama_chunk(path, model, n, True)) + b"\n")
        return await self._stream(request, "application/x-ndjson", lines)

    async def _openai(self, request: web.Request, path: str, model: str, stream: bool) -> web.StreamResponse:
        n = self.script.chunks
        usage = {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}
        chat = path == "/v1/chat/completions"
        if not stream:
            text = "".join(f"tok{i} " for i in range(n))
            choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            return web.json_response({
                "id": "cmpl-1", "object": "chat.completion" if chat else "text_completion", "created": 1,
                "model": model, "choices": [choice], "usage": usage,
            })
        events = []
        for i in range(n):
            delta: dict[str, Any] = {"index": 0, "finish_reason": None}
            if chat:
                delta["delta"] = {"role": "assistant", "content": f"tok{i} "}
            else:
                delta["text"] = f"tok{i} "
            obj = "chat.completion.chunk" if chat else "text_completion"
            chunk = {"id": "cmpl-1", "object": obj, "created": 1, "model": model, "choices": [delta]}
            events.append(b"data: " + orjson.dumps(chunk) + b"\n\n")
        last: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
        last["delta" if chat else "text"] = {} if chat else ""
        obj = "chat.completion.chunk" if chat else "text_completion"
        final = {"id": "cmpl-1", "object": obj, "created": 1, "model": model, "choices": [last], "usage": usage}
        events.append(b"data: " + orjson.dumps(final) + b"\n\n")
        events.append(b"data: [DONE]\n\n")
        return await self._stream(request, "text/event-stream", events)

    async def _stream(self, request: web.Request, content_type: str, frames: list[bytes]) -> web.StreamResponse:
        s = self.script
        headers = {"Content-Type": content_type, "X-Upstream": "fake", **s.extra_headers}
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        for index, frame in enumerate(frames):
            if index == s.hold_after_chunks:
                await s.release.wait()
            if index == s.stall_after_chunks:
                await asyncio.sleep(3600)
            if index == s.disconnect_after_chunks:
                assert request.transport is not None
                request.transport.close()
                return response
            if index == s.malformed_after_chunks:
                await response.write(b"{not json\n")
            await response.write(frame)
        await response.write_eof()
        return response


@asynccontextmanager
async def running(fake: FakeLLM) -> AsyncIterator[FakeLLM]:
    runner, port = await start_server(fake.app(), "127.0.0.1", 0)
    fake.url = f"http://127.0.0.1:{port}"
    try:
        yield fake
    finally:
        await runner.cleanup()
