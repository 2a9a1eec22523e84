"""What Ollama's Responses and Anthropic layers share: they rewrite the body into an ``/api/chat`` request for
``ChatHandler`` and convert its reply, so both reach the same checks, scheduler and silent truncation.

    converted body -> ChatHandler checks (model, think, capabilities) -> stream of Piece / Finished -> converter

Their writers (``middleware/openai.go`` ``ResponsesWriter``, ``middleware/anthropic.go`` ``AnthropicWriter``)
turn a non-200 reply into the API's own error body; a native ``{"error": ...}`` line after streaming began decodes
as an empty chunk, so the stream simply ends without its closing event.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable
from typing import Any

from aiohttp import web

from kvsim.catalog import ModelSpec, lookup
from kvsim.failures import SimError
from kvsim.ollama import gojson
from kvsim.ollama.generation import GenResult
from kvsim.ollama.ollama_service import Finished, Piece, full_name
from kvsim.state import SimState
from kvsim.wire import LazyStream

SSE = "text/event-stream"
Event = tuple[str, dict[str, Any]]
Items = AsyncGenerator[Piece | Finished, None]


def read_body(raw: bytes, go_type: str) -> dict[str, Any]:
    """gin ``ShouldBindJSON`` into ``go_type`` (``openai.ResponsesRequest``, ``anthropic.MessagesRequest``)."""
    try:
        return gojson.read_object(raw, go_type)
    except gojson.MissingBody:
        raise SimError(400, "EOF") from None
    except SimError as exc:
        raise SimError(exc.status, exc.message.replace(f"api.{go_type}", go_type)) from None


def chat_spec(state: SimState, model: str, *, think: bool, tools: bool, relax_thinking: bool = False) -> ModelSpec:
    """``ChatHandler``'s checks before scheduling, in its order."""
    if not model.strip():
        raise SimError(400, "model is required")
    spec = lookup(state.models, model)
    if spec is None:
        raise SimError(404, f"model '{model}' not found")
    if think and "thinking" not in spec.capabilities and not relax_thinking:
        raise SimError(400, f'"{model}" does not support thinking')
    if spec.is_embedding:
        raise SimError(400, f'"{model}" does not support chat')
    if tools and "tools" not in spec.capabilities:
        raise SimError(400, f"{full_name(spec)} does not support tools")
    return spec


async def load_only(state: SimState, spec: ModelSpec, options: dict[str, Any]) -> Items:
    """``ChatHandler`` with no messages: schedule the model, reply ``done_reason: "load"``."""
    load_s = await state.ollama.load(spec, options, None, None)
    return _one(Finished(GenResult(done_reason="load"), (), load_s, load_s))


async def _one(item: Finished) -> Items:
    yield item


async def collect(items: Items) -> tuple[str, Finished]:
    """The whole reply (raises the ``SimError`` of a failed request)."""
    text: list[str] = []
    async with contextlib.aclosing(items) as it:
        async for item in it:
            if isinstance(item, Piece):
                text.append(item.text)
            else:
                return "".join(text), item
    raise SimError(500, "unexpected response")


def sse_event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + gojson.dumps(data) + b"\n\n"


async def stream_events(
    request: web.Request,
    items: Items,
    convert: Callable[[Piece | Finished], list[Event]],
    render_error: Callable[[int, str], web.Response],
) -> web.StreamResponse:
    """SSE of the converter's events; a failure before the first byte is an error body with its status."""
    out = LazyStream(request, SSE)
    out.response.headers["Cache-Control"] = "no-cache"
    async with contextlib.aclosing(items) as it:
        try:
            async for item in it:
                for name, data in convert(item):
                    await out.write(sse_event(name, data))
        except SimError as exc:
            if not out.started:
                return render_error(exc.status, exc.message)
    return await out.finish()


def go_sorted(value: Any) -> Any:
    """Go marshals a ``map[string]any`` with its keys sorted."""
    if isinstance(value, dict):
        return {k: go_sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [go_sorted(v) for v in value]
    return value
