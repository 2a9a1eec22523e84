"""Read the prompt length a backend reports in its response, without touching the bytes that pass through.

Ollama's final object has ``prompt_eval_count`` (the post-truncation prompt length, cache hits included); OpenAI-style
responses carry ``usage.prompt_tokens``; Anthropic streams ``message.usage.input_tokens`` in their first event;
llama-server's native ``/completion`` has ``tokens_evaluated``. The observer keeps only the last 1 MiB of a body
(O(1) work per chunk) and, once it has ended, searches that tail from the back, where streams put the figure.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import orjson

from gateway.framing import NDJSON, SSE, stream_kind

TAIL_BYTES = 1 << 20
"""Enough for Ollama's final /api/generate object, whose ``context`` array can be long."""
FIRST_LOOK_BYTES = 4096
"""How much of the tail's end is searched first; eight times more on each miss."""


def prompt_tokens_of(obj: object) -> int | None:
    if not isinstance(obj, dict):
        return None
    value: Any = obj.get("prompt_eval_count")
    usage = obj.get("usage")
    if usage is None and isinstance(obj.get("message"), dict):  # Anthropic's message_start event
        usage = obj["message"].get("usage")
    if value is None and isinstance(usage, dict):
        value = usage.get("prompt_tokens", usage.get("input_tokens"))
    if value is None:
        value = obj.get("tokens_evaluated")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _loads(raw: bytes) -> object:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


class UsageObserver:
    """Fed every chunk of a response; ``prompt_tokens()`` answers once the body has ended."""

    def __init__(self) -> None:
        self._kind: str | None = None
        self._tail: deque[bytes] = deque()
        self._tail_bytes = 0
        self._dropped = False

    def begin(self, content_type: str) -> None:
        """Called with the response's Content-Type before the first chunk."""
        self._kind = stream_kind(content_type)

    def feed(self, chunk: bytes) -> None:
        self._tail.append(chunk)
        self._tail_bytes += len(chunk)
        while self._tail_bytes - len(self._tail[0]) >= TAIL_BYTES:
            self._tail_bytes -= len(self._tail.popleft())
            self._dropped = True

    def prompt_tokens(self) -> int | None:
        if self._kind is None:
            return None if self._dropped else prompt_tokens_of(_loads(b"".join(self._tail)))
        # The figure sits in the last lines: look at a growing suffix of the tail, so a long stream costs no more
        # than a short one when it is there (and at worst one pass over the whole tail when it is not).
        want_bytes = FIRST_LOOK_BYTES
        while True:
            suffix, whole = self._suffix(want_bytes)
            lines = suffix.splitlines()
            if lines and not (whole and not self._dropped):
                lines = lines[1:]  # the first line may be cut
            found = self._last_usage(lines)
            if found is not None or whole:
                return found
            want_bytes *= 8

    def _suffix(self, want_bytes: int) -> tuple[bytes, bool]:
        """At least ``want_bytes`` from the end of the tail (whole chunks), and whether that is all of it."""
        if want_bytes >= self._tail_bytes:
            return b"".join(self._tail), True
        parts: list[bytes] = []
        size = 0
        for chunk in reversed(self._tail):
            parts.append(chunk)
            size += len(chunk)
            if size >= want_bytes:
                break
        parts.reverse()
        return b"".join(parts), len(parts) == len(self._tail)

    def _last_usage(self, lines: list[bytes]) -> int | None:
        for line in reversed(lines):
            payload = line.removeprefix(b"data:").strip() if self._kind == SSE else line.strip()
            if self._kind == NDJSON or line.startswith(b"data:"):
                found = prompt_tokens_of(_loads(payload))
                if found is not None:
                    return found
        return None
