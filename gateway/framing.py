"""Framers for streamed responses: find NDJSON lines and SSE events in chunks split anywhere.

They observe bytes; they never re-encode them. Feeding any split of a payload yields the same frames.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NDJSON = "application/x-ndjson"
SSE = "text/event-stream"

_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_LINE = re.compile(rb"\r\n|\n|\r")


def stream_kind(content_type: str) -> str | None:
    """``NDJSON``, ``SSE`` or None for a Content-Type header value."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media if media in (NDJSON, SSE) else None


class NdjsonFramer:
    """Splits an NDJSON byte stream into lines (without the newline); blank lines are skipped."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        data = self._pending + chunk
        *lines, self._pending = data.split(b"\n")
        return [line.rstrip(b"\r") for line in lines if line.strip()]

    def close(self) -> list[bytes]:
        """The last line, if the stream ended without a newline."""
        tail, self._pending = self._pending.strip(), b""
        return [tail] if tail else []


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One server-sent event: its ``event:`` name (empty when absent) and joined ``data:`` lines."""

    event: str
    data: bytes


class SseFramer:
    """Splits a text/event-stream into events (comments such as llama-server's ``:`` pings are dropped)."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, chunk: bytes) -> list[SseEvent]:
        data = self._pending + chunk
        # A trailing lone "\r" might be half of "\r\n": keep it until the next chunk decides.
        hold = 1 if data.endswith(b"\r") else 0
        events: list[SseEvent] = []
        start = 0
        for match in _EVENT_END.finditer(data, 0, len(data) - hold):
            event = _parse_event(data[start : match.start()])
            if event is not None:
                events.append(event)
            start = match.end()
        self._pending = data[start:]
        return events

    def close(self) -> list[SseEvent]:
        tail, self._pending = self._pending, b""
        event = _parse_event(tail) if tail.strip() else None
        return [event] if event is not None else []


def _parse_event(block: bytes) -> SseEvent | None:
    name = ""
    data: list[bytes] = []
    for line in _LINE.split(block):
        if not line or line.startswith(b":"):
            continue
        field, _, value = line.partition(b":")
        value = value[1:] if value.startswith(b" ") else value
        if field == b"data":
            data.append(value)
        elif field == b"event":
            name = value.decode("utf-8", "replace")
    if not data and not name:
        return None
    return SseEvent(name, b"\n".join(data))
