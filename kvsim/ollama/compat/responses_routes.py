"""Ollama's ``POST /v1/responses`` (``middleware/openai.go`` ``ResponsesMiddleware``, ``openai/responses.go``).

The body becomes an ``/api/chat`` request (``responses_requests.py``) run by the same scheduler as every chat:
the model's default context, no num_ctx, silent truncation. Replies:

- ``stream`` false: one ``response`` object (``ToResponse``), ``status: "completed"`` even when num_predict cut it,
  ``usage {input_tokens, output_tokens, total_tokens, ...}`` from prompt_eval_count / eval_count;
- ``stream`` true: SSE ``event: <type>`` / ``data: {...}`` (``ResponsesStreamConverter``; Go maps, so keys sorted,
  each event with a ``sequence_number``): response.created, response.in_progress, output_item.added,
  content_part.added, output_text.delta per piece, output_text.done, content_part.done, output_item.done,
  response.completed with the usage.

Errors are OpenAI's ``{"error": {"message", "type", "param", "code"}}`` with the native status.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from aiohttp import web

from kvsim.failures import SimError
from kvsim.ollama.compat.chat_compat import (
    Event,
    Items,
    chat_spec,
    collect,
    go_sorted,
    load_only,
    read_body,
    stream_events,
)
from kvsim.ollama.compat.openai_routes import openai_error
from kvsim.ollama.compat.responses_requests import GO_TYPE, parse_responses
from kvsim.ollama.ollama_service import Finished, Inference, Piece
from kvsim.state import SIM_STATE
from kvsim.wire import json_response

_TOOL_KEYS = ("type", "name", "description", "strict", "parameters")


async def responses(request: web.Request) -> web.StreamResponse:
    state = request.app[SIM_STATE]
    try:
        body = read_body(await request.read(), f"openai.{GO_TYPE}")
        parsed = parse_responses(body)
        spec = chat_spec(state, parsed.model, think=parsed.think, tools=parsed.tools)
        if parsed.messages:
            items: Items = state.ollama.stream(Inference(spec=spec, messages=parsed.messages, options=parsed.options))
        else:
            items = await load_only(state, spec, parsed.options)
    except SimError as exc:
        return openai_error(exc.status, exc.message)
    rng = random.Random(state.config.seed + state.stats.requests)
    echo = _Echo(body, f"resp_{rng.randrange(999999)}", f"msg_{rng.randrange(999999)}")

    def now() -> int:
        return int(state.clock.wall().timestamp())

    if parsed.stream:
        return await stream_events(request, items, _Converter(echo, now).process, openai_error)
    try:
        text, fin = await collect(items)
    except SimError as exc:
        return openai_error(exc.status, exc.message)
    return json_response(200, echo.whole(text, fin, now()), newline=True)


class _Echo:
    """The request fields a response object repeats, in ``ResponsesResponse``'s field order."""

    def __init__(self, body: dict[str, Any], response_id: str, item_id: str) -> None:
        self.body, self.response_id, self.item_id = body, response_id, item_id

    def fields(self, status: str, output: list[Any], usage: dict[str, Any] | None, created_at: int) -> dict[str, Any]:
        b = self.body
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": created_at,
            "completed_at": None,
            "status": status,
            "incomplete_details": None,
            "model": b.get("model", ""),
            "previous_response_id": None,
            "instructions": b.get("instructions") or None,
            "output": output,
            "error": None,
            "tools": [_tool(t) for t in b.get("tools") or [] if isinstance(t, dict)],
            "tool_choice": "auto",
            "truncation": b.get("truncation") or "disabled",
            "parallel_tool_calls": True,
            "text": {"format": _format(b.get("text"))},
            "top_p": _number(b.get("top_p")),
            "presence_penalty": 0,
            "frequency_penalty": 0,
            "top_logprobs": 0,
            "temperature": _number(b.get("temperature")),
            "reasoning": _reasoning(b.get("reasoning")),
            "usage": usage,
            "max_output_tokens": b.get("max_output_tokens"),
            "max_tool_calls": None,
            "store": False,
            "background": b.get("background") is True,
            "service_tier": "default",
            "metadata": {},
            "safety_identifier": None,
            "prompt_cache_key": None,
        }

    def whole(self, text: str, fin: Finished, completed_at: int) -> dict[str, Any]:
        """``ToResponse``: a non-streaming reply (its message item even when the text is empty)."""
        out = self.fields("completed", [message_item(self.item_id, text)], usage(fin), completed_at)
        out["completed_at"] = completed_at
        return out


