"""Ollama's native API (``/api/*``): request parsing and error rendering.

Defaults follow Ollama: ``stream`` is true unless the client sends ``false``; ``options.num_ctx`` and
``options.num_predict`` carry the context and the output limit. Errors are ``{"error": "<message>"}``; after a stream
started, a final NDJSON line of the same shape (``docs/api/errors.mdx``).
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.dialects import fields
from gateway.domain import Dialect, FieldPath, Operation, ParsedRequest, Prompt
from gateway.errors import GatewayError, InvalidField

_NUM_PREDICT: FieldPath = ("options", "num_predict")


def _options(body: dict[str, Any]) -> int | None:
    options = fields.optional_object(body, "options")
    if options is None:
        return None
    return fields.optional_int(options, "num_ctx", "options.num_ctx")


def _keep_alive(body: dict[str, Any]) -> None:
    value = body.get("keep_alive")
    if value is None or isinstance(value, str) or (isinstance(value, int | float) and not isinstance(value, bool)):
        return
    raise InvalidField(
        "keep_alive",
        f"field 'keep_alive' must be a number of seconds or a duration string like \"5m\", "
        f"got {fields.json_type_name(value)}",
    )


def _generate_prompt(body: dict[str, Any], prompt: str | None) -> Prompt:
    """/api/generate: raw prompts are tokenized as they are; others go through the template as a system message
    (when given) and one user turn holding the prompt, its suffix and images."""
    if body.get("raw") is True:
        return Prompt(text=prompt or "")
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if isinstance(system, str) and system:
        messages.append({"role": "system", "content": system})
    user: dict[str, Any] = {"role": "user", "content": prompt or ""}
    suffix = body.get("suffix")
    if isinstance(suffix, str) and suffix:
        user["content"] = f"{user['content']}{suffix}"
    if body.get("images"):
        user["images"] = body["images"]
    messages.append(user)
    return Prompt(messages=tuple(messages))


def parse(operation: Operation, body: dict[str, Any]) -> ParsedRequest:
    """Validate the fields the gateway reads; everything else passes through untouched."""
    if operation is Operation.MODEL_INFO:
        model = fields.required_model(body, alias="name")
        return ParsedRequest(Dialect.OLLAMA, operation, model, stream=False, body=body)
    model = fields.required_model(body)
    stream = fields.optional_bool(body, "stream")
    num_ctx = _options(body)
    output = fields.output_limit(body, (_NUM_PREDICT,), _NUM_PREDICT)
    _keep_alive(body)
    messages: tuple[dict[str, Any], ...] = ()
    prompt: str | None = None
    tools: tuple[dict[str, Any], ...] = ()
    prompt_input = Prompt()
    if operation is Operation.CHAT:
        messages = fields.messages(body, required=False, content_may_be_list=False)
        tools = fields.objects(fields.optional_list(body, "tools") or [], "tools")
        prompt_input = Prompt(messages=messages, tools=tools)
    elif operation is Operation.GENERATE:
        prompt = fields.optional_str(body, "prompt")
        fields.optional_str(body, "system")
        fields.optional_str(body, "suffix")
        fields.optional_list(body, "images")
        prompt_input = _generate_prompt(body, prompt)
    elif operation is Operation.EMBED:
        value = fields.string_or_list(body, "input")
        prompt = fields.optional_str(body, "prompt")
        inputs = value if isinstance(value, list) else [value if "input" in body else prompt]
        prompt_input = Prompt(text=value, batch=tuple(Prompt(text=item) for item in inputs))
    default_stream = operation in (Operation.CHAT, Operation.GENERATE)
    # A chat without messages or a generate without a prompt only loads (or, with keep_alive 0, unloads) the model;
    # an embedding request goes through admission either way: its model's load is gated like a chat's
    allocates = (operation is Operation.CHAT and bool(messages)) or (operation is Operation.GENERATE and bool(prompt)) \
        or operation is Operation.EMBED
    return ParsedRequest(
        Dialect.OLLAMA,
        operation,
        model,
        stream=default_stream if stream is None else stream,
        messages=messages,
        prompt=prompt,
        num_ctx_tokens=num_ctx,
        max_output_tokens=output.tokens,
        tools=tools,
        body=body,
        prompt_input=prompt_input,
        output=output,
        num_ctx_field=("options", "num_ctx") if operation in (Operation.CHAT, Operation.GENERATE) else None,
        allocates_kv=allocates,
    )


def error_body(error: GatewayError) -> bytes:
    return orjson.dumps({"error": error.message})


def stream_error_event(error: GatewayError) -> bytes:
    return orjson.dumps({"error": error.message}) + b"\n"
