"""Anthropic's Messages API (``/v1/messages``), which Ollama and llama-server both accept.

Errors are ``{"type": "error", "error": {"type", "message"}}``; in a stream, an ``event: error`` SSE event.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.dialects import fields
from gateway.domain import Dialect, FieldPath, Operation, ParsedRequest, Prompt
from gateway.errors import GatewayError
from gateway.tokens.countable_text import content_text

_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    400: "invalid_request_error", 404: "not_found_error",
    413: "request_too_large",
    504: "timeout_error",
}


_LIMITS: tuple[FieldPath, ...] = (("n_predict",), ("max_tokens",))


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    if "input_schema" not in tool:
        return tool
    function = {"name": tool.get("name", ""), "description": tool.get("description", ""),
                "parameters": tool.get("input_schema", {})}
    return {"type": "function", "function": function}


def parse(operation: Operation, body: dict[str, Any]) -> ParsedRequest:
    model = fields.optional_str(body, "model") or None
    messages = fields.messages(body, required=True, content_may_be_list=True)
    system = fields.string_or_list(body, "system")
    tools = fields.objects(fields.optional_list(body, "tools") or [], "tools")
    chat = messages
    if system:
        chat = ({"role": "system", "content": content_text(system, separator="\n")}, *messages)
    output = fields.output_limit(body, _LIMITS, ("max_tokens",))
    return ParsedRequest(
        Dialect.ANTHROPIC,
        operation,
        model,
        stream=bool(fields.optional_bool(body, "stream")),
        messages=messages,
        max_output_tokens=output.tokens,
        tools=tools,
        body=body,
        prompt_input=Prompt(messages=chat, tools=tuple(_tool(t) for t in tools)),
        output=output,
        allocates_kv=operation is Operation.CHAT,
    )


def error_body(error: GatewayError) -> bytes:
    kind = _TYPES.get(error.status, "invalid_request_error" if error.status < 500 else "api_error")
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": error.message}})


def stream_error_event(error: GatewayError) -> bytes:
    return b"event: error\ndata: " + error_body(error) + b"\n\n"
