"""OpenAI's API (``/v1/*``): request parsing and error rendering.

``stream`` defaults to false. The output limit is ``max_completion_tokens`` or ``max_tokens`` (chat, completions) or
``max_output_tokens`` (Responses). Errors are ``{"error": {"message", "type", "param", "code"}}``; after a stream
started, a final ``data:`` event of the same shape.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.dialects import fields, responses
from gateway.domain import Dialect, FieldPath, Operation, OutputLimit, ParsedRequest, Prompt
from gateway.errors import GatewayError

_CHAT_LIMITS: tuple[FieldPath, ...] = (("n_predict",), ("max_completion_tokens",), ("max_tokens",))
"""Chat and completions limits: llama-server reads all three (n_predict first); Ollama's /v1 only max_tokens."""
_RESPONSES_LIMITS: tuple[FieldPath, ...] = (("n_predict",), ("max_output_tokens",))


def parse(operation: Operation, body: dict[str, Any], *, path: str = "") -> ParsedRequest:
    """Validate the fields the gateway reads; everything else passes through untouched.

    ``model`` may be absent here: llama-server serves one model whatever the body says; the proxy asks for it only
    where the backend needs it."""
    del path
    model = fields.optional_str(body, "model") or None
    stream = bool(fields.optional_bool(body, "stream"))
    fields.optional_object(body, "stream_options")
    messages: tuple[dict[str, Any], ...] = ()
    prompt: str | None = None
    prompt_input = Prompt()
    output = OutputLimit()
    tools = fields.objects(fields.optional_list(body, "tools") or [], "tools")
    if operation is Operation.RESPONSES:
        prompt_input = responses.prompt_of(body)
        output = fields.output_limit(body, _RESPONSES_LIMITS, ("max_output_tokens",))
    elif operation is Operation.CHAT:
        messages = fields.messages(body, required=True, content_may_be_list=True)
        prompt_input = Prompt(messages=messages, tools=tools)
        output = fields.output_limit(body, _CHAT_LIMITS, ("max_tokens",))
    elif operation is Operation.GENERATE:
        value = fields.string_or_list(body, "prompt")
        prompt = value if isinstance(value, str) else None
        prompt_input = _prompts(value, batch_only=True)
        output = fields.output_limit(body, _CHAT_LIMITS, ("max_tokens",))
    elif operation is Operation.EMBED:
        prompt_input = _prompts(fields.string_or_list(body, "input"), batch_only=False)
    generates = operation in (Operation.CHAT, Operation.GENERATE, Operation.RESPONSES)
    return ParsedRequest(
        Dialect.OPENAI,
        operation,
        model,
        stream=stream,
        messages=messages,
        prompt=prompt,
        max_output_tokens=output.tokens,
        tools=tools,
        body=body,
        prompt_input=prompt_input,
        output=output,
        sequences=fields.sequences(body, ("n", "n_cmpl"), strict=False) if generates else 1,
        allocates_kv=generates or operation is Operation.EMBED,
    )


def _prompts(value: Any, *, batch_only: bool) -> Prompt:
    """``prompt`` (/v1/completions) or ``input`` (/v1/embeddings): one prompt, or a batch of them, each a sequence of
    its own (``fields.prompt_batch``; an embedding's single input is a batch of one). Elements are not checked here:
    the backends of these routes accept different shapes, and each answers its own 400 for one it can't read."""
    batch = fields.prompt_batch(value)
    if batch is None:
        batch = () if batch_only else (value,)
    return Prompt(text=value, batch=tuple(Prompt(text=item) for item in batch))


def _error_type(status: int) -> str:
    if status == 404:
        return "not_found_error"
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if 400 <= status < 500:
        return "invalid_request_error"
    return "api_error"


def error_object(error: GatewayError) -> dict[str, Any]:
    return {"message": error.message, "type": _error_type(error.status), "param": error.param, "code": error.code}


def error_body(error: GatewayError) -> bytes:
    return orjson.dumps({"error": error_object(error)})


def stream_error_event(error: GatewayError) -> bytes:
    return b"data: " + error_body(error) + b"\n\n"
