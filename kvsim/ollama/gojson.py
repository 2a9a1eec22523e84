"""JSON as Ollama's Go server reads and writes it.

Reading (gin ``ShouldBindJSON`` = ``json.NewDecoder(body).Decode``): only the first JSON value is read
(trailing bytes are ignored), an empty body is ``io.EOF`` (``missing request body``), and syntax errors carry
Go's scanner wording (``invalid character 'x' looking for beginning of value``, ``unexpected EOF``); a body
that is not an object is ``json: cannot unmarshal array into Go value of type api.ChatRequest``.

Writing (``encoding/json``): ``<``, ``>`` and ``&`` inside strings are escaped as ``\\u003c`` and friends.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from kvsim.failures import SimError

_DECODER = json.JSONDecoder()
_JSON_KINDS = {dict: "object", list: "array", str: "string", bool: "bool", int: "number", float: "number"}
_LITERALS = {"n": "null", "t": "true", "f": "false"}
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class MissingBody(SimError):
    def __init__(self) -> None:
        super().__init__(400, "missing request body")


def json_kind(value: Any) -> str:
    return "null" if value is None else _JSON_KINDS.get(type(value), "object")


def _quote_char(ch: str) -> str:
    return "'\\''" if ch == "'" else f"'{ch}'"


def _enclosing(text: str, pos: int) -> str:
    """The innermost open bracket before ``pos`` ('{' or '['), skipping strings."""
    stack: list[str] = []
    in_string = escaped = False
    for ch in text[:pos]:
        if in_string:
            escaped = not escaped and ch == "\\"
            in_string = escaped or ch != '"'
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append(ch)
        elif ch in "}]" and stack:
            stack.pop()
    return stack[-1] if stack else ""


def _go_syntax_message(text: str, exc: json.JSONDecodeError) -> str:
    pos = exc.pos
    if pos >= len(text) or exc.msg.startswith("Unterminated"):
        return "unexpected EOF"
    ch = text[pos]
    if exc.msg == "Expecting value":
        literal = _LITERALS.get(ch)
        if literal is not None:
            for i, want in enumerate(literal):
                if pos + i >= len(text):
                    return "unexpected EOF"
                if text[pos + i] != want:
                    return f"invalid character {_quote_char(text[pos + i])} in literal {literal} (expecting '{want}')"
        return f"invalid character {_quote_char(ch)} looking for beginning of value"
    if exc.msg.startswith("Expecting property name"):
        return f"invalid character {_quote_char(ch)} looking for beginning of object key string"
    if exc.msg.startswith("Expecting ':'"):
        return f"invalid character {_quote_char(ch)} after object key"
    if _enclosing(text, pos) == "[":
        return f"invalid character {_quote_char(ch)} after array element"
    return f"invalid character {_quote_char(ch)} after object key:value pair"


def read_object(raw: bytes, go_type: str) -> dict[str, Any]:
    """The request body as a dict, or SimError(400) with Go's message."""
    text = raw.decode("utf-8", errors="replace").lstrip(" \t\r\n")
    if not text:
        raise MissingBody()
    try:
        value, _ = _DECODER.raw_decode(text)
    except json.JSONDecodeError as exc:
        raise SimError(400, _go_syntax_message(text, exc)) from None
    if value is None:
        return {}
    if _SURROGATE_ESCAPE.search(text):
        value = _go_strings(value)
    if not isinstance(value, dict):
        raise SimError(400, f"json: cannot unmarshal {json_kind(value)} into Go value of type api.{go_type}")
    return value


def _go_strings(value: Any) -> Any:
    """Go's decoder replaces a lone surrogate escape (``"\\ud83d"`` unpaired) with U+FFFD; Python keeps it."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_go_strings(item) for item in value]
    if isinstance(value, dict):
        return {_go_strings(key): _go_strings(item) for key, item in value.items()}
    return value


def type_error(go_type: str, field: str, value: Any, want: str) -> SimError:
    return SimError(
        400, f"json: cannot unmarshal {json_kind(value)} into Go struct field {go_type}.{field} of type {want}"
    )


def dumps(value: Any) -> bytes:
    """Go ``json.Marshal`` output (HTML-escaped), no trailing newline."""
    out = orjson.dumps(value)
    if b"<" in out or b">" in out or b"&" in out:
        out = out.replace(b"<", b"\\u003c").replace(b">", b"\\u003e").replace(b"&", b"\\u0026")
    return out
