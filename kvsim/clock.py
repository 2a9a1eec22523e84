"""Time for the simulator: a clock that can run faster than the wall clock, so tests finish quickly.

Everything the simulator times (load time, prompt and generation speed, keep_alive, ``expires_at``,
``*_duration`` fields) reads this clock. ``ScaledClock(100)`` makes one real second count as 100 simulated
seconds: ``sleep(5)`` returns after 50 ms and ``now()`` has advanced by 5.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Simulated monotonic seconds."""
        ...

    def wall(self) -> datetime:
        """Simulated wall-clock time (UTC)."""
        ...

    async def sleep(self, seconds: float) -> None: ...

    def granularity(self) -> float:
        """Simulated seconds worth sleeping for (shorter waits are batched, not slept)."""
        ...


class ScaledClock:
    def __init__(self, speedup: float = 1.0) -> None:
        if speedup <= 0:
            raise ValueError(f"clock speedup must be > 0, got {speedup}")
        self.speedup = speedup
        self._real0 = time.monotonic()
        self._wall0 = datetime.now(UTC)

    def now(self) -> float:
        return (time.monotonic() - self._real0) * self.speedup

    def wall(self) -> datetime:
        return self._wall0 + timedelta(seconds=self.now())

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(seconds, 0.0) / self.speedup)

    def granularity(self) -> float:
        return 0.002 * self.speedup


def go_time(moment: datetime) -> str:
    """Go's ``time.Time`` JSON form (RFC 3339 with trailing zeros of the fraction dropped), in UTC."""
    moment = moment.astimezone(UTC)
    base = moment.strftime("%Y-%m-%dT%H:%M:%S")
    frac = f"{moment.microsecond:06d}".rstrip("0")
    return f"{base}.{frac}Z" if frac else f"{base}Z"
