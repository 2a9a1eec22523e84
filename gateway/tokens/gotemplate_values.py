"""Go values as a template sees them: structs, typed maps and slices, truth, `fmt` printing and `encoding/json`.

Python data stands in for Go data: str, int, float, bool, None (a nil interface), list (a slice), dict (a
`map[string]any`, marshalled with sorted keys). GoStruct, GoMap and GoList add what Go attaches to a type: a
`String()` method (templates print it) and its JSON field order. Printing anything Go would print in its `%v`
syntax (`map[a:1]`, `{x y}`) raises TemplateError instead: no Ollama template relies on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from gateway.tokens.gotemplate_parse import TemplateError

_JSON_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f",
                 "<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_NEEDS_ESCAPE = frozenset(_JSON_ESCAPES) | frozenset(chr(c) for c in range(0x20))


class JsonObject(dict[str, Any]):
    """A JSON object written in insertion order (a Go struct or ordered map), not sorted like a Go map."""


@dataclass(eq=False, slots=True)
class GoStruct:
    """A struct (or pointer to one): named fields, optionally a String() that prints its JSON."""

    type_name: str
    fields: dict[str, Any]
    json: Any = None  # what encoding/json writes for it (JsonObject), None when it cannot be marshalled here
    stringer: bool = False


class GoMap(dict[str, Any]):
    """A typed map whose String() is its JSON (Ollama's templateArgs / templateProperties)."""

    nil_text = "{}"  # what String() prints for a nil map

    def __init__(self, items: dict[str, Any] | None) -> None:
        super().__init__(items or {})
        self.is_nil = items is None


@dataclass(eq=False, slots=True)
class GoList:
    """A typed slice whose String() is its JSON (Ollama's templateTools); nil prints `null`."""

    items: list[Any] = field(default_factory=list)
    is_nil: bool = False


def truth(value: Any) -> bool:
    """Go template truth: false, 0, nil and empty strings, slices and maps are false; structs are true."""
    if value is None:
        return False
    if isinstance(value, bool | int | float | str | list | dict):
        return bool(value)
    if isinstance(value, GoList):
        return bool(value.items)
    return True


def go_print(value: Any) -> str:
    """How `{{ value }}` prints (fmt's %v), for the values templates print."""
    if isinstance(value, str):
        return value
    if value is None:
        return "<no value>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _go_float(value, exponent_at=21)
    if isinstance(value, GoMap):
        return value.nil_text if value.is_nil else go_json(value)
    if isinstance(value, GoList):
        return go_json(value)
    if isinstance(value, GoStruct) and value.stringer:
        return go_json(value)
    raise TemplateError(f"printing a {type(value).__name__} in Go syntax is not reproduced")


def go_json(value: Any) -> str:
    """encoding/json.Marshal: compact, map keys sorted, HTML characters escaped."""
    out: list[str] = []
    _write(out, value)
    return "".join(out)


def _write(out: list[str], value: Any) -> None:
    if value is None:
        out.append("null")
    elif isinstance(value, bool):
        out.append("true" if value else "false")
    elif isinstance(value, int):
        out.append(str(value) if abs(value) < 2**53 else _go_float(float(value), exponent_at=21, json=True))
    elif isinstance(value, float):
        out.append(_go_float(value, exponent_at=21, json=True))
    elif isinstance(value, str):
        out.append(json_string(value))
    elif isinstance(value, GoStruct):
        if value.json is None:
            raise TemplateError(f"marshalling {value.type_name} is not reproduced")
        _write(out, value.json)
    elif isinstance(value, GoList):
        _write(out, None if value.is_nil else value.items)
    elif isinstance(value, GoMap) and value.is_nil:
        out.append("null")
    elif isinstance(value, dict):
        keys = list(value) if isinstance(value, JsonObject) else sorted(value, key=lambda k: str(k).encode())
        out.append("{")
        for i, key in enumerate(keys):
            if i:
                out.append(",")
            out.append(json_string(str(key)))
            out.append(":")
            _write(out, value[key])
        out.append("}")
    elif isinstance(value, list | tuple):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _write(out, item)
        out.append("]")
    else:
        raise TemplateError(f"marshalling {type(value).__name__} is not reproduced")


def json_string(text: str) -> str:
    if not any(ch in _NEEDS_ESCAPE for ch in text):
        return f'"{text}"'
    parts = ['"']
    for ch in text:
        escaped = _JSON_ESCAPES.get(ch)
        if escaped is not None:
            parts.append(escaped)
        elif ch < " ":
            parts.append(f"\\u{ord(ch):04x}")
        elif "\ud800" <= ch <= "\udfff":
            parts.append("\ufffd")  # a lone surrogate is invalid UTF-8 in Go
        else:
            parts.append(ch)
    parts.append('"')
    return "".join(parts)


def _go_float(value: float, *, exponent_at: int, json: bool = False) -> str:
    """Shortest digits, positional below 1e`exponent_at` (and, for JSON, above 1e-6), else Go's e-notation."""
    if value != value or value in (float("inf"), float("-inf")):
        raise TemplateError(f"unsupported float {value}")
    if value == 0:
        return "-0" if str(value).startswith("-") else "0"
    magnitude = abs(value)
    small = 1e-6 if json else 1e-4
    if small <= magnitude < 10.0**exponent_at:
        text = format(Decimal(repr(value)), "f")
        return text.rstrip("0").rstrip(".") if "." in text else text
    mantissa, _, exponent = repr(value).partition("e")
    if not exponent:  # repr chose positional; rewrite as Go's e-notation
        mantissa, _, exponent = f"{value:e}".partition("e")
        mantissa = repr(float(mantissa)).rstrip("0").rstrip(".")
    sign = "-" if exponent.startswith("-") else "+"
    digits = exponent.lstrip("+-").lstrip("0") or "0"
    if not json and len(digits) < 2:
        digits = "0" + digits
    if json and sign == "+" and len(digits) < 2:
        digits = "0" + digits  # Go JSON keeps e+21; only e-07 is shortened to e-7
    return f"{mantissa}e{sign}{digits}"
