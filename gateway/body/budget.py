"""A bound on the request-body bytes kvgate holds at once, across all requests (``server.max_held_body_bytes``).

    request ──▶ lease ──▶ take(Content-Length) up front, or take(len(chunk)) per chunk of a chunked body
                            │ fits: held_bytes += n
                            │ does not fit yet: wait, at most ``wait_s`` in all, for other requests to release
                            │ still does not fit: ServerBusy (503, Retry-After)
                            │ larger than the whole budget: PayloadTooLarge (413)
                          release() once, when the request is over (its body is held until the reply has ended)

Each request body over ``server.max_body_bytes`` is refused anyway; this bounds their sum, so twenty clients
sending 30 MiB at once cannot hold 600 MiB (and their parsed copies) in kvgate. The decision is the pure function
``fits``; the budget only keeps the count and wakes waiters when bytes are released.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from gateway.errors import PayloadTooLarge, ServerBusy


def fits(held_bytes: int, capacity_bytes: int, more_bytes: int) -> bool:
    """Whether ``more_bytes`` can be held beside ``held_bytes`` within ``capacity_bytes``."""
    return held_bytes + more_bytes <= capacity_bytes


class BodyBudget:
    """Bytes of request bodies held now, against a capacity; waiters are woken whenever bytes are released."""

    def __init__(self, capacity_bytes: int, *, wait_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.wait_s = wait_s
        self.held_bytes = 0
        self._clock = clock
        self._released = asyncio.Event()

    def lease(self) -> BodyLease:
        """A lease for one request's body; release it when the request is over."""
        return BodyLease(self)

    def _try_take(self, n_bytes: int) -> bool:
        if not fits(self.held_bytes, self.capacity_bytes, n_bytes):
            return False
        self.held_bytes += n_bytes
        return True

    async def take(self, n_bytes: int, deadline_s: float) -> None:
        """Hold ``n_bytes`` more, waiting until ``deadline_s`` (on the budget's clock) for room."""
        while not self._try_take(n_bytes):
            left_s = deadline_s - self._clock()
            if left_s <= 0:
                raise ServerBusy(
                    f"kvgate holds {self.held_bytes:,} bytes of request bodies, its limit "
                    f"(server.max_held_body_bytes) is {self.capacity_bytes:,}, and this body needs {n_bytes:,} more; "
                    "try again shortly",
                    retry_after_s=max(1.0, self.wait_s),
                )
            self._released.clear()
            try:
                await asyncio.wait_for(self._released.wait(), timeout=left_s)
            except TimeoutError:
                continue

    def now_s(self) -> float:
        return self._clock()

    def give_back(self, n_bytes: int) -> None:
        self.held_bytes -= n_bytes
        self._released.set()


class BodyLease:
    """The bytes one request holds; ``take`` grows it, ``release`` gives all of them back (idempotent)."""

    def __init__(self, budget: BodyBudget) -> None:
        self._budget = budget
        self.held_bytes = 0
        self._deadline_s: float | None = None

    async def take(self, n_bytes: int) -> None:
        """Hold ``n_bytes`` more; waits at most the budget's ``wait_s`` over the whole lease."""
        if n_bytes <= 0:
            return
        budget = self._budget
        if self.held_bytes + n_bytes > budget.capacity_bytes:
            raise PayloadTooLarge(
                f"request body is over {budget.capacity_bytes:,} bytes, all kvgate holds for all requests together "
                "(server.max_held_body_bytes); send less"
            )
        if self._deadline_s is None:
            self._deadline_s = budget.now_s() + budget.wait_s
        await budget.take(n_bytes, self._deadline_s)
        self.held_bytes += n_bytes

    def release(self) -> None:
        if self.held_bytes:
            self._budget.give_back(self.held_bytes)
            self.held_bytes = 0
