"""Ollama's OpenAI-compatible layer (``middleware/openai.go``, ``openai/openai.go``) over the native handlers.

``stream`` defaults to false; there is no num_ctx and no keep_alive on /v1 (the model's default context is
used); ``max_tokens`` becomes ``num_predict``; temperature and top_p default to 1.0. Errors are
``{"error": {"message", "type", "param": null, "code": null}}`` with the native status kept. A failure after
streaming began is not reported: the native ``{"error": ...}`` line decodes as an empty chunk, which is sent,
and the stream ends without ``[DONE]`` (what Ollama's ChatWriter does with it).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncGenerator
from typing import Any

from aiohttp import web

from kvsim.catalog import ModelSpec, lookup
from kvsim.failures import SimError
from kvsim.ollama import gojson
from kvsim.ollama.ollama_models import MODIFIED_AT
from kvsim.ollama.ollama_requests import get
from kvsim.ollama.ollama_service import Finished, Inference, Piece
from kvsim.state import SIM_STATE
from kvsim.templates import Message
from kvsim.wire import LazyStream, json_response

SSE = "text/event-stream"


def openai_error(status: int, message: str) -> web.Response:
    kind = {400: "invalid_request_error", 404: "not_found_error"}.get(status, "api_error")
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return json_response(status, body, newline=True)


def _body(raw: bytes) -> dict[str, Any]:
    try:
        return gojson.read_object(raw, "ChatCompletionRequest")
    except gojson.MissingBody:
        raise SimError(400, "EOF") from None


def _typed(body: dict[str, Any], go_struct: str) -> None:
    """Go's unmarshal errors for the fields the simulator reads."""
    for key, kind in (("model", str), ("stream", bool), ("max_tokens", int), ("seed", int), ("stream_options", dict)):
        get(body, key, kind, go_struct)
    for key in ("temperature", "top_p"):
        value = body.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise gojson.type_error(go_struct, key, value, "float64")


def _options(body: dict[str, Any]) -> dict[str, Any]:
    """``FromChatRequest``: max_tokens -> num_predict; temperature and top_p default to 1.0."""
    opts: dict[str, Any] = {"temperature": body.get("temperature", 1.0), "top_p": body.get("top_p") or 1.0}
    stop = body.get("stop")
    if isinstance(stop, str):
        opts["stop"] = [stop]
    elif isinstance(stop, list):
        opts["stop"] = [s for s in stop if isinstance(s, str)]
    for src, dst in (("max_tokens", "num_predict"), ("seed", "seed")):
        if body.get(src) is not None:
            opts[dst] = int(body[src])
    return opts


def _messages(raw: list[Any]) -> tuple[Message, ...]:
    out: list[Message] = []
    for msg in raw:
        if not isinstance(msg, dict):
            raise SimError(400, "invalid message format")
        role, content = str(msg.get("role", "")), msg.get("content")
        if isinstance(content, str):
            out.append(Message(role.lower(), content))
        elif isinstance(content, list):
            for part in content:
                if not isinstance(part, dict) or part.get("type") not in ("text", "image_url"):
                    raise SimError(400, "invalid message format")
                if part["type"] == "text":
                    out.append(Message(role.lower(), str(part.get("text", ""))))
                    continue
                url = part.get("image_url")
                url = url.get("url", "") if isinstance(url, dict) else str(url)
                if url.startswith(("http://", "https://")):
                    raise SimError(
                        400, "image URLs are not currently supported, please use base64 encoded data instead"
                    )
                out.append(Message(role.lower(), "", images=1))
        elif msg.get("tool_calls") is None:
            raise SimError(400, f"invalid message content type: {_go_type(content)}")
    return tuple(out)


def _go_type(value: Any) -> str:
    return (
        "<nil>"
        if value is None
        else {bool: "bool", int: "float64", float: "float64", dict: "map[string]interface {}"}.get(
            type(value), "string"
        )
    )


def _spec(request: web.Request, name: str) -> ModelSpec:
    spec = lookup(request.app[SIM_STATE].models, name)
    if spec is None:
        raise SimError(404, f"model '{name}' not found")
    if spec.is_embedding:
        raise SimError(400, f'"{name}" does not support chat')
    return spec


async def chat_completions(request: web.Request) -> web.StreamResponse:
    try:
        body = _body(await request.read())
        _typed(body, "ChatCompletionRequest")
        messages = get(body, "messages", list, "ChatCompletionRequest", [])
        if not messages:
            raise SimError(400, "[] is too short - 'messages'")
        parsed = _messages(messages)
        model = str(body.get("model", ""))
        spec = _spec(request, model)
    except SimError as exc:
        return openai_error(exc.status, exc.message)
    inf = Inference(spec=spec, messages=parsed, options=_options(body))
    return await _run(request, body, model, inf, chat=True)


async def completions(request: web.Request) -> web.StreamResponse:
    try:
        body = _body(await request.read())
        _typed(body, "CompletionRequest")
        prompt = get(body, "prompt", str, "CompletionRequest", "")
        model = str(body.get("model", ""))
        spec = _spec(request, model)
    except SimError as exc:
        return openai_error(exc.status, exc.message)
    inf = Inference(spec=spec, messages=(Message("user", prompt),), options=_options(body))
    return await _run(request, body, model, inf, chat=False)


