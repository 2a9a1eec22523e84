"""Probes shared between concurrent requests: one call per key at a time, its answer reused while recent enough.

A caller asks for a key with the age it tolerates (``max_age_s``): a call for that key that started at most that long
before it asked answers it, whether still in flight or finished; otherwise a new call starts, and callers after it
share that one. A failed call answers only the callers that joined it while in flight; the next caller tries again.
With ``max_age_s = 0`` only calls started at or after the caller asked are shared, so a reading is never older than
the question (what a re-read after a model reload needs). A waiter that is cancelled never cancels the shared call.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

MAX_KEYS = 256
"""Keys remembered at once (the oldest are forgotten first), so client-chosen names can't grow the table."""


class SingleFlight(Generic[K, V]):
    def __init__(self, *, max_keys: int = MAX_KEYS, clock: Callable[[], float] = time.monotonic) -> None:
        self._calls: OrderedDict[K, tuple[float, asyncio.Future[V]]] = OrderedDict()
        self._running: set[asyncio.Future[V]] = set()
        """Calls in flight, forgotten keys' too: what aclose ends."""
        self._max_keys = max_keys
        self._clock = clock
        self.started = 0
        """Calls started (for tests and metrics: many concurrent callers, one call)."""

    async def run(
        self, key: K, call: Callable[[], Awaitable[V]], *, max_age_s: float = 0.0, join_running: bool = False
    ) -> V:
        """``call``'s answer, or that of a call for ``key`` started at most ``max_age_s`` before this was asked; with
        ``join_running``, any call still in flight answers too, however long ago it started."""
        asked_at = self._clock()
        entry = self._calls.get(key)
        if entry is not None:
            started_at, future = entry
            recent = started_at >= asked_at - max_age_s
            if not future.done() and (recent or join_running):
                return await asyncio.shield(future)
            if recent and future.done() and not future.cancelled() and future.exception() is None:
                return await asyncio.shield(future)
        future = asyncio.ensure_future(call())
        self._running.add(future)
        future.add_done_callback(self._running.discard)
        self.started += 1
        self._calls[key] = (asked_at, future)
        self._calls.move_to_end(key)
        while len(self._calls) > self._max_keys:
            self._calls.popitem(last=False)
        future.add_done_callback(lambda done: self._settle(key, done))
        return await asyncio.shield(future)

    def _settle(self, key: K, future: asyncio.Future[V]) -> None:
        """A failed call is forgotten (its error read, so asyncio does not report it lost when no waiter is left)."""
        if future.cancelled() or future.exception() is not None:
            entry = self._calls.get(key)
            if entry is not None and entry[1] is future:
                del self._calls[key]

    async def aclose(self) -> None:
        """At shutdown: the calls still in flight (no waiter's cancellation ends them) end here, so none runs on
        into a closed session and leaves a connection half open."""
        running = list(self._running)
        for future in running:
            future.cancel()
        await asyncio.gather(*running, return_exceptions=True)
