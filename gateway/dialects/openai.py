"""OpenAI's API (``/v1/*``): request parsing and error rendering.

``stream`` defaults to false. The output limit is ``max_completion_tokens`` or ``max_tokens`` (chat, completions) or
``max_output_tokens`` (Responses). Errors are ``{"error": {"message", "type", "param", "code"}}``; after a stream
started, a final ``data:`` event of the same shape.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.dialects import fields
from gateway.domain import Dialect, Operation, ParsedRequest
from gateway.errors import GatewayError, InvalidField


def parse(operation: Operation, body: dict[str, Any], *, path: str = "") -> ParsedRequest:
    """Validate the fields the gateway reads; everything else passes through untouched."""
    model = fields.required_model(body)
    stream = bool(fields.optional_bool(body, "stream"))
    fields.optional_object(body, "stream_options")
    messages: tuple[dict[str, Any], ...] = ()
    prompt: str | None = None
    max_output: int | None = None
    if operation is Operation.CHAT and path.endswith("/responses"):
        fields.string_or_list(body, "input")
        max_output = fields.optional_int(body, "max_output_tokens")
    elif operation is Operation.CHAT:
        messages = fields.messages(body, required=True, content_may_be_list=True)
        max_completion = fields.optional_int(body, "max_completion_tokens")
        max_tokens = fields.optional_int(body, "max_tokens")
        max_output = max_completion if max_completion is not None else max_tokens
    elif operation is Operation.GENERATE:
        value = fields.string_or_list(body, "prompt")
        prompt = value if isinstance(value, str) else None
        max_output = fields.optional_int(body, "max_tokens")
    elif operation is Operation.EMBED:
        fields.string_or_list(body, "input")
    tools = fields.objects(fields.optional_list(body, "tools") or [], "tools")
    return ParsedRequest(
        Dialect.OPENAI,
        operation,
        model,
        stream=stream,
        messages=messages,
        prompt=prompt,
        max_output_tokens=max_output,
        tools=tools,
        body=body,
    )


def _error_type(status: int) -> str:
    if status == 404:
        return "not_found_error"
    if status == 401:
        return "authentication_error"
    if 400 <= status < 500:
        return "invalid_request_error"
    return "api_error"


def error_object(error: GatewayError) -> dict[str, Any]:
    param = error.field if isinstance(error, InvalidField) else None
    return {"message": error.message, "type": _error_type(error.status), "param": param, "code": error.code}


def error_body(error: GatewayError) -> bytes:
    return orjson.dumps({"error": error_object(error)})


def stream_error_event(error: GatewayError) -> bytes:
    return b"data: " + error_body(error) + b"\n\n"
