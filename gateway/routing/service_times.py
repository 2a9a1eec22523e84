"""How long a request holds its slot, per pool: what routing multiplies the requests ahead by (rank.py).

Each request that was admitted and answered (status 200) adds the seconds from its admission to its release (its
whole answer, streamed or not). A pool's service time is the median of its last ``WINDOW`` (a moving median: one
slow answer does not move it, a change of load does within a few). A pool with none yet borrows the median of the
same model's pools on other backends; before any, the router uses ``routing.default_service_s``. No I/O, no clock.
"""

from __future__ import annotations

from collections import deque
from statistics import median

WINDOW = 32


class ServiceTimes:
    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], deque[float]] = {}

    def record(self, backend: str, model: str, seconds: float) -> None:
        if seconds >= 0:
            self._seen.setdefault((backend, model), deque(maxlen=WINDOW)).append(seconds)

    def expected_s(self, backend: str, model: str) -> float | None:
        """The pool's median (else the same model's elsewhere); None before any request was served."""
        here = self._seen.get((backend, model))
        if here:
            return median(here)
        elsewhere = [t for (_, other), times in self._seen.items() if other == model for t in times]
        return median(elsewhere) if elsewhere else None

    def count(self, backend: str, model: str) -> int:
        return len(self._seen.get((backend, model), ()))
