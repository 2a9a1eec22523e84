"""Read the prompt and output lengths a backend reports in its response, without touching the bytes that pass through.

Where each backend puts the whole prompt's length (cached part included), first match wins:

    Ollama /api/*                 prompt_eval_count                    (post-truncation length, cache hits included)
    OpenAI-style /v1/*            usage.prompt_tokens
    OpenAI Responses              response.usage.input_tokens          (in the response.completed event)
    Anthropic /v1/messages        [message.]usage.input_tokens + cache_read_input_tokens + cache_creation_input_tokens
                                  (Anthropic counts cached tokens apart; message_start carries it in streams)
    llama-server /completion      tokens_evaluated, else timings.cache_n + timings.prompt_n
                                  (prompt_n alone leaves out the cached prefix)

Where each puts the output's length (``output_tokens()``), first match wins, and the last object reporting it in a
stream (Anthropic's message_delta carries the final count, after message_start's first one):

    Ollama /api/*                 eval_count
    OpenAI-style /v1/*            usage.completion_tokens
    OpenAI Responses              response.usage.output_tokens
    Anthropic /v1/messages        [message.]usage.output_tokens
    llama-server /completion      tokens_predicted, else timings.predicted_n

The observer keeps only the last 1 MiB of a body (O(1) work per chunk) and, once it has ended, searches that tail
from the back, where streams put the figure. A plain JSON body longer than that can't be parsed from its tail; the
figure is then picked out of it by name (a key can't occur unescaped inside a JSON string, so no text fakes it).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from typing import Any

import orjson

from gateway.support.hop_headers import NDJSON, SSE, stream_kind

TAIL_BYTES = 1 << 20
"""Enough for Ollama's final /api/generate object, whose ``context`` array can be long."""
_FIGURE = re.compile(rb'"(?:prompt_eval_count|prompt_tokens|input_tokens|tokens_evaluated)"\s*:\s*(\d+)')
_OUTPUT_FIGURE = re.compile(
    rb'"(?:eval_count|completion_tokens|output_tokens|tokens_predicted|predicted_n)"\s*:\s*(\d+)')
FIRST_LOOK_BYTES = 4096
"""How much of the tail's end is searched first; eight times more on each miss."""


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _usage_prompt_tokens(usage: dict[str, Any]) -> int | None:
    found = _int(usage.get("prompt_tokens"))
    if found is not None:
        return found
    found = _int(usage.get("input_tokens"))
    if found is None:
        return None
    return found + sum(_int(usage.get(key)) or 0 for key in ("cache_read_input_tokens", "cache_creation_input_tokens"))


def _usage_of(obj: dict[str, Any]) -> object:
    usage = obj.get("usage")
    if usage is None:  # Anthropic's message_start event, OpenAI Responses' response.completed event
        inner = obj.get("message") if isinstance(obj.get("message"), dict) else obj.get("response")
        usage = inner.get("usage") if isinstance(inner, dict) else None
    return usage


def prompt_tokens_of(obj: object) -> int | None:
    """The prompt length one JSON object (a body, an NDJSON line, an SSE event's data) reports, if any."""
    if not isinstance(obj, dict):
        return None
    found = _int(obj.get("prompt_eval_count"))
    if found is not None:
        return found
    usage = _usage_of(obj)
    if isinstance(usage, dict):
        found = _usage_prompt_tokens(usage)
        if found is not None:
            return found
    found = _int(obj.get("tokens_evaluated"))
    if found is not None:
        return found
    timings = obj.get("timings")
    if isinstance(timings, dict):
        prompt_n = _int(timings.get("prompt_n"))
        if prompt_n is not None:
            return prompt_n + (_int(timings.get("cache_n")) or 0)
    return None


