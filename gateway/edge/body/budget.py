"""A bound on the request-body bytes kvgate holds at once, across all requests (``server.max_held_body_bytes``).

    request ──▶ lease ──▶ take(len(chunk)) as each chunk arrives (never the declared Content-Length up front)
                            │ fits: held_bytes += n
                            │ does not fit yet: wait, at most ``wait_s`` in all, for other requests to release
                            │   every holder waiting for room (none will release): the one holding most loses now
                            │ still does not fit: ServerBusy (503, Retry-After); the lease gives back what it held
                            │ larger than the whole budget: PayloadTooLarge (413)
                          release() once, when the request is over (its body is held until the reply has ended)

Each request body over ``server.max_body_bytes`` is refused anyway; this bounds their sum, so twenty clients
sending 30 MiB at once cannot hold 600 MiB (and their parsed copies) in kvgate. Bytes are taken as they arrive, so
a client that declares 32 MiB and sends one byte holds one byte, not a quarter of the budget. Taken that way,
bodies part-read can all wait for each other's room: when every lease that holds bytes is waiting, none will
release, and the waiter holding the most is refused at once (its bytes go back; the others go on). The decisions
are the pure functions ``fits`` and ``victim``; the budget only keeps the count and wakes waiters.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection

from gateway.errors import PayloadTooLarge, ServerBusy


def fits(held_bytes: int, capacity_bytes: int, more_bytes: int) -> bool:
    """Whether ``more_bytes`` can be held beside ``held_bytes`` within ``capacity_bytes``."""
    return held_bytes + more_bytes <= capacity_bytes


def victim(held_bytes: int, waiting: Collection[BodyLease]) -> BodyLease | None:
    """The waiter to refuse when every byte held is held by a waiter (nothing in flight will release): the one
    holding the most. None while some holder is not waiting."""
    if not waiting or sum(lease.held_bytes for lease in waiting) < held_bytes:
        return None
    return max(waiting, key=lambda lease: lease.held_bytes)


class BodyBudget:
    """Bytes of request bodies held now, against a capacity; waiters are woken whenever bytes are released."""

    def __init__(self, capacity_bytes: int, *, wait_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.wait_s = wait_s
        self.held_bytes = 0
        self._clock = clock
        self._waiting: dict[BodyLease, asyncio.Future[None]] = {}

    def lease(self) -> BodyLease:
        """A lease for one request's body; release it when the request is over."""
        return BodyLease(self)

    def _try_take(self, n_bytes: int) -> bool:
        if not fits(self.held_bytes, self.capacity_bytes, n_bytes):
            return False
        self.held_bytes += n_bytes
        return True

    def _busy(self, n_bytes: int) -> ServerBusy:
        return ServerBusy(
            f"kvgate holds {self.held_bytes:,} bytes of request bodies, its limit (server.max_held_body_bytes) is "
            f"{self.capacity_bytes:,}, and this body needs {n_bytes:,} more; try again shortly",
            retry_after_s=max(1.0, self.wait_s),
        )

    async def take(self, lease: BodyLease, n_bytes: int, deadline_s: float) -> None:
        """Hold ``n_bytes`` more for ``lease``, waiting until ``deadline_s`` (on the budget's clock) for room."""
        while not self._try_take(n_bytes):
            if lease.wounded:
                raise self._busy(n_bytes)
            wake = asyncio.get_running_loop().create_future()
            self._waiting[lease] = wake
            loser = victim(self.held_bytes, self._waiting.keys())
            left_s = deadline_s - self._clock()
            if loser is lease or left_s <= 0:
                del self._waiting[lease]
                raise self._busy(n_bytes)
            if loser is not None:
                loser.wounded = True
                self._wake(loser)
            try:
                await asyncio.wait_for(wake, timeout=left_s)
            except TimeoutError:
                continue
            finally:
                self._waiting.pop(lease, None)

    def _wake(self, lease: BodyLease) -> None:
        wake = self._waiting.get(lease)
        if wake is not None and not wake.done():
            wake.set_result(None)

    def now_s(self) -> float:
        return self._clock()

    def give_back(self, n_bytes: int) -> None:
        self.held_bytes -= n_bytes
        for lease in list(self._waiting):
            self._wake(lease)


class BodyLease:
    """The bytes one request holds; ``take`` grows it, ``release`` gives all of them back (idempotent)."""

    def __init__(self, budget: BodyBudget) -> None:
        self._budget = budget
        self.held_bytes = 0
        self.wounded = False
        """Set when this lease was chosen to lose a wait every holder was in: its next take is refused."""
        self._deadline_s: float | None = None

    async def take(self, n_bytes: int) -> None:
        """Hold ``n_bytes`` more; waits at most the budget's ``wait_s`` over the whole lease. Refused (ServerBusy),
        the lease gives back all it held: the body will not be read further."""
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
        try:
            await budget.take(self, n_bytes, self._deadline_s)
        except ServerBusy:
            self.release()
            raise
        self.held_bytes += n_bytes

    def release(self) -> None:
        if self.held_bytes:
            self._budget.give_back(self.held_bytes)
            self.held_bytes = 0
