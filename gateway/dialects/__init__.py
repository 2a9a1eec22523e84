"""Client dialects: parse a body once at the edge, render gateway errors the way each client expects."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Protocol

import orjson

from gateway.dialects import anthropic, llamacpp, ollama, openai
from gateway.domain import Dialect, Operation, ParsedRequest
from gateway.errors import BadRequest, GatewayError
from gateway.support.safe_text import safe_text

__all__ = ["decode_body", "error_body", "parse", "stream_error_event"]


def decode_body(raw: bytes) -> dict[str, Any]:
    """Decode a JSON object body; anything else is a 400 that says what was wrong."""
    if not raw.strip():
        raise BadRequest("missing request body: send a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        body = _decode_lenient(raw, exc)
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def _decode_lenient(raw: bytes, error: orjson.JSONDecodeError) -> Any:
    """JSON whose strings hold invalid UTF-8 or lone surrogates: Go and C++ servers accept it, so kvgate does too
    (the body is forwarded unchanged; the odd characters are counted by their bytes)."""
    if "UTF-8" not in str(error) and "surrogate" not in str(error):
        raise BadRequest(f"request body is not valid JSON: {error}") from None
    try:
        return json.loads(raw.decode("utf-8", "surrogateescape"))
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None


class _Renderer(Protocol):
    def error_body(self, error: GatewayError) -> bytes: ...

    def stream_error_event(self, error: GatewayError) -> bytes: ...


_RENDERERS: dict[Dialect, _Renderer] = {
    Dialect.OLLAMA: ollama,
    Dialect.OPENAI: openai,
    Dialect.ANTHROPIC: anthropic,
    Dialect.LLAMACPP: llamacpp,
}


def parse(dialect: Dialect, operation: Operation, body: dict[str, Any], path: str) -> ParsedRequest:
    """The dialect-neutral request. Its ``model`` is safe text (a name with invalid UTF-8 or a lone surrogate has
    them as U+FFFD), as it keys pools, metrics labels, the status page and messages; the body keeps the name as
    sent."""
    if dialect is Dialect.OLLAMA:
        parsed = ollama.parse(operation, body)
    elif dialect is Dialect.OPENAI:
        parsed = openai.parse(operation, body, path=path)
    elif dialect is Dialect.ANTHROPIC:
        parsed = anthropic.parse(operation, body)
    else:
        parsed = llamacpp.parse(operation, body)
    if parsed.model is not None and parsed.model != (model := safe_text(parsed.model)):
        parsed = dataclasses.replace(parsed, model=model)
    return parsed


def error_body(dialect: Dialect, error: GatewayError) -> bytes:
    """The JSON body of an error response in the client's dialect."""
    return _RENDERERS[dialect].error_body(_safe(error))


def stream_error_event(dialect: Dialect, error: GatewayError) -> bytes:
    """A final stream event carrying an error, for errors after the response headers were sent."""
    return _RENDERERS[dialect].stream_error_event(_safe(error))


def _safe(error: GatewayError) -> GatewayError:
    """The error with a message that encodes (a client's string in it may hold lone surrogates); the message is
    replaced in place, so what logs it later writes the same safe text."""
    error.message = safe_text(error.message)
    return error