def output_tokens_of(obj: object) -> int | None:
    """The output length one JSON object reports, if any."""
    if not isinstance(obj, dict):
        return None
    found = _int(obj.get("eval_count"))
    if found is not None:
        return found
    usage = _usage_of(obj)
    if isinstance(usage, dict):
        found = _int(usage.get("completion_tokens"))
        if found is None:
            found = _int(usage.get("output_tokens"))
        if found is not None:
            return found
    found = _int(obj.get("tokens_predicted"))
    if found is not None:
        return found
    timings = obj.get("timings")
    return _int(timings.get("predicted_n")) if isinstance(timings, dict) else None


_Extract = Callable[[object], int | None]


def _loads(raw: bytes) -> object:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def _figure_by_name(tail: bytes, pattern: re.Pattern[bytes] = _FIGURE) -> int | None:
    """The last figure in the end of a JSON body whose start is gone (no cache parts added: a rough answer for
    bodies over 1 MiB)."""
    figures = pattern.findall(tail)
    return int(figures[-1]) if figures else None


class UsageObserver:
    """Fed every chunk of a response; ``prompt_tokens()`` and ``output_tokens()`` answer once the body has ended."""

    def __init__(self) -> None:
        self._kind: str | None = None
        self._tail: deque[bytes] = deque()
        self._tail_bytes = 0
        self._dropped = False
        self._found: dict[_Extract, int | None] = {}
        self._parsed: tuple[object] | None = None
        """A body that is not a stream, parsed once for both figures (until the next chunk)."""
        self.streamed_chunks = 0
        """The stream's events so far (NDJSON lines, SSE ``data:`` fields): about one token each, what a stream cut
        before its usage is charged (rate_charge.py)."""

    def begin(self, content_type: str) -> None:
        """Called with the response's Content-Type before the first chunk."""
        self._kind = stream_kind(content_type)

    def feed(self, chunk: bytes) -> None:
        self._found.clear()
        self._parsed = None
        if self._kind is not None:
            self.streamed_chunks += chunk.count(b"\n") if self._kind == NDJSON else chunk.count(b"data:")
        self._tail.append(chunk)
        self._tail_bytes += len(chunk)
        while self._tail_bytes - len(self._tail[0]) >= TAIL_BYTES:
            self._tail_bytes -= len(self._tail.popleft())
            self._dropped = True

    def prompt_tokens(self) -> int | None:
        """The prompt's figure (searched once per state of the tail: asking twice costs nothing)."""
        return self._figure(prompt_tokens_of, _FIGURE)

    def output_tokens(self) -> int | None:
        """The output's figure (None when the backend reported none)."""
        return self._figure(output_tokens_of, _OUTPUT_FIGURE)

    def _figure(self, extract: _Extract, pattern: re.Pattern[bytes]) -> int | None:
        if extract not in self._found:
            self._found[extract] = self._search(extract, pattern)
        return self._found[extract]

    def _search(self, extract: _Extract, pattern: re.Pattern[bytes]) -> int | None:
        if self._kind is None:
            if self._dropped:
                return _figure_by_name(b"".join(self._tail), pattern)
            if self._parsed is None:
                self._parsed = (_loads(b"".join(self._tail)),)
            return extract(self._parsed[0])
        # The figure sits in the last lines: look at a growing suffix of the tail, so a long stream costs no more
        # than a short one when it is there (and at worst one pass over the whole tail when it is not).
        want_bytes = FIRST_LOOK_BYTES
        while True:
            suffix, whole = self._suffix(want_bytes)
            lines = suffix.splitlines()
            if lines and not (whole and not self._dropped):
                lines = lines[1:]  # the first line may be cut
            found = self._last_usage(lines, extract)
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

    def _last_usage(self, lines: list[bytes], extract: _Extract) -> int | None:
        for line in reversed(lines):
            payload = line.removeprefix(b"data:").strip() if self._kind == SSE else line.strip()
            if self._kind == NDJSON or line.startswith(b"data:"):
                found = extract(_loads(payload))
                if found is not None:
                    return found
        return None
