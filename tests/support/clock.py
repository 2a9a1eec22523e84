"""One fake clock for the tests: a monotonic callable the test moves by hand, and a ``sleep`` that moves it.

Code under test that takes ``clock=`` gets the clock itself (or ``clock.monotonic``); code that takes ``sleep=`` gets
``clock.sleep``, which advances the clock by the requested time and yields to the loop once, so a retry loop with a
deadline runs to its end at once and deterministically.
"""

from __future__ import annotations

import asyncio


class FakeClock:
    """Seconds on a made-up monotonic clock; ``sleeps`` records every ``sleep`` the code under test asked for."""

    def __init__(self, now_s: float = 1000.0) -> None:
        self.now_s = now_s
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now_s

    def monotonic(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        assert seconds >= 0, "a monotonic clock never goes back"
        self.now_s += seconds

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(max(0.0, seconds))
        await asyncio.sleep(0)

    def __repr__(self) -> str:
        return f"FakeClock(now_s={self.now_s})"
