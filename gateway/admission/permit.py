"""A permit: an admitted request's reservation, released exactly once however the request ends.

Like TGI's concurrency permit, it travels with the response: the proxy holds it while it streams and releases it
when the stream completes, fails or the client disconnects, whichever comes first; later calls do nothing.

    with await room.acquire(key, pool, cost, policy, is_disconnected=...) as permit:
        forward(rewrite(body, permit.admit.rewrites))
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType

from gateway.admission.ledger import Reservation
from gateway.admission.types import Admit


class Permit:
    """Holds one reservation; ``release()`` frees it the first time and is a no-op afterwards."""

    __slots__ = ("_release", "_released", "admit", "reservation", "waited_s")

    def __init__(
        self, reservation: Reservation, admit: Admit, waited_s: float, release: Callable[[Reservation], bool]
    ) -> None:
        self.reservation = reservation
        self.admit = admit
        self.waited_s = waited_s
        self._release = release
        self._released = False

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> bool:
        """Free the reservation; True only on the call that actually freed it."""
        if self._released:
            return False
        self._released = True
        return self._release(self.reservation)

    def __enter__(self) -> Permit:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    async def __aenter__(self) -> Permit:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        return f"<Permit #{self.reservation.id} {self.reservation.tokens} tokens {state}>"
