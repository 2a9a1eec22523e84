"""The one fake backend for the tests: real aiohttp applications on 127.0.0.1:0.

- :func:`serve` runs any application, or a table of ``(method, path) -> handler`` routes, and yields its URL.
- :class:`FakeLLM` speaks just enough Ollama, OpenAI and llama-server for the gateway, with faults on demand: each
  fault is one attribute of :class:`Script`. It records every request it saw and every request whose handler was
  cancelled (the client, i.e. the gateway, closed the connection). ``answers`` plugs in extra or replacement routes
  by path; :class:`OllamaModels` is such a plug: Ollama's model routes built from real GGUF metadata.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from gateway.support.gguf_reader import read_gguf

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Routes = Mapping[tuple[str, str], Handler]
"""(method, path) -> handler; method "*" for any."""

MODELS = ("llama3.1:8b", "qwen2.5:7b")
CONTEXT_TOKENS = 8192
"""Loaded models have this context (/api/ps), and /props reports it per slot."""
PROBES = frozenset({"/api/ps", "/props", "/api/tags", "/v1/models"})
"""What kvgate asks to learn a KV pool; faults in the script apply to the other paths."""
OPENAI_GENERATION = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/completion", "/v1/messages", "/v1/responses"})
GENERATION = OPENAI_GENERATION | {"/api/chat", "/api/generate"}
VOCAB_DIR = Path(__file__).resolve().parents[2] / "gateway" / "data" / "vocab"
MODEL_SIZE_BYTES = 4_920_734_016


@contextlib.asynccontextmanager
async def serve(app_or_routes: web.Application | Routes) -> AsyncIterator[str]:
    """Run an application (or one made of ``routes``) on a free loopback port; yields its base URL. A client that
    disconnects cancels its handler, as behind kvgate's own server; request bodies arrive as sent."""
    app = app_or_routes if isinstance(app_or_routes, web.Application) else _app_of(app_or_routes)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, auto_decompress=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def _app_of(routes: Routes) -> web.Application:
    app = web.Application()
    for (method, path), handler in routes.items():
        app.router.add_route(method, path, handler)
    return app


def json_answer(body: Any, status: int = 200) -> Handler:
    """A handler that always answers ``body`` as JSON."""

    async def answer(_: web.Request) -> web.StreamResponse:
        return web.json_response(body, status=status)

    return answer


def text_answer(text: str, status: int = 200, content_type: str = "text/plain") -> Handler:
    """A handler that always answers ``text``."""

    async def answer(_: web.Request) -> web.StreamResponse:
        return web.Response(text=text, status=status, content_type=content_type)

    return answer


@dataclass
class Script:
    """What the fake does next; tests change fields between requests."""

    chunks: int = 3
    first_byte_delay_s: float = 0.0
    probe_delay_s: float = 0.0
    """Every answer to a probe (PROBES) takes this long; first_byte_delay_s delays the others."""
    stall_after_chunks: int | None = None
    disconnect_after_chunks: int | None = None
    malformed_after_chunks: int | None = None
    hold_after_chunks: int | None = None
    release: asyncio.Event = field(default_factory=asyncio.Event)
    extra_headers: dict[str, str] = field(default_factory=dict)
    status: int = 200
    error_body: bytes = b'{"error":"boom"}'
    models: tuple[str, ...] = MODELS
    drop_connections: int = 0
    """Close the connection without an answer on this many of the next chat, generate or completion requests."""


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
    answers: dict[str, Handler] = field(default_factory=dict)
    """path -> handler, in front of the built-in answers and of the script's faults (its delays apply)."""

    def requests_to(self, path: str) -> list[Seen]:
        """The requests seen for ``path`` (the query string ignored), in order."""
        return [seen for seen in self.seen if seen.path_qs.partition("?")[0] == path]

    def json_bodies(self, path: str) -> list[Any]:
        return [json.loads(seen.body) for seen in self.requests_to(path)]

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
        path = request.path
        delay_s = s.probe_delay_s if path in PROBES else s.first_byte_delay_s
        if delay_s:
            await asyncio.sleep(delay_s)  # the scripted slow first byte
        if path in self.answers:
            return await self.answers[path](request)
        if s.drop_connections and path in GENERATION:
            s.drop_connections -= 1
            assert request.transport is not None
            request.transport.close()
            return web.Response()
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
        if path in OPENAI_GENERATION:
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
                await asyncio.sleep(3600)  # the scripted stall: the stream never goes on
            if index == s.disconnect_after_chunks:
                assert request.transport is not None
                request.transport.close()
                return response
            if index == s.malformed_after_chunks:
                await response.write(b"{not json\n")
            await response.write(frame)
        await response.write_eof()
        return response


