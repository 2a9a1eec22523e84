"""llama-server's native routes (``/completion``, ``/tokenize``, ...): parsing and error rendering.

Errors are ``{"error": {"code", "message", "type"}}`` with llama-server's type names; after a stream started, a
final ``data:`` event of the same shape (the real server ends such a stream without ``[DONE]``).
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.dialects import fields
from gateway.domain import Dialect, FieldPath, Operation, OutputLimit, ParsedRequest, Prompt
from gateway.errors import GatewayError, InvalidField

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


_LIMITS: tuple[FieldPath, ...] = (("n_predict",), ("max_completion_tokens",), ("max_tokens",))
_INFILL_TEXT = ("input_prefix", "input_suffix", "prompt")


def _infill_prompt(body: dict[str, Any]) -> Prompt:
    """/infill: prefix, suffix, extra context chunks and prompt, around the model's FIM tokens (which the count
    approximates, so it is an estimate)."""
    pieces: list[str] = []
    for key in _INFILL_TEXT:
        value = fields.optional_str(body, key)
        if value:
            pieces.append(value)
    for index, chunk in enumerate(fields.optional_list(body, "input_extra") or []):
        if not isinstance(chunk, dict):
            raise InvalidField(f"input_extra[{index}]", f"field 'input_extra[{index}]' must be an object")
        pieces.extend(str(chunk.get(key) or "") for key in ("filename", "text"))
    return Prompt(text="\n".join(pieces), exact_shape=False)


def parse(operation: Operation, body: dict[str, Any]) -> ParsedRequest:
    model = fields.optional_str(body, "model") or None
    messages: tuple[dict[str, Any], ...] = ()
    prompt: str | None = None
    prompt_input = Prompt()
    output = OutputLimit(write_to=("n_predict",))
    if operation is Operation.GENERATE:
        value = body.get("prompt")
        multimodal = isinstance(value, dict) and isinstance(value.get("prompt_string"), str)
        if value is not None and not isinstance(value, str | list) and not multimodal:
            raise InvalidField("prompt", "field 'prompt' must be a string or an array (of strings and token ids), "
                               f"or an object with a string prompt_string; got {fields.json_type_name(value)}")
        prompt = value if isinstance(value, str) else None
        prompt_input = Prompt(text=value)
    elif operation is Operation.INFILL:
        prompt_input = _infill_prompt(body)
    elif operation in (Operation.CHAT, Operation.COUNT):
        messages = fields.messages(body, required=True, content_may_be_list=True)
        prompt_input = Prompt(messages=messages)
    elif operation is Operation.TOKENIZE:
        fields.string_or_list(body, "content")
        fields.optional_list(body, "tokens")
    allocates = operation in (Operation.GENERATE, Operation.INFILL, Operation.CHAT)
    if allocates:
        output = fields.output_limit(body, _LIMITS, ("n_predict",))
    tools = fields.objects(fields.optional_list(body, "tools") or [], "tools")
    return ParsedRequest(
        Dialect.LLAMACPP,
        operation,
        model,
        stream=bool(fields.optional_bool(body, "stream")),
        messages=messages,
        prompt=prompt,
        max_output_tokens=output.tokens,
        tools=tools,
        body=body,
        prompt_input=Prompt(prompt_input.messages, prompt_input.text, tools, prompt_input.exact_shape),
        output=output,
        sequences=fields.sequences(body, ("n", "n_cmpl")) if allocates else 1,
        allocates_kv=allocates,
    )


def error_body(error: GatewayError) -> bytes:
    kind = _TYPES.get(error.status, "server_error")
    return orjson.dumps({"error": {"code": error.status, "message": error.message, "type": kind}})


def stream_error_event(error: GatewayError) -> bytes:
    return b"data: " + error_body(error) + b"\n\n"
