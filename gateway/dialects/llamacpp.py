"""llama-server's native routes (``/completion``, ``/tokenize``, ...): parsing and error rendering.

Errors are ``{"error": {"code", "message", "type"}}`` with llama-server's type names; after a stream started, a
final ``data:`` event of the same shape (the real server ends such a stream without ``[DONE]``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson

from gateway.dialects import fields
from gateway.domain import NO_OUTPUT_OPERATIONS, Dialect, FieldPath, Operation, OutputLimit, ParsedRequest, Prompt
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


def _completion_prompt(body: dict[str, Any]) -> tuple[str | None, Prompt]:
    """/completion, /completions: ``prompt`` is one prompt (a string, token ids, a mix, a multimodal object) or a
    batch of them, each a task (and a sequence) of its own."""
    value = body.get("prompt")
    multimodal = isinstance(value, dict) and isinstance(value.get("prompt_string"), str)
    if value is not None and not isinstance(value, str | list) and not multimodal:
        raise InvalidField("prompt", "field 'prompt' must be a string or an array (of strings and token ids), "
                           f"or an object with a string prompt_string; got {fields.json_type_name(value)}")
    prompts: tuple[Prompt, ...] = ()
    if isinstance(value, list):
        checked = fields.check_batch(value, "prompt")
        if fields.prompt_batch(value) is not None:
            prompts = tuple(Prompt(text=item) for item in checked)
    return (value if isinstance(value, str) else None), Prompt(text=value, batch=prompts)


def embedding_inputs(body: dict[str, Any]) -> Prompt:
    """/embedding, /embeddings: ``input`` (else ``content``), one task per input (tokenize_input_prompts's shapes);
    ``/v1/embeddings`` (the OpenAI dialect) reads ``input`` the same way."""
    key = "input" if "input" in body else "content"
    if key not in body:
        raise InvalidField("input", "field 'input' (or 'content') is required: send the text to embed")
    value = body[key]
    return Prompt(text=value, batch=tuple(Prompt(text=item) for item in fields.check_batch(value, key)))


RERANK_EXTRA_TOKENS = 2
"""What a rerank pair holds beyond its query and document, each counted with the BOS a counter adds: llama-server
joins them as BOS query EOS SEP document EOS (the tokens the vocabulary adds), or renders the model's own rerank
template, which kvgate can't see, so the count is an estimate."""


def rerank_pairs(body: dict[str, Any]) -> Prompt:
    """/rerank and its aliases: one task per document, each holding the query and the document (Jina's
    ``documents`` or TEI's ``texts``)."""
    query = body.get("query")
    if not isinstance(query, str):
        raise InvalidField("query", "field 'query' is required and must be a string")
    key = "documents" if "documents" in body else "texts"
    documents = body.get(key)
    if not isinstance(documents, list) or not documents or not all(isinstance(d, str) for d in documents):
        raise InvalidField(key, f"field '{key}' must be a non-empty array of strings (the documents to rank)")
    return Prompt(batch=tuple(Prompt(text=[query, document], exact_shape=False, extra_tokens=RERANK_EXTRA_TOKENS)
                              for document in documents), exact_shape=False)


def parse(operation: Operation, body: dict[str, Any]) -> ParsedRequest:
    model = fields.optional_str(body, "model") or None
    messages: tuple[dict[str, Any], ...] = ()
    prompt: str | None = None
    prompt_input = Prompt()
    output = OutputLimit(write_to=("n_predict",))
    if operation is Operation.GENERATE:
        prompt, prompt_input = _completion_prompt(body)
    elif operation is Operation.INFILL:
        prompt_input = _infill_prompt(body)
    elif operation in (Operation.CHAT, Operation.COUNT):
        messages = fields.messages(body, required=True, content_may_be_list=True)
        prompt_input = Prompt(messages=messages)
    elif operation is Operation.TOKENIZE:
        fields.string_or_list(body, "content")
        fields.optional_list(body, "tokens")
    elif operation is Operation.EMBED:
        prompt_input = embedding_inputs(body)
    elif operation is Operation.RERANK:
        prompt_input = rerank_pairs(body)
    generates = operation in (Operation.GENERATE, Operation.INFILL, Operation.CHAT)
    if generates:
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
        prompt_input=replace(prompt_input, tools=tools),
        output=output,
        sequences=fields.sequences(body, ("n", "n_cmpl")) if generates else 1,
        allocates_kv=generates or operation in NO_OUTPUT_OPERATIONS,
    )


def error_body(error: GatewayError) -> bytes:
    kind = _TYPES.get(error.status, "server_error")
    return orjson.dumps({"error": {"code": error.status, "message": error.message, "type": kind}})


def stream_error_event(error: GatewayError) -> bytes:
    return b"data: " + error_body(error) + b"\n\n"