def message_item(item_id: str, text: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"id": item_id, "type": "message", "status": "completed", "role": "assistant", "content": [part]}


def usage(fin: Finished) -> dict[str, Any]:
    p, c = fin.result.prompt_eval_count, fin.result.eval_count
    return {
        "input_tokens": p,
        "output_tokens": c,
        "total_tokens": p + c,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }


def _number(value: Any) -> Any:
    """A float64 defaulting to 1.0, as Go writes it (``1``, not ``1.0``)."""
    value = 1.0 if value is None else value
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    out = {k: tool.get(k) for k in _TOOL_KEYS}
    out["type"], out["name"] = out["type"] or "", out["name"] or ""
    return out | ({"tools": tool["tools"]} if tool.get("tools") else {})


def _format(text: Any) -> dict[str, Any]:
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict):
        return {"type": "text"}
    out: dict[str, Any] = {"type": fmt.get("type", "")}
    return out | {k: fmt[k] for k in ("name", "schema", "strict") if fmt.get(k) not in (None, "")}


def _reasoning(reasoning: Any) -> dict[str, Any] | None:
    if not isinstance(reasoning, dict):
        return None
    chosen = {k: reasoning[k] for k in ("effort", "summary") if reasoning.get(k)}
    return chosen or None


class _Converter:
    """``ResponsesStreamConverter`` for text output: the events one native chunk becomes."""

    def __init__(self, echo: _Echo, now: Callable[[], int]) -> None:
        self.echo, self.now = echo, now
        self.sequence = 0
        self.first = True
        self.started = False
        self.text = ""

    def _event(self, name: str, data: dict[str, Any]) -> Event:
        data = go_sorted({**data, "type": name, "sequence_number": self.sequence})
        self.sequence += 1
        return name, data

    def _response(self, status: str, output: list[Any], usage_: dict[str, Any] | None) -> dict[str, Any]:
        obj = self.echo.fields(status, output, usage_, self.now())
        reasoning = self.echo.body.get("reasoning")
        if obj["reasoning"] is not None and isinstance(reasoning, dict):  # a map here: both keys, null if unset
            obj["reasoning"] = {k: reasoning.get(k) or None for k in ("effort", "summary")}
        obj["tools"] = [{k: t[k] for k in _TOOL_KEYS} for t in obj["tools"]]
        return obj

    def process(self, item: Piece | Finished) -> list[Event]:
        events: list[Event] = []
        if self.first:
            self.first = False
            for name in ("response.created", "response.in_progress"):
                events.append(self._event(name, {"response": self._response("in_progress", [], None)}))
        if isinstance(item, Piece):
            if item.text:
                events += self._delta(item.text)
            return events
        return events + self._completion(item)

    def _delta(self, text: str) -> list[Event]:
        item_id = self.echo.item_id
        events: list[Event] = []
        if not self.started:
            self.started = True
            item = {"id": item_id, "type": "message", "status": "in_progress", "role": "assistant", "content": []}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            events.append(self._event("response.output_item.added", {"output_index": 0, "item": item}))
            where = {"item_id": item_id, "output_index": 0, "content_index": 0}
            events.append(self._event("response.content_part.added", {**where, "part": part}))
        self.text += text
        where = {"item_id": item_id, "output_index": 0, "content_index": 0}
        events.append(self._event("response.output_text.delta", {**where, "delta": text, "logprobs": []}))
        return events

    def _completion(self, fin: Finished) -> list[Event]:
        events: list[Event] = []
        output: list[Any] = []
        if self.started:
            item = message_item(self.echo.item_id, self.text)
            where = {"item_id": self.echo.item_id, "output_index": 0, "content_index": 0}
            events.append(self._event("response.output_text.done", {**where, "text": self.text, "logprobs": []}))
            events.append(self._event("response.content_part.done", {**where, "part": item["content"][0]}))
            events.append(self._event("response.output_item.done", {"output_index": 0, "item": item}))
            output.append(item)
        response = self._response("completed", output, usage(fin))
        response["completed_at"] = self.now()
        events.append(self._event("response.completed", {"response": response}))
        return events
