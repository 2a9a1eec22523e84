"""llama-server's native routes (``/completion``, ``/tokenize``, ...): parsing and error rendering.

Errors are ``{"error": {"code", "message", "type"}}`` with llama-server's type names; after a stream started, a
final ``data:`` event of the same shape (the real server ends such a stream without ``[DONE]``).
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.dialects import fields
from gateway.domain import Dialect, Operation, ParsedRequest
from gateway.errors import GatewayError

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


def parse(operation: Operation, body: dict[str, Any]) -> ParsedRequest:
    model = fields.optional_str(body, "model")
    messages: tuple[dict[str, Any], ...] = ()
    prompt: str | None = None
    max_output: int | None = None
    if operation is Operation.GENERATE:
        value = fields.string_or_list(body, "prompt")
        prompt = value if isinstance(value, str) else None
        for key in ("n_predict", "max_completion_tokens", "max_tokens"):
            max_output = fields.optional_int(body, key)
            if max_output is not None:
                break
    elif operation in (Operation.CHAT, Operation.COUNT):
        messages = fields.messages(body, required=True, content_may_be_list=True)
    elif operation is Operation.TOKENIZE:
        fields.string_or_list(body, "content")
        fields.optional_list(body, "tokens")
    return ParsedRequest(
        Dialect.LLAMACPP,
        operation,
        model,
        stream=bool(fields.optional_bool(body, "stream")),
        messages=messages,
        prompt=prompt,
        max_output_tokens=max_output,
        tools=fields.objects(fields.optional_list(body, "tools") or [], "tools"),
        body=body,
    )


def error_body(error: GatewayError) -> bytes:
    kind = _TYPES.get(error.status, "server_error")
    return orjson.dumps({"error": {"code": error.status, "message": error.message, "type": kind}})


def stream_error_event(error: GatewayError) -> bytes:
    return b"data: " + error_body(error) + b"\n\n"
