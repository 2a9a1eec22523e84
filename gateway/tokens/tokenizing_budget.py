"""A budget on the prompt bytes being tokenized at once, across all requests.

A tokenizer's memory grows with what it is given: tokenizing a 3.9 MiB chat builds token ids, offsets and
per-message strings several times its size, and 8 such chats counted at once took kvgate from 224 MB to 2.4 GB.
Each exact count takes its prompt's bytes from this budget while it runs and gives them back when done; a count
that finds no room waits, first come first served, up to its own wait, and then its request is estimated (flagged as
an estimate), exactly as a count that is too slow. A prompt larger than the whole budget runs only when nothing else
is being tokenized, so no prompt under ``counting.exact_count_max_bytes`` is estimated for its size alone.

When the budget goes idle after at least ``TRIM_AFTER_BYTES`` were tokenized, the freed heap is given back to the
system (heap_trim), in a thread: RSS returns near where it was rather than staying at the peak.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator

from gateway.tokens.heap_trim import trim_heap

TRIM_AFTER_BYTES = 1024 * 1024
"""Tokenized since the last trim before an idle budget gives the heap back: small counts free little."""


class TokenizingBudget:
    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.held_bytes = 0
        self.peak_bytes = 0
        """The most bytes ever held at once (for tests and the status page)."""
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._since_trim_bytes = 0
        self._trimming: asyncio.Future[bool] | None = None

    def _fits(self, size_bytes: int) -> bool:
        return self.held_bytes == 0 or self.held_bytes + size_bytes <= self.limit_bytes

    def _take(self, size_bytes: int) -> None:
        self.held_bytes += size_bytes
        self._since_trim_bytes += size_bytes
        self.peak_bytes = max(self.peak_bytes, self.held_bytes)

    async def acquire(self, size_bytes: int, wait_s: float) -> bool:
        """Take ``size_bytes``; wait up to ``wait_s`` (behind earlier waiters) for room. False: no room came."""
        if not self._waiters and self._fits(size_bytes):
            self._take(size_bytes)
            return True
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (size_bytes, ready)
        self._waiters.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(ready), timeout=wait_s)
        except TimeoutError:
            if ready.done():  # granted just as the wait ran out: it is held, keep it
                return True
            self._waiters.remove(entry)
            self._wake()  # a large waiter leaving may let smaller ones behind it in
            return False
        except BaseException:
            if ready.done():
                self.release(size_bytes)
            else:
                self._waiters.remove(entry)
                self._wake()
            raise
        return True

    def release(self, size_bytes: int) -> None:
        self.held_bytes -= size_bytes
        self._wake()
        if self.held_bytes == 0 and self._since_trim_bytes >= TRIM_AFTER_BYTES and (
                self._trimming is None or self._trimming.done()):
            self._since_trim_bytes = 0
            self._trimming = asyncio.get_running_loop().run_in_executor(None, trim_heap)

    def _wake(self) -> None:
        while self._waiters and self._fits(self._waiters[0][0]):
            size_bytes, ready = self._waiters.popleft()
            self._take(size_bytes)
            ready.set_result(None)

    @contextlib.asynccontextmanager
    async def held(self, size_bytes: int, wait_s: float) -> AsyncIterator[bool]:
        """``async with budget.held(n, wait_s) as got``: ``got`` says whether the bytes are held for the block."""
        got = await self.acquire(size_bytes, wait_s)
        try:
            yield got
        finally:
            if got:
                self.release(size_bytes)
