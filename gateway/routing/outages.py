"""Backends taken out after a failure: for ``down_s``, doubling while they keep failing, up to ``max_down_s``.

A backend that refuses or drops the connection, or does not answer in time, is out until ``out_until_s``; the router
ranks it last (used only when nothing else is left). When the time has passed it is back in; a request that
succeeds there clears its record, one that fails takes it out again for twice as long (capped). The clock is
injected; nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class Outage:
    """One backend's failures in a row, when it is back in, and the last failure's message."""

    failures: int
    out_until_s: float
    reason: str
    failed_at_s: float


class Outages:
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._book: dict[str, Outage] = {}
        self.outages_total: dict[str, int] = {}
        """Per backend: how many times it was taken out (for the metrics)."""

    def failed(self, backend: str, reason: str, *, down_s: float, max_down_s: float) -> float:
        """Take ``backend`` out; returns for how many seconds."""
        previous = self._book.get(backend)
        failures = 1 if previous is None else previous.failures + 1
        out_for_s: float = min(down_s * 2.0 ** min(failures - 1, 30), max(down_s, max_down_s))
        now_s = self._clock()
        self._book[backend] = Outage(failures, now_s + out_for_s, reason, now_s)
        self.outages_total[backend] = self.outages_total.get(backend, 0) + 1
        return out_for_s

    def succeeded(self, backend: str, *, since_s: float) -> None:
        """A request that began at ``since_s`` succeeded: the record goes when it began after the last failure (one
        that began before may have been answered before the backend failed)."""
        outage = self._book.get(backend)
        if outage is not None and since_s > outage.failed_at_s:
            del self._book[backend]

    def is_out(self, backend: str) -> bool:
        outage = self._book.get(backend)
        return outage is not None and self._clock() < outage.out_until_s

    def out_until(self, backend: str) -> float | None:
        """When the backend is back in (the clock's time), None when it is in now."""
        outage = self._book.get(backend)
        return outage.out_until_s if outage is not None and self._clock() < outage.out_until_s else None

    def current(self) -> dict[str, Outage]:
        """The backends out now."""
        now_s = self._clock()
        return {name: outage for name, outage in self._book.items() if now_s < outage.out_until_s}
