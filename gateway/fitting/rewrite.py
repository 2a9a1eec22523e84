"""Apply the planner's rewrites to a request body, touching only the fields it names (pure).

Where a body carries the two rewritable limits is its dialect's fact (``ParsedRequest.num_ctx_field`` and
``ParsedRequest.output``, set by ``gateway/dialects/``); this module only writes them:

    context      ``num_ctx_field`` (Ollama's ``options.num_ctx``); a body without one has no context to pin
    output       every limit field the body carries that allows more than the reservation (or is -1, "no
                 limit") is lowered to it; a field already within it is left as the client sent it (the backend
                 obeys one of them, and each is within the reservation). A body with no limit field gets the
                 dialect's own (``output.write_to``), so the backend stops where kvgate reserved.

Every other field, known or not, is kept. Each change is described for the X-Kvgate-Rewrite header.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from gateway.domain import FieldPath, ParsedRequest, Rewrites
from gateway.errors import BadRequest


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


def _current(body: dict[str, Any], field: FieldPath) -> Any:
    target: Any = body
    for key in field:
        target = target.get(key) if isinstance(target, dict) else None
    return target


def _exceeds(value: Any, limit: int) -> bool:
    return not isinstance(value, int | float) or isinstance(value, bool) or value < 0 or value > limit


def apply_rewrites(parsed: ParsedRequest, rewrites: Rewrites) -> tuple[dict[str, Any] | None, list[str]]:
    """The body to forward (None when nothing changed) and a description of each change."""
    if not rewrites:
        return None, []
    body = dict(parsed.body)  # parsed.body stays as the client sent it (_set copies what it changes below)
    changes: list[str] = []
    if rewrites.num_ctx is not None and parsed.num_ctx_field is not None:
        previous = _set(body, parsed.num_ctx_field, rewrites.num_ctx)
        if previous != rewrites.num_ctx:
            changes.append(f"{'.'.join(parsed.num_ctx_field)}={rewrites.num_ctx} (was {_shown(previous)})")
    limit = rewrites.max_output_tokens
    if limit is not None:
        fields = parsed.output.fields or (parsed.output.write_to,)
        for field in fields:
            if _exceeds(_current(body, field), limit):
                previous = _set(body, field, limit)
                changes.append(f"{'.'.join(field)}={limit} (was {_shown(previous)})")
    return (body, changes) if changes else (None, [])


def _shown(value: Any) -> str:
    return "unset" if value is None else str(value)


_LONE_SURROGATES = re.compile("[\ud800-\udfff]+")


def encode_body(body: dict[str, Any]) -> bytes:
    """JSON bytes for a rewritten body; strings that held invalid UTF-8 go back out as the bytes that came in, and
    other lone surrogates (a client's ``"\\ud83d"``) as the JSON escapes that came in.

    orjson refuses lone surrogates (kvgate's lenient decoding makes them) and nesting deeper than 254; the standard
    library writes both. A body too deep even for it (past Python's recursion limit) is a 400."""
    try:
        return orjson.dumps(body)
    except TypeError:
        pass
    try:
        text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    except RecursionError:
        raise BadRequest("request body is nested too deeply to rewrite; flatten it") from None
    out = bytearray()
    start = 0
    for match in _LONE_SURROGATES.finditer(text):  # surrogates only ever stand inside JSON strings
        out += text[start:match.start()].encode()
        for char in match.group():
            code = ord(char)
            out += bytes((code - 0xDC00,)) if 0xDC80 <= code <= 0xDCFF else b"\\u%04x" % code
        start = match.end()
    out += text[start:].encode()
    return bytes(out)
