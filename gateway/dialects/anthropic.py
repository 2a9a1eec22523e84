"""Anthropic's Messages API (``/v1/messages``), which Ollama and llama-server both accept.

Errors are ``{"type": "error", "error": {"type", "message"}}``; in a stream, an ``event: error`` SSE event.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.dialects import fields
from gateway.domain import Dialect, Operation, ParsedRequest
from gateway.errors import GatewayError

_TYPES = {
    401: "authentication_error",
    400: "invalid_request_error", 404: "not_found_error",
    413: "request_too_large",
    504: "timeout_error",
}


def parse(operation: Operation, body: dict[str, Any]) -> ParsedRequest:
    model = fields.required_model(body)
    messages = fields.messages(body, required=True, content_may_be_list=True)
    fields.string_or_list(body, "system")
    return ParsedRequest(
        Dialect.ANTHROPIC,
        operation,
        model,
        stream=bool(fields.optional_bool(body, "stream")),
        messages=messages,
        max_output_tokens=fields.optional_int(body, "max_tokens"),
        tools=fields.objects(fields.optional_list(body, "tools") or [], "tools"),
        body=body,
    )


def error_body(error: GatewayError) -> bytes:
    kind = _TYPES.get(error.status, "invalid_request_error" if error.status < 500 else "api_error")
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": error.message}})


def stream_error_event(error: GatewayError) -> bytes:
    return b"event: error\ndata: " + error_body(error) + b"\n\n"
