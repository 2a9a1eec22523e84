"""llama-server's generation routes (llama-server.md sections 1, 2 and 7) over ``LlamaServerEngine``.

Bodies are llama-server's: errors ``{"error": {"code", "message", "type"}}`` (plus ``n_prompt_tokens`` and
``n_ctx`` for ``exceed_context_size_error``); replies in each route's own shape (``llama_formats``). Streams are
SSE; their headers wait for the first result, so a refused prompt is still a 400; an error after that is one
error event and the stream ends without ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from kvsim.failures import SimError
from kvsim.llama_server import llama_requests
from kvsim.llama_server.llama_engine import ExceedContextSize, LlamaServerEngine, ServerResult
from kvsim.llama_server.llama_formats import (
    BUILD_INFO,
    AnthropicFormat,
    ChatFormat,
    Format,
    NativeFormat,
    OaiCompletionFormat,
    ResponsesFormat,
)
from kvsim.llama_server.llama_requests import Generation
from kvsim.state import SIM_STATE
from kvsim.wire import LazyStream

__all__ = ["BUILD_INFO", "chat_tokens", "engine_of", "error_reply", "read_json", "reply"]

_ERROR_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}
Parser = Callable[[LlamaServerEngine, dict[str, Any]], Generation]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def reply(status: int, body: Any) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json", charset="utf-8")


def error_body(exc: SimError) -> dict[str, Any]:
    """``format_error_response`` (and ``server_task_result_error::to_json`` for context-size errors)."""
    if isinstance(exc, ExceedContextSize):
        return {
            "error": {
                "code": 400,
                "message": exc.message,
                "type": "exceed_context_size_error",
                "n_prompt_tokens": exc.n_prompt_tokens,
                "n_ctx": exc.n_ctx,
            }
        }
    return {"error": {"code": exc.status, "message": exc.message, "type": _ERROR_TYPES.get(exc.status, "server_error")}}


def error_reply(exc: SimError) -> web.Response:
    return reply(exc.status, error_body(exc))


async def read_json(request: web.Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.read() or b"{}")
    except orjson.JSONDecodeError as exc:
        raise SimError(400, f"[json.exception.parse_error.101] parse error: {exc}") from None
    if not isinstance(body, dict):
        raise SimError(400, "request body must be a JSON object")
    return body


def engine_of(request: web.Request) -> LlamaServerEngine:
    return request.app[SIM_STATE].llama


def chat_tokens(engine: LlamaServerEngine, body: dict[str, Any]) -> list[int]:
    return llama_requests.chat_prompt(engine, body)


def _format(kind: type[Format], request: web.Request, body: dict[str, Any], gen: Generation) -> Format:
    state = request.app[SIM_STATE]
    ident = "chatcmpl-" + "".join(
        random.Random(state.stats.requests).choices("abcdefghijklmnopqrstuvwxyz0123456789", k=32)
    )
    opts = body.get("stream_options")
    include_usage = isinstance(opts, dict) and opts.get("include_usage") is True
    fmt = kind(ident, int(state.clock.wall().timestamp()), state.llama.spec.name, include_usage)
    if isinstance(fmt, NativeFormat):
        fmt.n_predict = gen.n_predict
    return fmt


def route(parse: Parser, kind: type[Format]) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        engine = engine_of(request)
        try:
            body = await read_json(request)
            gen = parse(engine, body)
        except SimError as exc:
            return error_reply(exc)
        return await _generate(request, engine, gen, _format(kind, request, body, gen))

    return handler


@dataclass(frozen=True)
class _Event:
    """What one task of a request did: generated ``token`` (``piece``), ended (``done``), or failed (``error``)."""

    index: int
    token: int = -1
    piece: str = ""
    done: bool = False
    error: SimError | None = None


async def _run_task(
    engine: LlamaServerEngine, gen: Generation, index: int, result: ServerResult, events: asyncio.Queue[_Event]
) -> None:
    """One task (one prompt) in a slot of its own; a batch larger than the slots waits in the deferred queue. Each
    token waits until the reply has written it (the result it reads is the task's live one)."""
    try:
        async with engine.slot() as slot:
            slot.stream = gen.stream
            async for token in engine.run(slot, gen.prompts[index], gen.n_predict, result, ignore_eos=gen.ignore_eos):
                await events.put(_Event(index, token, engine.tokenizer.piece(token)))
                await events.join()
    except SimError as exc:
        await events.put(_Event(index, error=exc))
        return
    await events.put(_Event(index, done=True))


async def _generate(
    request: web.Request, engine: LlamaServerEngine, gen: Generation, fmt: Format
) -> web.StreamResponse:
    """Run every task of the request at once (each in its own slot); the first error ends the request (the other
    tasks are cancelled, ``server_response_reader::stop``)."""
    state = request.app[SIM_STATE]
    out = LazyStream(request, "text/event-stream")
    count = len(gen.prompts)
    formats = [fmt] if count == 1 else [dataclasses.replace(fmt, index=i) for i in range(count)]
    results = [ServerResult() for _ in range(count)]
    texts: list[list[str]] = [[] for _ in range(count)]
    events: asyncio.Queue[_Event] = asyncio.Queue()
    state.stats.requests += 1
    tasks = [asyncio.ensure_future(_run_task(engine, gen, i, results[i], events)) for i in range(count)]

    def opening(task_format: Format) -> bytes:
        if out.started:
            return b""
        return (b"data: null\n\n" if count > 1 else b"") + task_format.start()

    try:
        ended = 0
        while ended < count:
            event = await events.get()
            task_format = formats[event.index]
            if event.error is not None:
                state.stats.failed += 1
                if gen.stream and out.started:
                    await out.write(task_format.error_event(error_body(event.error)))
                    return await out.finish()
                return error_reply(event.error)
            if event.done:
                ended += 1
                if gen.stream:
                    text = "".join(texts[event.index])
                    await out.write(opening(task_format) + task_format.end(results[event.index], text))
                events.task_done()
                continue
            texts[event.index].append(event.piece)
            if gen.stream:
                delta = task_format.delta(event.piece, event.token, results[event.index])
                await out.write(opening(task_format) + delta)
            events.task_done()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    state.stats.completed += 1
    if not gen.stream:
        bodies = [f.body(r, "".join(t)) for f, r, t in zip(formats, results, texts, strict=True)]
        return reply(200, type(fmt).merge(bodies))
    await out.write(fmt.finish())
    return await out.finish()


chat_completions = route(llama_requests.chat, ChatFormat)
completion = route(llama_requests.completion, NativeFormat)
oai_completions = route(llama_requests.oai_completion, OaiCompletionFormat)
responses = route(llama_requests.responses, ResponsesFormat)
messages = route(llama_requests.anthropic, AnthropicFormat)
infill = route(llama_requests.infill, NativeFormat)
