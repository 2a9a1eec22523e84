"""Read the prompt length a backend reports in its response, without touching the bytes that pass through.

Ollama's final object has ``prompt_eval_count`` (the post-truncation prompt length, cache hits included); OpenAI-style
responses carry ``usage.prompt_tokens``; llama-server's native ``/completion`` has ``tokens_evaluated``.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.framing import NDJSON, SSE, NdjsonFramer, SseFramer, stream_kind


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
        self.begin("")

    def begin(self, content_type: str) -> None:
        """Called with the response's Content-Type before the first chunk."""
        self._kind = stream_kind(content_type)
        self._ndjson = NdjsonFramer() if self._kind == NDJSON else None
        self._sse = SseFramer() if self._kind == SSE else None
        self._body: list[bytes] = []
        self._last: bytes | None = None

    def feed(self, chunk: bytes) -> None:
        if self._ndjson is not None:
            lines = self._ndjson.feed(chunk)
            if lines:
                self._last = lines[-1]
        elif self._sse is not None:
            for event in self._sse.feed(chunk):
                if b"usage" in event.data or b"prompt_eval_count" in event.data:
                    self._last = event.data
        else:
            self._body.append(chunk)

    def prompt_tokens(self) -> int | None:
        if self._ndjson is not None:
            tail = self._ndjson.close()
            return prompt_tokens_of(_loads(tail[-1] if tail else self._last or b""))
        if self._sse is not None:
            self._sse.close()
            return prompt_tokens_of(_loads(self._last or b""))
        return prompt_tokens_of(_loads(b"".join(self._body)))
