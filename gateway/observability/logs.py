"""Structured logs: every line about a request carries its request id, from a context variable."""

from __future__ import annotations

import contextvars
import logging
import sys
import time
from typing import Any

import orjson

request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("kvgate_request_id", default="-")

MAX_LOGGED_CHARS = 128


def sanitize(text: str, max_chars: int = MAX_LOGGED_CHARS) -> str:
    """A client-given string made safe for one log line: printable ASCII only (no newlines to forge lines, no
    terminal escapes), cut to ``max_chars``."""
    cut = text[:max_chars]
    clean = "".join(c if c.isascii() and c.isprintable() else "?" for c in cut)
    return clean + ("..." if len(text) > max_chars else "")


_RESERVED = frozenset(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime", "request_id"}


class RequestIdFilter(logging.Filter):
    """Stamps each record with the id of the request being handled (``-`` outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line; ``extra=`` fields become keys."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "request_id": getattr(record, "request_id", "-"),
            "msg": record.getMessage(),
        }
        entry.update({key: value for key, value in vars(record).items() if key not in _RESERVED})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


class TextFormatter(logging.Formatter):
    """``time level [request-id] logger: message key=value ...``"""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s [%(request_id)s] %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = [f"{key}={value}" for key, value in vars(record).items() if key not in _RESERVED]
        return f"{line} {' '.join(extras)}" if extras else line


def configure_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
