"""Ollama's native API (``/api/*``): request parsing and error rendering.

Defaults follow Ollama: ``stream`` is true unless the client sends ``false``; ``options.num_ctx`` and
``options.num_predict`` carry the context and the output limit. Errors are ``{"error": "<message>"}``; after a stream
started, a final NDJSON line of the same shape (``docs/api/errors.mdx``).
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.dialects import fields
from gateway.domain import Dialect, Operation, ParsedRequest
from gateway.errors import GatewayError, InvalidField


def _options(body: dict[str, Any]) -> tuple[int | None, int | None]:
    options = fields.optional_object(body, "options")
    if options is None:
        return None, None
    num_ctx = fields.optional_int(options, "num_ctx", "options.num_ctx")
    num_predict = fields.optional_int(options, "num_predict", "options.num_predict")
    return num_ctx, num_predict


def _keep_alive(body: dict[str, Any]) -> None:
    value = body.get("keep_alive")
    if value is None or isinstance(value, str) or (isinstance(value, int | float) and not isinstance(value, bool)):
        return
    raise InvalidField(
        "keep_alive",
        f"field 'keep_alive' must be a number of seconds or a duration string like \"5m\", "
        f"got {fields.json_type_name(value)}",
    )


def parse(operation: Operation, body: dict[str, Any]) -> ParsedRequest:
    """Validate the fields the gateway reads; everything else passes through untouched."""
    if operation is Operation.MODEL_INFO:
        model = fields.required_model(body, alias="name")
        return ParsedRequest(Dialect.OLLAMA, operation, model, stream=False, body=body)
    model = fields.required_model(body)
    stream = fields.optional_bool(body, "stream")
    num_ctx, num_predict = _options(body)
    _keep_alive(body)
    messages: tuple[dict[str, Any], ...] = ()
    prompt: str | None = None
    tools: tuple[dict[str, Any], ...] = ()
    if operation is Operation.CHAT:
        messages = fields.messages(body, required=False, content_may_be_list=False)
        tools = fields.objects(fields.optional_list(body, "tools") or [], "tools")
    elif operation is Operation.GENERATE:
        prompt = fields.optional_str(body, "prompt")
        fields.optional_str(body, "system")
        fields.optional_list(body, "images")
    elif operation is Operation.EMBED:
        fields.string_or_list(body, "input")
        prompt = fields.optional_str(body, "prompt")
    default_stream = operation in (Operation.CHAT, Operation.GENERATE)
    return ParsedRequest(
        Dialect.OLLAMA,
        operation,
        model,
        stream=default_stream if stream is None else stream,
        messages=messages,
        prompt=prompt,
        num_ctx_tokens=num_ctx,
        max_output_tokens=num_predict,
        tools=tools,
        body=body,
    )


def error_body(error: GatewayError) -> bytes:
    return orjson.dumps({"error": error.message})


def stream_error_event(error: GatewayError) -> bytes:
    return orjson.dumps({"error": error.message}) + b"\n"
