"""JSON text exactly as llama.cpp's Jinja engine writes it (`tojson` filter, common/jinja/value.cpp).

Python's json.dumps with ensure_ascii=False agrees on strings, separators and indentation; floats differ (C++ streams
print 6 significant digits: 3.0 -> "3", 0.1 -> "0.1"), so values are written here by hand.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any


def llama_tojson(value: Any, *, indent: int | None = None) -> str:
    """`value | tojson` (indent=None) or `value | tojson(indent=n)` as llama-server renders it."""
    parts: list[str] = []
    _write(parts, value, 0, -1 if indent is None else indent, ", " if indent is None else ",")
    return "".join(parts)


def _write(out: list[str], value: Any, level: int, indent: int, item_sep: str) -> None:
    if value is None:
        out.append("null")
    elif isinstance(value, bool):
        out.append("true" if value else "false")
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float):
        out.append(f"{value:g}")
    elif isinstance(value, str):
        out.append(json.dumps(value, ensure_ascii=False))
    elif isinstance(value, Mapping):
        _write_items(out, [(str(k), v) for k, v in value.items()], level, indent, item_sep, "{}")
    elif isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        _write_items(out, [(None, v) for v in value], level, indent, item_sep, "[]")
    else:
        out.append("null")


def _write_items(
    out: list[str], items: list[tuple[str | None, Any]], level: int, indent: int, item_sep: str, brackets: str
) -> None:
    out.append(brackets[0])
    if items:
        newline = "\n" if indent >= 0 else ""
        pad = " " * (level * indent) if indent > 0 else ""
        step = " " * indent if indent > 0 else ""
        out.append(newline)
        for i, (key, item) in enumerate(items):
            out.append(pad + step)
            if key is not None:
                out.append(json.dumps(key, ensure_ascii=False))
                out.append(": ")
            _write(out, item, level + 1, indent, item_sep)
            if i < len(items) - 1:
                out.append(item_sep)
            out.append(newline)
        out.append(pad)
    out.append(brackets[1])
