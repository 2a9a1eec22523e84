"""Structured logs: every line about a request carries its request id, from a context variable.

One record is one line, whatever a client sends: both formatters escape control characters (newlines, CR, ANSI
escapes, other C0 and C1 codes, DEL), Unicode line and paragraph separators, bidirectional and zero-width format
characters and lone surrogates (a non-UTF-8 byte decoded with ``surrogateescape``) in the message and in every
extra field, so no client string can start a forged line or colour a terminal. kvgate's own tracebacks stay
multi-line: each of their lines is indented with ``  | ``, so none can pass for a record. In the text format every
extra field and the request id are logfmt values (:func:`logfmt_value`): one holding a space, ``=``, a quote, a
backslash or an unsafe character is quoted, so a client string (a path decoded from ``%20``, a model name, an
X-Request-ID) can't add a field; so is a client string a message names as :class:`ClientText`. Malformed HTTP requests,
which aiohttp logs at ERROR with a traceback, become one WARNING line (:class:`MalformedRequestFilter`).
"""

from __future__ import annotations

import contextvars
import logging
import re
import sys
import time
from typing import Any

import orjson
from aiohttp.http_exceptions import HttpProcessingError

request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("kvgate_request_id", default="-")

TRACEBACK_INDENT = "  | "


_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ud800-\udfff]"
)
"""C0, DEL, C1; line and paragraph separators; bidi marks, embeddings, overrides and isolates; zero-width
characters and the BOM; surrogates."""
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: str) -> str:
    """``text`` on one line with nothing a terminal acts on: every unsafe character as a backslash escape
    (``\\n``, ``\\x1b``, ``\\u2028``, ``\\udcff``); everything else, non-ASCII letters included, unchanged."""
    return _UNSAFE.sub(_escape_char, text) if _UNSAFE.search(text) else text


def _escape_lines(text: str) -> list[str]:
    """A multi-line text (a traceback) as its lines, each escaped."""
    return [escape(line) for line in text.split("\n")]


def _safe(value: Any) -> Any:
    """A JSON-ready copy of an extra field with every string escaped (keys too); other types as text."""
    if isinstance(value, str):
        return escape(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, dict):
        return {escape(str(key)): _safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_safe(item) for item in value]
    if isinstance(value, bytes):
        return escape(value.decode("utf-8", "backslashreplace"))
    return escape(str(value))


_BARE = re.compile(r'[^\s="\\\[\]]+')
"""What a logfmt value may hold unquoted: no whitespace, ``=``, quote, backslash or bracket (the request id's)."""


def logfmt_value(text: str) -> str:
    """``text`` as one logfmt value: bare when it is a run of safe characters, else in double quotes with ``\\``
    and ``\"`` escaped and every unsafe character as its backslash escape (:func:`escape`)."""
    if _BARE.fullmatch(text) and not _UNSAFE.search(text):
        return text
    return '"' + escape(text.replace("\\", "\\\\").replace('"', '\\"')) + '"'


class ClientText(str):
    """A client-given string in a log message's arguments (``log.info("%s %s", method, ClientText(path))``): the
    text format writes it as a logfmt value, so its spaces or ``=`` can't pass for fields; JSON as the string."""

    __slots__ = ()


def _text_value(value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "backslashreplace")
    return logfmt_value(str(value))


def _text_message(record: logging.LogRecord) -> str:
    """The record's message, with its :class:`ClientText` arguments as logfmt values."""
    args = record.args
    if isinstance(args, tuple) and any(isinstance(arg, ClientText) for arg in args):
        return str(record.msg) % tuple(logfmt_value(arg) if isinstance(arg, ClientText) else arg for arg in args)
    return record.getMessage()


_RESERVED = frozenset(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime", "request_id"}


class RequestIdFilter(logging.Filter):
    """Stamps each record with the id of the request being handled (``-`` outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        return True


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {key: value for key, value in vars(record).items() if key not in _RESERVED}


def _traceback(formatter: logging.Formatter, record: logging.LogRecord) -> str | None:
    parts = []
    if record.exc_info:
        parts.append(formatter.formatException(record.exc_info))
    elif record.exc_text:
        parts.append(record.exc_text)
    if record.stack_info:
        parts.append(formatter.formatStack(record.stack_info))
    return "\n".join(parts) if parts else None


class JsonFormatter(logging.Formatter):
    """One JSON object per line; ``extra=`` fields become keys; every string escaped (so the line also holds no raw
    DEL, C1 or line separator, which JSON itself would allow)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": escape(record.name),
            "request_id": _safe(getattr(record, "request_id", "-")),
            "msg": escape(record.getMessage()),
        }
        for key, value in _extras(record).items():
            entry[escape(key)] = _safe(value)
        trace = _traceback(self, record)
        if trace is not None:
            entry["exc"] = "\n".join(_escape_lines(trace))
        return orjson.dumps(entry).decode()


class TextFormatter(logging.Formatter):
    """``time level [request-id] logger: message key=value ...``, on one line, each value (and the request id) a logfmt
    value (quoted when it must be); a traceback follows on lines of its
    own, each indented with ``  | ``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s [%(request_id)s] %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        request_id = _text_value(getattr(record, "request_id", "-"))
        line = (f"{self.formatTime(record, self.datefmt)} {record.levelname} [{request_id}] {escape(record.name)}: "
                f"{escape(_text_message(record))}")
        extras = [f"{escape(key)}={_text_value(value)}" for key, value in _extras(record).items()]
        if extras:
            line = f"{line} {' '.join(extras)}"
        trace = _traceback(self, record)
        if trace is not None:
            line += "".join(f"\n{TRACEBACK_INDENT}{part}" for part in _escape_lines(trace))
        return line


class MalformedRequestFilter(logging.Filter):
    """For aiohttp's server logger: a request aiohttp could not parse (a bad request line, header or chunked body:
    an ``HttpProcessingError``) is the client's fault, not kvgate's: one WARNING line naming the client and the
    problem, no traceback. aiohttp logs the first bad request line of a connection at DEBUG (to stay quiet about
    non-HTTP traffic); that is raised to WARNING too. Other records pass unchanged, except DEBUG ones when the root
    logger is not at DEBUG (this logger is set to DEBUG so that those bad request lines reach the filter)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            client = record.args[0] if isinstance(record.args, tuple) and record.args else None
            record.msg = "malformed request from %s: %s"
            record.args = (client or "unknown client", ClientText(_problem(exc)))  # it quotes the client's bytes
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
            record.exc_info, record.exc_text, record.stack_info = None, None, None
            return logging.getLogger().isEnabledFor(logging.WARNING)
        if record.levelno < logging.INFO:
            return logging.getLogger().isEnabledFor(record.levelno)
        return True


def _problem(exc: HttpProcessingError) -> str:
    """The parser's complaint on one line: its first line, the offending bytes when it shows them (not the caret)."""
    lines = [line.strip() for line in (exc.message or type(exc).__name__).splitlines()]
    shown = [line for line in lines if line and set(line) != {"^"}]
    return f"HTTP {exc.code}, {type(exc).__name__}: {' '.join(shown)[:300]}"


def quiet_malformed_requests() -> None:
    """Install :class:`MalformedRequestFilter` on aiohttp's server logger (once)."""
    server = logging.getLogger("aiohttp.server")
    if not any(isinstance(existing, MalformedRequestFilter) for existing in server.filters):
        server.addFilter(MalformedRequestFilter())
    server.setLevel(logging.DEBUG)


def configure_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    quiet_malformed_requests()
