"""Fencing, the pure part: which of this replica's leases must end now because they may soon expire unrenewed.

A lease in Redis lives ``lease_ttl_s`` past the call that last set its expiry (a commit or a renewal). A replica that
can no longer renew it (Redis down, paused, or this replica cut off from it) does not know whether it has expired, but
it knows when it may: the other replicas will then plan as if its request had ended. So the request must end first:

    commit/renewal sent ──────────── lease_ttl_s ────────────▶ the lease may expire in Redis
                        ◀──────── fenced at ────────▶│◀ fence_margin_s ▶│

The deadline counts from when the call was *sent*, on this replica's monotonic clock: Redis sets the expiry when the
script runs, later, so the lease expires no earlier than the deadline plus the margin. ``FenceBook`` keeps one such
time per lease and answers which are due at a time; ``SharedPools`` ends their requests (``FenceSignal``) and does the
I/O. A lease admitted while Redis was unreachable (``local_share``) has no deadline: it is not in Redis at all, and
comes back only through the capacity-checked commit once Redis answers (or its request is fenced then).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(slots=True)
class FenceBook:
    """Lease id -> when its expiry was last set (seconds, this replica's monotonic clock); see the module docstring."""

    lease_ttl_s: float
    fence_margin_s: float
    _confirmed_s: dict[int, float] = field(default_factory=dict)

    def confirm(self, ids: Iterable[int], sent_s: float) -> None:
        """The call sent at ``sent_s`` set these leases' expiry in Redis (a commit or a renewal answered)."""
        for lease in ids:
            if self._confirmed_s.get(lease, -1.0) < sent_s:
                self._confirmed_s[lease] = sent_s

    def forget(self, lease: int) -> None:
        """The lease ended (released or fenced): no deadline any more."""
        self._confirmed_s.pop(lease, None)

    def deadline_s(self, lease: int) -> float | None:
        """When the lease's request must have ended, or None for a lease with no expiry in Redis."""
        confirmed_s = self._confirmed_s.get(lease)
        return None if confirmed_s is None else confirmed_s + self.lease_ttl_s - self.fence_margin_s

    def due(self, now_s: float) -> list[int]:
        """The leases whose deadline has come at ``now_s``, earliest first."""
        due = [(self.deadline_s(lease) or 0.0, lease) for lease in self._confirmed_s]
        return [lease for deadline_s, lease in sorted(due) if deadline_s <= now_s]

    def next_deadline_s(self) -> float | None:
        """The earliest deadline of any lease, or None when no lease has one."""
        if not self._confirmed_s:
            return None
        return min(self._confirmed_s.values()) + self.lease_ttl_s - self.fence_margin_s

    def __contains__(self, lease: object) -> bool:
        return lease in self._confirmed_s

    def __len__(self) -> int:
        return len(self._confirmed_s)
