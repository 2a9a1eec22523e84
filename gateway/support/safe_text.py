"""Client-given text made safe to encode: what reaches metrics labels, the status page, error bodies and logs.

kvgate decodes JSON bodies and headers leniently (invalid UTF-8 becomes lone surrogates, ``surrogateescape``), and
JSON's ``\\ud83d`` escapes make lone surrogates too. Such a string can't be encoded as UTF-8, so anything that writes
it out fails; :func:`safe_text` replaces each lone surrogate with U+FFFD; :func:`sanitize` cuts a name a log
message quotes to printable ASCII (pure, no I/O).
"""

from __future__ import annotations

import re

REPLACEMENT = "\ufffd"
_SURROGATES = re.compile("[\ud800-\udfff]")


def is_safe(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (it holds no lone surrogate)."""
    return _SURROGATES.search(text) is None


def safe_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD; ``text`` itself when it had none."""
    return text if is_safe(text) else _SURROGATES.sub(REPLACEMENT, text)


MAX_LOGGED_CHARS = 128


def sanitize(text: str, max_chars: int = MAX_LOGGED_CHARS) -> str:
    """A client-given string made safe for one log line: printable ASCII only (no newlines to forge lines, no
    terminal escapes), cut to ``max_chars``. The log formatters escape every line anyway
    (gateway/observability/logs.py); this is for names a message quotes, short and plain."""
    cut = text[:max_chars]
    clean = "".join(c if c.isascii() and c.isprintable() else "?" for c in cut)
    return clean + ("..." if len(text) > max_chars else "")
