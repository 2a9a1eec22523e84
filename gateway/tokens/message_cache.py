"""A bounded LRU of text -> token count, so the next turn of a conversation costs only its new messages.

Keys are the texts themselves (a dict hashes them and compares on a hit, so there are no false hits); the bound is
on both the number of entries and the total characters held, so a few huge documents cannot pin memory.
"""

from __future__ import annotations

from collections import OrderedDict


class CountCache:
    """Least-recently-used token counts, bounded by entries and by total characters."""

    def __init__(self, *, max_entries: int = 8192, max_chars: int = 64 * 1024 * 1024) -> None:
        self.max_entries = max_entries
        self.max_chars = max_chars
        self._counts: OrderedDict[str, int] = OrderedDict()
        self._chars = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._counts)

    @property
    def chars(self) -> int:
        return self._chars

    def get(self, text: str) -> int | None:
        count = self._counts.get(text)
        if count is None:
            self.misses += 1
            return None
        self._counts.move_to_end(text)
        self.hits += 1
        return count

    def get_many(self, texts: list[str]) -> list[int | None]:
        """`get` for many texts at once (the warm path of a long conversation)."""
        counts = self._counts
        lookup, touch = counts.get, counts.move_to_end
        found: list[int | None] = [lookup(text) for text in texts]
        hits = 0
        for text, count in zip(texts, found, strict=True):
            if count is not None:
                touch(text)
                hits += 1
        self.hits += hits
        self.misses += len(texts) - hits
        return found

    def put(self, text: str, count: int) -> None:
        if len(text) > self.max_chars:
            return
        if text in self._counts:
            self._counts.move_to_end(text)
            self._counts[text] = count
            return
        self._counts[text] = count
        self._chars += len(text)
        while len(self._counts) > self.max_entries or self._chars > self.max_chars:
            old, _ = self._counts.popitem(last=False)
            self._chars -= len(old)

    def clear(self) -> None:
        self._counts.clear()
        self._chars = 0
