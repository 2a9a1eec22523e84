"""What the waiting room exposes to metrics and the status page: queue lengths and waits per pool.

Its counters are the queue's own account of what it did (reservations made, plans it rejected, waiters it turned
away), not the outcome of requests: a chat whose first plan is rejected as too long may still be trimmed and
admitted by the admission step. Requests by outcome (admitted, trimmed, refused, ...) are counted once, where each
request ends (``gateway.observability.outcomes``).
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.admission.types import PoolKey


@dataclass(frozen=True, slots=True)
class WaiterView:
    """One queued request, as the status page shows it."""

    tenant: str
    priority: int
    waited_s: float
    reason: str


@dataclass(slots=True)
class QueueCounters:
    """Monotonic counters of one pool's queue (``kvgate_queue_wait_seconds_total`` reads its waits)."""

    admitted_total: int = 0
    admitted_after_wait_total: int = 0
    waited_s_total: float = 0.0
    max_waited_s: float = 0.0
    plan_rejections_total: int = 0
    """Plans the planner rejected (too long, too many sequences...): the caller may still trim and retry."""
    queue_full_total: int = 0
    timed_out_total: int = 0
    left_total: int = 0

    def count_wait(self, waited_s: float) -> None:
        self.admitted_after_wait_total += 1
        self.waited_s_total += waited_s
        self.max_waited_s = max(self.max_waited_s, waited_s)


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One pool's queue at one moment: who waits now, plus the counters since start."""

    key: PoolKey
    queued: int
    oldest_waited_s: float
    waiters: tuple[WaiterView, ...]
    admitted_total: int
    admitted_after_wait_total: int
    waited_s_total: float
    max_waited_s: float
    plan_rejections_total: int
    queue_full_total: int
    timed_out_total: int
    left_total: int

    @classmethod
    def of(cls, key: PoolKey, waiters: tuple[WaiterView, ...], counters: QueueCounters) -> QueueStats:
        oldest_s = max((w.waited_s for w in waiters), default=0.0)
        c = counters
        return cls(
            key, len(waiters), oldest_s, waiters, c.admitted_total, c.admitted_after_wait_total, c.waited_s_total,
            c.max_waited_s, c.plan_rejections_total, c.queue_full_total, c.timed_out_total, c.left_total,
        )  # fmt: skip
