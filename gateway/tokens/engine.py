"""Counting many texts with one `tokenizers.Tokenizer`: cache first, then one batch for the misses.

    texts ──▶ CountCache hit? ──yes──▶ count
                 │ no
                 ▼
        split long texts at safe line starts (only where the pre-tokenizer never joins across them)
                 ▼
        Tokenizer.encode_batch (Rust, all cores, GIL released)  ──▶ sum per text ──▶ CountCache

Counts exclude BOS/EOS; `special_tokens_added` says how many add_special would add. Big batches run in a worker
thread so the event loop keeps serving; the cache is only touched from the caller's thread.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence

import tokenizers

from gateway.tokens.message_cache import CountCache

# A line start after a newline, followed by a non-space character: regex pre-tokenizers of the GPT-2 family never
# build a word across it (their newline-run pieces end at the newline and words do not start with a newline).
_SAFE_CUT = re.compile(r"\n(?=\S)")
_CHUNK_CHARS = 16 * 1024
_THREAD_MIN_CHARS = 32 * 1024
_BATCH_CHARS = 512 * 1024
"""Pieces go to the tokenizer in batches of about this many characters: an encoding holds tens of bytes per token
(ids, token strings, masks), so one batch of a whole 4 MiB prompt would hold hundreds of MB at once."""


class TokenizerEngine:
    """A tokenizer plus a count cache; `chunkable` allows splitting long texts at safe line starts."""

    def __init__(self, tokenizer: tokenizers.Tokenizer, *, chunkable: bool, cache: CountCache | None = None) -> None:
        self.tokenizer = tokenizer
        self.chunkable = chunkable
        self.cache = cache if cache is not None else CountCache()
        self.special_tokens_added = tokenizer.num_special_tokens_to_add(False)
        # Texts of the added tokens that are split out before BPE (special and user-defined alike).
        self.special_texts = tuple(t.content for t in tokenizer.get_added_tokens_decoder().values())

    def count_uncached(self, texts: Sequence[str]) -> list[int]:
        """Token counts of `texts` (no BOS/EOS), ignoring the cache."""
        pieces: list[str] = []
        owners: list[int] = []
        for index, text in enumerate(texts):
            for piece in self._split(text):
                pieces.append(piece)
                owners.append(index)
        counts = [0] * len(texts)
        if not pieces:
            return counts
        for start, end in _batches(pieces, _BATCH_CHARS):
            encodings = self.tokenizer.encode_batch_fast(pieces[start:end], add_special_tokens=False)
            for owner, encoding in zip(owners[start:end], encodings, strict=True):
                counts[owner] += len(encoding.ids)
            del encodings
        return counts

    def _split(self, text: str) -> list[str]:
        if not text:
            return []
        if not self.chunkable or len(text) <= _CHUNK_CHARS:
            return [text]
        pieces = []
        start = 0
        while len(text) - start > _CHUNK_CHARS:
            match = _SAFE_CUT.search(text, start + _CHUNK_CHARS // 2, start + _CHUNK_CHARS * 2)
            if match is None:
                match = _SAFE_CUT.search(text, start + _CHUNK_CHARS * 2)
                if match is None:
                    break
            pieces.append(text[start : match.end()])
            start = match.end()
        pieces.append(text[start:])
        return pieces

    def count_cached(self, texts: Sequence[str]) -> tuple[list[int | None], list[int]]:
        """Cached counts (None where missing) and the indexes of the misses, deduplicated by text."""
        found = self.cache.get_many(list(texts))
        missing: list[int] = []
        seen: set[str] = set()
        for index, count in enumerate(found):
            if count is None and texts[index] not in seen:
                seen.add(texts[index])
                missing.append(index)
        return found, missing

    async def count(self, texts: Sequence[str]) -> list[int]:
        """Token counts of `texts` (no BOS/EOS), from the cache where possible."""
        found, missing = self.count_cached(texts)
        if missing:
            todo = [texts[i] for i in missing]
            if sum(len(t) for t in todo) >= _THREAD_MIN_CHARS:
                fresh = await asyncio.to_thread(self.count_uncached, todo)
            else:
                fresh = self.count_uncached(todo)
            by_text = dict(zip(todo, fresh, strict=True))
            for text, count in by_text.items():
                self.cache.put(text, count)
            found = [c if c is not None else by_text[texts[i]] for i, c in enumerate(found)]
        return [c if c is not None else 0 for c in found]


def _batches(pieces: Sequence[str], max_chars: int) -> list[tuple[int, int]]:
    """Index ranges of ``pieces``, each of at most ``max_chars`` characters (or one piece, if it is longer)."""
    ranges: list[tuple[int, int]] = []
    start = 0
    chars = 0
    for index, piece in enumerate(pieces):
        if index > start and chars + len(piece) > max_chars:
            ranges.append((start, index))
            start, chars = index, 0
        chars += len(piece)
    if start < len(pieces):
        ranges.append((start, len(pieces)))
    return ranges
