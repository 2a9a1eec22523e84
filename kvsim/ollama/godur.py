"""Ollama's ``keep_alive``: Go durations and JSON numbers (``api/types.go`` ``Duration.UnmarshalJSON``).

    5 / 5.0 / "5m" / "1h30m" / "300ms"   that long, in seconds
    0 / "0"                               unload right after the request
    negative number or negative string    forever (Go stores math.MaxInt64 nanoseconds)
    "-1" (no unit)                        400: ``time: missing unit in duration "-1"``
    true, [], {}                          400: ``Unsupported type: 'bool'`` (Go's reflect type name)

Pure.
"""

from __future__ import annotations

import json
import math
import re

FOREVER_S = (2**63 - 1) / 1e9  # math.MaxInt64 nanoseconds
_UNITS_NS = {
    "ns": 1,
    "us": 10**3,
    "\u00b5s": 10**3,
    "\u03bcs": 10**3,
    "ms": 10**6,
    "s": 10**9,
    "m": 60 * 10**9,
    "h": 3600 * 10**9,
}
_COMPONENT = re.compile(r"([0-9]*(?:\.[0-9]*)?)([^0-9.]*)")
_GO_TYPE_NAMES = {bool: "bool", list: "[]interface {}", dict: "map[string]interface {}"}


class DurationError(ValueError):
    """Raised with Go's exact error text."""


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def parse_go_duration(text: str) -> float:
    """``time.ParseDuration`` in seconds; DurationError carries Go's message."""
    orig, s = text, text
    sign = 1.0
    if s[:1] in ("-", "+"):
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    if not s:
        raise DurationError(f"time: invalid duration {_quote(orig)}")
    total_ns = 0.0
    while s:
        m = _COMPONENT.match(s)
        assert m is not None  # the pattern matches the empty string
        number, unit = m.group(1), m.group(2)
        if number in ("", "."):
            raise DurationError(f"time: invalid duration {_quote(orig)}")
        if not unit:
            raise DurationError(f"time: missing unit in duration {_quote(orig)}")
        if unit not in _UNITS_NS:
            raise DurationError(f"time: unknown unit {_quote(unit)} in duration {_quote(orig)}")
        total_ns += float(number) * _UNITS_NS[unit]
        s = s[m.end() :]
    if total_ns > 2**63 - 1:
        raise DurationError(f"time: invalid duration {_quote(orig)}")
    return sign * total_ns / 1e9


def parse_keep_alive(value: object) -> float:
    """keep_alive in seconds (``FOREVER_S`` for negative values)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        type_name = _GO_TYPE_NAMES.get(type(value), type(value).__name__)
        raise DurationError(f"Unsupported type: '{type_name}'")
    if isinstance(value, str):
        seconds = parse_go_duration(value)
    else:
        seconds = float(value)
        if math.isnan(seconds):
            raise DurationError("Unsupported type: 'float64'")
    return FOREVER_S if seconds < 0 else seconds