async def _run(
    request: web.Request, body: dict[str, Any], model: str, inf: Inference, *, chat: bool
) -> web.StreamResponse:
    state = request.app[SIM_STATE]
    rng = random.Random(state.config.seed + state.stats.requests)
    ident = f"{'chatcmpl' if chat else 'cmpl'}-{rng.randrange(999)}"
    created = int(state.clock.wall().timestamp())
    frame = _Framer(ident, model, created, chat)
    items = state.ollama.stream(inf)
    opts = body.get("stream_options")
    usage = isinstance(opts, dict) and opts.get("include_usage") is True
    if body.get("stream") is True:
        return await _stream(request, items, frame, usage)
    text: list[str] = []
    async with contextlib.aclosing(items) as it:
        try:
            async for item in it:
                if isinstance(item, Piece):
                    text.append(item.text)
                else:
                    return json_response(200, frame.whole("".join(text), item), newline=True)
        except SimError as exc:
            return openai_error(exc.status, exc.message)
    return openai_error(500, "unexpected response")


async def _stream(
    request: web.Request, items: AsyncGenerator[Piece | Finished, None], frame: _Framer, usage: bool
) -> web.StreamResponse:
    out = LazyStream(request, SSE)
    async with contextlib.aclosing(items) as it:
        try:
            async for item in it:
                for chunk in frame.chunks(item, usage):
                    await out.write(b"data: " + gojson.dumps(chunk) + b"\n\n")
            await out.write(b"data: [DONE]\n\n")
        except SimError as exc:
            if not out.started:
                return openai_error(exc.status, exc.message)
            await out.write(b"data: " + gojson.dumps(frame.empty()) + b"\n\n")
    return await out.finish()


class _Framer:
    """Chunk and response objects in the shapes of Ollama's openai package."""

    def __init__(self, ident: str, model: str, created: int, chat: bool) -> None:
        self.ident, self.model, self.created, self.chat = ident, model, created, chat
        self.first = True

    def _head(self, obj: str, model: str | None = None) -> dict[str, Any]:
        return {
            "id": self.ident,
            "object": obj,
            "created": self.created,
            "model": self.model if model is None else model,
            "system_fingerprint": "fp_ollama",
        }

    def chunks(self, item: Piece | Finished, usage: bool) -> list[dict[str, Any]]:
        if not self.chat:
            return self._completion_chunks(item, usage)
        out: list[dict[str, Any]] = []
        if isinstance(item, Piece) or self.first:
            delta = {"role": "assistant"} if self.first else {}
            text = item.text if isinstance(item, Piece) else ""
            self.first = False
            choice = {"index": 0, "delta": {**delta, "content": text}, "finish_reason": None}
            out.append({**self._head("chat.completion.chunk"), "choices": [choice]})
        if isinstance(item, Finished):
            finish = {"index": 0, "delta": {}, "finish_reason": item.result.done_reason or "stop"}
            out.append({**self._head("chat.completion.chunk"), "choices": [finish]})
            if usage:
                out.append({**self._head("chat.completion.chunk"), "choices": [], "usage": _usage(item)})
        return out

    def _completion_chunks(self, item: Piece | Finished, usage: bool) -> list[dict[str, Any]]:
        text = item.text if isinstance(item, Piece) else ""
        reason = item.result.done_reason if isinstance(item, Finished) else None
        chunk = {**self._head("text_completion"), "choices": [{"text": text, "index": 0, "finish_reason": reason}]}
        if usage:
            chunk["usage"] = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        out = [chunk]
        if usage and isinstance(item, Finished):
            out.append({**chunk, "choices": [], "usage": _usage(item)})
        return out

    def empty(self) -> dict[str, Any]:
        """What Ollama's writers make of a mid-stream ``{"error": ...}`` line."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if self.first else {"content": ""}
            return {
                **self._head("chat.completion.chunk", ""),
                "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
            }
        return {**self._head("text_completion", ""), "choices": [{"text": "", "index": 0, "finish_reason": None}]}

    def whole(self, text: str, fin: Finished) -> dict[str, Any]:
        reason = fin.result.done_reason or None
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason}
            return {**self._head("chat.completion"), "choices": [choice], "usage": _usage(fin)}
        choice_c = {"text": text, "index": 0, "finish_reason": reason}
        return {**self._head("text_completion"), "choices": [choice_c], "usage": _usage(fin)}


def _usage(fin: Finished) -> dict[str, int]:
    p, c = fin.result.prompt_eval_count, fin.result.eval_count
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


async def list_models(request: web.Request) -> web.Response:
    models = request.app[SIM_STATE].models
    data = [
        {"id": name, "object": "model", "created": int(MODIFIED_AT.timestamp()), "owned_by": "library"}
        for name in models
    ]
    return json_response(200, {"object": "list", "data": data}, newline=True)


async def retrieve_model(request: web.Request) -> web.Response:
    name = request.match_info["model"]
    if lookup(request.app[SIM_STATE].models, name) is None:
        return openai_error(404, f"model '{name}' not found")
    return json_response(
        200,
        {"id": name, "object": "model", "created": int(MODIFIED_AT.timestamp()), "owned_by": "library"},
        newline=True,
    )
