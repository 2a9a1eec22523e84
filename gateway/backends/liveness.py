"""Whether a backend is up: when it last answered anything, kept in one place per backend (its ``BackendClient``).

A backend is *up* while it answered any call or request (a probe, a count, a forwarded request; any HTTP status)
within the last ``restart_wait_s`` (``admission.probe_wait_s``). That one fact decides what a refused connection
means, for every call kvgate makes to the backend:

    refused, and up within restart_wait_s      a restart: the call is tried again (pauses growing from
                                               RETRY_FIRST_S to RETRY_MAX_S) until the backend accepts it or
                                               restart_wait_s have passed since the first refusal
    refused, and not up (never, or longer ago)  it is down: the refusal stands at once (a 502 naming the backend),
                                               as a reverse proxy answers for a dead upstream

No I/O here: the clock and the sleep are the caller's (``BackendClient`` passes its own).
"""

from __future__ import annotations

import time
from collections.abc import Callable

RETRY_FIRST_S = 0.1
RETRY_MAX_S = 1.0


class Liveness:
    """When one backend last answered, by the injected clock; ``None`` until it first does."""

    def __init__(self, restart_wait_s: float = 0.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.restart_wait_s = restart_wait_s
        self._clock = clock
        self.answered_at_s: float | None = None

    def answered(self) -> None:
        """The backend answered a call or a request now (with any status)."""
        self.answered_at_s = self._clock()

    def up(self, within_s: float | None = None) -> bool:
        """Whether it answered within the last ``within_s`` (default ``restart_wait_s``)."""
        window_s = self.restart_wait_s if within_s is None else within_s
        return self.answered_at_s is not None and self._clock() - self.answered_at_s <= window_s

    def describe(self) -> str:
        """For a refusal's message: when it last answered."""
        if self.answered_at_s is None:
            return "it has not answered kvgate since kvgate started"
        return f"it last answered {self._clock() - self.answered_at_s:.1f} s ago"
