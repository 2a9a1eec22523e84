"""Apply the planner's rewrites to a request body, touching only the fields it names (pure).

Where each dialect carries the two rewritable limits:

    dialect        context (num_ctx)        output limit
    ollama         options.num_ctx          options.num_predict
    openai         (none: Ollama's /v1      max_completion_tokens if the client sent it, else max_tokens
                    has no num_ctx)         (/v1/responses: max_output_tokens)
    anthropic      (none)                   max_tokens
    llama-server   (none: fixed at start)   the alias the client used (n_predict, max_completion_tokens,
                                            max_tokens), else n_predict

Every other field, known or not, is kept. Each change is described for the X-Kvgate-Rewrite header.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from gateway.admission import Rewrites
from gateway.domain import Dialect, ParsedRequest


def _output_field(parsed: ParsedRequest, path: str) -> tuple[str, ...]:
    body = parsed.body
    if parsed.dialect is Dialect.OLLAMA:
        return ("options", "num_predict")
    if parsed.dialect is Dialect.ANTHROPIC:
        return ("max_tokens",)
    if parsed.dialect is Dialect.OPENAI:
        if path.endswith("/responses"):
            return ("max_output_tokens",)
        return ("max_completion_tokens",) if "max_completion_tokens" in body else ("max_tokens",)
    for alias in ("n_predict", "max_completion_tokens", "max_tokens"):
        if alias in body:
            return (alias,)
    return ("n_predict",)


def _set(body: dict[str, Any], field: tuple[str, ...], value: int) -> Any:
    """Set ``field`` in ``body``, copying each nested object on the way, so objects shared with the client's
    parsed body are never changed."""
    target = body
    for key in field[:-1]:
        nested = target.get(key)
        nested = dict(nested) if isinstance(nested, dict) else {}
        target[key] = nested
        target = nested
    previous = target.get(field[-1])
    target[field[-1]] = value
    return previous


def apply_rewrites(parsed: ParsedRequest, path: str, rewrites: Rewrites) -> tuple[dict[str, Any] | None, list[str]]:
    """The body to forward (None when nothing changed) and a description of each change."""
    if not rewrites:
        return None, []
    body = dict(parsed.body)  # parsed.body stays as the client sent it (_set copies what it changes below)
    changes: list[str] = []
    if rewrites.num_ctx is not None and parsed.dialect is Dialect.OLLAMA:
        previous = _set(body, ("options", "num_ctx"), rewrites.num_ctx)
        if previous != rewrites.num_ctx:
            changes.append(f"options.num_ctx={rewrites.num_ctx} (was {_shown(previous)})")
    if rewrites.max_output_tokens is not None:
        field = _output_field(parsed, path)
        previous = _set(body, field, rewrites.max_output_tokens)
        if previous != rewrites.max_output_tokens:
            changes.append(f"{'.'.join(field)}={rewrites.max_output_tokens} (was {_shown(previous)})")
    return (body, changes) if changes else (None, [])


def _shown(value: Any) -> str:
    return "unset" if value is None else str(value)


def encode_body(body: dict[str, Any]) -> bytes:
    """JSON bytes for a rewritten body; strings that held invalid UTF-8 go back out as the bytes that came in."""
    try:
        return orjson.dumps(body)
    except TypeError:  # orjson refuses lone surrogates, which kvgate's lenient decoding produces
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogateescape")
