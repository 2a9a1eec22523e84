"""Conversations stick to the backend that holds their prompt cache, while it fits.

llama-server (``cache_prompt``, on by default) and Ollama (one cache per slot) reuse the KV cells of a prompt's
common prefix: the next turn of a conversation sent to the same backend skips re-reading its history. A
conversation is named by a hash of its opening (``conversation_key``): the model, the messages up to and including
the first user message (system prompts and all), at most ``OPENING_CHARS`` of them; for a text prompt, its first
``OPENING_CHARS`` characters. Every later turn begins the same way, so it hashes the same.

``StickyMap`` remembers the backend that served each conversation last: a bounded LRU (the oldest entry goes when
full) whose entries expire ``ttl_s`` after their last use. The clock is injected.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import orjson

from gateway.domain import ParsedRequest

OPENING_CHARS = 2048
"""How much of a conversation's opening names it (its first turn can be long; a hash of 2 KB tells them apart)."""


def conversation_key(parsed: ParsedRequest) -> str | None:
    """A stable name for the request's conversation, or None when it has none (no messages, no text prompt). Any
    JSON a client sends has one: lone surrogates and other text JSON allows but UTF-8 does not are hashed as their
    escapes."""
    opening = _opening(parsed)
    if opening is None:
        return None
    payload = _canonical([parsed.model or "", opening])
    return hashlib.blake2b(payload[: OPENING_CHARS * 2], digest_size=16).hexdigest()


def _canonical(value: Any) -> bytes:
    """Sorted-key JSON; text that is not valid UTF-8 (a lone surrogate from a ``\\udc98`` escape) falls back to
    ASCII escapes, so every parsed body has a key."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=str)
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(value, sort_keys=True, ensure_ascii=True, default=str).encode()


def _opening(parsed: ParsedRequest) -> Any:
    messages = parsed.prompt_input.messages if parsed.prompt_input.messages is not None else parsed.messages
    if messages:
        first_user = next((i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"),
                          len(messages) - 1)
        opening = _canonical(list(messages[: first_user + 1]))
        return opening[:OPENING_CHARS].decode("utf-8", "replace")
    text = parsed.prompt_input.text if parsed.prompt_input.text is not None else parsed.prompt
    if isinstance(text, str) and text:
        return text[:OPENING_CHARS]
    return None


class StickyMap:
    """conversation key -> the backend that served it last (see the module docstring)."""

    def __init__(self, *, max_entries: int, ttl_s: float, clock: Callable[[], float]) -> None:
        self._entries: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._max_entries = max_entries
        self._ttl_s = ttl_s
        self._clock = clock

    def configure(self, *, max_entries: int, ttl_s: float) -> None:
        self._max_entries, self._ttl_s = max_entries, ttl_s
        self._trim()

    def get(self, key: str) -> str | None:
        found = self._entries.get(key)
        if found is None:
            return None
        backend, used_s = found
        if self._clock() - used_s > self._ttl_s:
            del self._entries[key]
            return None
        return backend

    def remember(self, key: str, backend: str) -> None:
        self._entries[key] = (backend, self._clock())
        self._entries.move_to_end(key)
        self._trim()

    def _trim(self) -> None:
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
