"""Ollama's ``POST /v1/messages``, Anthropic's Messages API (``middleware/anthropic.go``, ``anthropic/anthropic.go``).

The body becomes an ``/api/chat`` request (``anthropic_requests.py``) run by the same scheduler as every chat:
the model's default context, no num_ctx, silent truncation. Replies:

- ``stream`` false: ``{"id": "msg_...", "type": "message", "role", "model", "content": [{"type": "text", ...}],
  "stop_reason", "usage": {"input_tokens", "output_tokens"}}`` (``ToMessagesResponse``);
- ``stream`` true: SSE (``StreamConverter``): message_start (usage.input_tokens the bytes/4 estimate, as the real
  count is not known yet), content_block_start, content_block_delta per piece, content_block_stop,
  message_delta (stop_reason, usage with the real counts), message_stop.

stop_reason: stop -> end_turn, length -> max_tokens, anything else -> stop_sequence. Errors are
``{"type": "error", "error": {"type", "message"}, "request_id"}`` with the native status.
"""

from __future__ import annotations

import os
from typing import Any

from aiohttp import web

from kvsim.failures import SimError
from kvsim.ollama.compat.anthropic_requests import GO_TYPE, estimate_input_tokens, parse_messages_request
from kvsim.ollama.compat.chat_compat import Event, Items, chat_spec, collect, load_only, read_body, stream_events
from kvsim.ollama.ollama_service import Finished, Inference, Piece
from kvsim.state import SIM_STATE
from kvsim.wire import json_response

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_error(status: int, message: str) -> web.Response:
    """``anthropic.NewError``, written by ``json.Encoder`` (a trailing newline)."""
    kind = _ERROR_TYPES.get(status, "api_error")
    body = {"type": "error", "error": {"type": kind, "message": message}, "request_id": _ident("req")}
    return json_response(status, body, newline=True)


def _ident(prefix: str) -> str:
    return f"{prefix}_{os.urandom(12).hex()}"


async def messages(request: web.Request) -> web.StreamResponse:
    state = request.app[SIM_STATE]
    try:
        body = read_body(await request.read(), f"anthropic.{GO_TYPE}")
        parsed = parse_messages_request(body)
        spec = chat_spec(state, parsed.model, think=False, tools=parsed.tools, relax_thinking=True)
        if parsed.messages:
            items: Items = state.ollama.stream(Inference(spec=spec, messages=parsed.messages, options=parsed.options))
        else:
            items = await load_only(state, spec, parsed.options)
    except SimError as exc:
        return anthropic_error(exc.status, exc.message)
    ident = _ident("msg")
    if parsed.stream:
        converter = _Converter(ident, parsed.model, estimate_input_tokens(body))
        return await stream_events(request, items, converter.process, anthropic_error)
    try:
        text, fin = await collect(items)
    except SimError as exc:
        return anthropic_error(exc.status, exc.message)
    content = [{"type": "text", "text": text}] if text else None
    reply: dict[str, Any] = {
        "id": ident,
        "type": "message",
        "role": "assistant",
        "model": parsed.model,
        "content": content,
    }
    reply |= _stop(fin, "stop_reason")
    reply["usage"] = {"input_tokens": fin.result.prompt_eval_count, "output_tokens": fin.result.eval_count}
    return json_response(200, reply, newline=True)


def _stop(fin: Finished, key: str) -> dict[str, str]:
    """``mapStopReason`` (omitempty: nothing for an empty done_reason)."""
    reason = fin.result.done_reason
    mapped = {"stop": "end_turn", "length": "max_tokens"}.get(reason, "stop_sequence" if reason else "")
    return {key: mapped} if mapped else {}


class _Converter:
    """``StreamConverter`` for text output: the events one native chunk becomes."""

    def __init__(self, ident: str, model: str, estimated_input_tokens: int) -> None:
        self.ident, self.model, self.estimate = ident, model, estimated_input_tokens
        self.first = True
        self.text_started = False

    def process(self, item: Piece | Finished) -> list[Event]:
        events: list[Event] = []
        if self.first:
            self.first = False
            measured = item.result.prompt_eval_count if isinstance(item, Finished) else 0
            events.append(self._start(measured or self.estimate))
        if isinstance(item, Piece):
            if item.text:
                events += self._delta(item.text)
            return events
        if self.text_started:
            events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
        usage = {"input_tokens": item.result.prompt_eval_count, "output_tokens": item.result.eval_count}
        events.append(("message_delta", {"type": "message_delta", "delta": _stop(item, "stop_reason"), "usage": usage}))
        events.append(("message_stop", {"type": "message_stop"}))
        return events

    def _start(self, input_tokens: int) -> Event:
        message: dict[str, Any] = {"id": self.ident, "type": "message", "role": "assistant", "model": self.model}
        message |= {"content": [], "usage": {"input_tokens": input_tokens, "output_tokens": 0}}
        return "message_start", {"type": "message_start", "message": message}

    def _delta(self, text: str) -> list[Event]:
        events: list[Event] = []
        if not self.text_started:
            self.text_started = True
            block = {"type": "text", "text": ""}
            events.append(("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}))
        delta = {"type": "text_delta", "text": text}
        events.append(("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}))
        return events
