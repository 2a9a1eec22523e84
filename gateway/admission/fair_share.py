"""Weighted fair queueing between tenants in one pool's queue: start-time fair queueing over reserved tokens.

Theory of operation
-------------------
Each pool keeps a *virtual time* ``V`` and, per tenant, the virtual time its last request will be done with,
``finish[t]``. A request of ``tokens`` (what it will reserve: prompt + output, times its sequences) from a tenant of
weight ``w`` is tagged when it arrives:

    start  = max(V, finish[t])          a tenant that was idle starts now; a busy one after its own backlog
    finish[t] = start + tokens / w      a weight of 2 moves its clock half as fast: twice the tokens per turn

The queue is ordered by ``(-priority, start, arrival)``: priorities stay strict above the fair order, and within
one priority the waiter with the lowest start tag goes first. When a request is served, ``V`` moves up to its start
tag. So a tenant that floods the queue with 200 long requests tags them ``V, V + c, V + 2c, ...``; a tenant that
sends one request now and then tags it ``V`` and goes ahead of all but the flood's head:

    weights flood 1, a 1, b 2; flood requests reserve 8,000 tokens, a's and b's 1,000
    queue:   flood@0  flood@8000  flood@16000  flood@24000 ...
    a sends at V = 8000:   a@8000       -> after flood@0 and flood@8000 (ties go by arrival), before the rest
    b, backlogged:         b@8000, b@8500, b@9000, ...: two of b's tokens for each of a's

Over any stretch in which a set of tenants stays backlogged, each is served in proportion to its weight within
about one request's tokens per tenant (the bound of start-time fair queueing, Goyal et al., 1996), whatever the
others send. A tenant asking less than its share gets all it asks, and its wait does not grow with the others'
backlogs: it waits for capacity, not for their queue. What the waiting room still adds is the head-of-line rule
(a pool-blocked head that has waited past ``overtake_window_s`` holds every freed token): fairness decides who is
next, not whether a big request may starve.

A request that leaves unserved (timeout, disconnect) gives its tag back when it is still its tenant's last, so a
tenant is not charged for work it never got. ``V`` and the tags only grow; floats stay exact far beyond any
uptime (2**53 tokens).

Pure: no clock, no I/O. The waiting room owns one ``FairClock`` per pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Tag:
    tenant: str
    start: float
    finish: float


@dataclass(slots=True)
class FairClock:
    """One pool's virtual time and the per-tenant finish tags; see the module docstring."""

    virtual: float = 0.0
    _finish: dict[str, float] = field(default_factory=dict)

    def tag(self, tenant: str, tokens: int, weight: float) -> Tag:
        """Tag a request on arrival and advance its tenant's finish time."""
        if weight <= 0:
            raise ValueError(f"weight is {weight}; it must be positive")
        start = max(self.virtual, self._finish.get(tenant, 0.0))
        finish = start + max(tokens, 1) / weight
        self._finish[tenant] = finish
        return Tag(tenant, start, finish)

    def served(self, tag: Tag) -> None:
        """A tagged request was admitted: virtual time moves up to its start."""
        self.virtual = max(self.virtual, tag.start)
        self._forget_idle()

    def withdrawn(self, tag: Tag) -> None:
        """A tagged request left unserved: give its tokens back when it was its tenant's last tag."""
        if self._finish.get(tag.tenant) == tag.finish:
            self._finish[tag.tenant] = tag.start
        self._forget_idle()

    def finish_of(self, tenant: str) -> float:
        return self._finish.get(tenant, 0.0)

    def _forget_idle(self) -> None:
        """A tenant whose finish is behind virtual time would restart at ``V`` anyway: drop it (bounded memory)."""
        if len(self._finish) > 64:
            self._finish = {t: f for t, f in self._finish.items() if f > self.virtual}