@contextlib.asynccontextmanager
async def running(fake: FakeLLM) -> AsyncIterator[FakeLLM]:
    async with serve(fake.app()) as url:
        fake.url = url
        yield fake


def gguf_info(vocab_file: str) -> dict[str, Any]:
    """A GGUF file's key/values as Ollama's verbose /api/show gives them in model_info (token lists abridged)."""
    metadata = read_gguf(VOCAB_DIR / vocab_file).metadata
    info: dict[str, Any] = {}
    for key, value in metadata.items():
        if key.endswith(".count") and key.startswith("tokenizer.ggml."):
            info[key.removesuffix(".count")] = ["<tok>"] * 3
        elif key not in ("general.name", "tokenizer.chat_template"):
            info[key] = value
    info["general.parameter_count"] = 8_030_261_248
    return info


def show_answer(model: str | Mapping[str, Any], *, verbose: bool, num_ctx: int | None = 8192) -> dict[str, Any]:
    """/api/show as Ollama builds it for ``model`` (a vocab file in gateway/data/vocab, or model_info key/values):
    without verbose, arrays are null."""
    info = gguf_info(model) if isinstance(model, str) else dict(model)
    if not verbose:
        info = {key: None if isinstance(value, list) else value for key, value in info.items()}
    family = str(info.get("general.architecture", "llama"))
    return {
        "license": "...",
        "modelfile": "FROM /models/blob\n",
        "parameters": f"num_ctx                        {num_ctx}\nstop \"<|eot_id|>\"" if num_ctx else "",
        "template": "{{ .Prompt }}",
        "details": {"parent_model": "", "format": "gguf", "family": family, "families": [family],
                    "parameter_size": "8.0B", "quantization_level": "Q4_K_M"},
        "model_info": info,
        "tensors": [
            {"name": "token_embd.weight", "type": "Q4_K", "shape": [4096, 128256]},
            {"name": "output_norm.weight", "type": "F32", "shape": [4096]},
        ],
        "capabilities": ["completion", "tools"],
        "modified_at": "2026-11-01T10:00:00Z",
    }


@dataclass
class OllamaModels:
    """Ollama's model routes for :class:`FakeLLM`'s ``answers``: /api/tags with digests and /api/show (404 for a
    model it lacks; a name without a tag means ``:latest``), and /api/ps when ``ps_models`` is set. Tests may change
    ``models`` and ``ps_models`` between requests."""

    models: dict[str, tuple[str | Mapping[str, Any], str]]
    """name -> (vocab file or model_info key/values, digest)."""
    ps_models: Sequence[dict[str, Any]] | None = None

    def answers(self) -> dict[str, Handler]:
        answers: dict[str, Handler] = {"/api/tags": self.tags, "/api/show": self.show}
        if self.ps_models is not None:
            answers["/api/ps"] = self.ps
        return answers

    async def tags(self, _: web.Request) -> web.StreamResponse:
        return web.json_response({"models": [
            {"name": name, "model": name, "digest": digest, "size": MODEL_SIZE_BYTES}
            for name, (_, digest) in self.models.items()]})

    async def show(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        name = str(body.get("model"))
        name = name if ":" in name else f"{name}:latest"
        if name not in self.models:
            return web.json_response({"error": f"model '{body.get('model')}' not found"}, status=404)
        return web.json_response(show_answer(self.models[name][0], verbose=bool(body.get("verbose"))))

    async def ps(self, _: web.Request) -> web.StreamResponse:
        return web.json_response({"models": list(self.ps_models or ())})
