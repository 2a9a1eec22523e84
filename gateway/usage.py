"""Read the prompt length a backend reports in its response, without touching the bytes that pass through.

Ollama's final object has ``prompt_eval_count`` (the post-truncation prompt length, cache hits included); OpenAI-style
responses carry ``usage.prompt_tokens``; llama-server's native ``/completion`` has ``tokens_evaluated``. In streams
the figure is in the last NDJSON line or one of the last SSE events, so the observer keeps only the tail of the body
(O(1) work per chunk) and parses it once, at the end.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import orjson

from gateway.framing import NDJSON, SSE, stream_kind

TAIL_BYTES = 1 << 20
"""Enough for Ollama's final /api/generate object, whose ``context`` array can be long."""


def prompt_tokens_of(obj: object) -> int | None:
    if not isinstance(obj, dict):
        return None
    value: Any = obj.get("prompt_eval_count")
    if value is None and isinstance(obj.get("usage"), dict):
        value = obj["usage"].get("prompt_tokens", obj["usage"].get("input_tokens"))
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
        data = b"".join(self._tail)
        if self._kind is None:
            return None if self._dropped else prompt_tokens_of(_loads(data))
        lines = data.splitlines()
        if self._dropped and lines:
            lines = lines[1:]  # the first line may be cut
        for line in reversed(lines):
            payload = line.removeprefix(b"data:").strip() if self._kind == SSE else line.strip()
            if self._kind == NDJSON or line.startswith(b"data:"):
                found = prompt_tokens_of(_loads(payload))
                if found is not None:
                    return found
        return None
