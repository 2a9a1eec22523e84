"""Pure arithmetic on pool snapshots for the shared ledger: the planner's limits for the reserve script, sums and
differences of snapshots, what a replica assumes of the others while Redis is away (``known_share_others`` until their
leases may have ended, then ``local_share_others``), and whether a pool has more room."""

from __future__ import annotations

from collections import Counter

from gateway.admission.planner import tenant_share_tokens
from gateway.admission.shared.store import Limits
from gateway.admission.types import LedgerSnapshot, Policy, PoolSpec


def limits_for(pool: PoolSpec, policy: Policy) -> Limits:
    """The planner's capacity rules for one pool and policy, for the reserve script to check across replicas."""
    return Limits(pool.slots, pool.pool_tokens if pool.unified else None, policy.per_tenant_max_active,
                  tenant_share_tokens(policy.per_tenant_max_share, pool))


def combine(a: LedgerSnapshot, b: LedgerSnapshot, sign: int = 1) -> LedgerSnapshot:
    """``a + b`` (or ``a - b`` with ``sign=-1``), never below zero."""
    active, tokens = Counter(a.per_tenant_active), Counter(a.per_tenant_tokens)
    for tenant, count in b.per_tenant_active.items():
        active[tenant] += sign * count
    for tenant, count in b.per_tenant_tokens.items():
        tokens[tenant] += sign * count
    return LedgerSnapshot(
        max(0, a.active_sequences + sign * b.active_sequences), max(0, a.reserved_tokens + sign * b.reserved_tokens),
        {t: n for t, n in active.items() if n > 0}, {t: n for t, n in tokens.items() if n > 0},
    )


def local_share_others(pool: PoolSpec, replicas: int) -> LedgerSnapshot:
    """What the other replicas are assumed to hold while Redis is unreachable: all but this replica's share."""
    mine_slots = max(1, pool.slots // replicas)
    mine_tokens = pool.pool_tokens // replicas if pool.unified else pool.pool_tokens
    return LedgerSnapshot(pool.slots - mine_slots, pool.pool_tokens - mine_tokens if pool.unified else 0)


def whole_pool(pool: PoolSpec) -> LedgerSnapshot:
    """Every slot and cell of the pool held: what others may hold in a pool whose totals were never read."""
    return LedgerSnapshot(pool.slots, pool.pool_tokens if pool.unified else 0)


def known_share_others(pool: PoolSpec, replicas: int, others: LedgerSnapshot, mine: LedgerSnapshot) -> LedgerSnapshot:
    """What the other replicas are assumed to hold while Redis is unreachable and their leases may still run:
    what they were last known to hold (``others``, from the last read or announcement before Redis went away), plus
    all but this replica's 1/replicas of the room that was free then (each replica admits only into its part of it),
    and never less than ``local_share_others``. ``mine``: what this replica held then."""
    synthetic = local_share_others(pool, replicas)
    free_slots = max(0, pool.slots - others.active_sequences - mine.active_sequences)
    slots = max(synthetic.active_sequences, pool.slots - mine.active_sequences - free_slots // replicas)
    if not pool.unified:
        return LedgerSnapshot(min(pool.slots, slots), 0)
    free_tokens = max(0, pool.pool_tokens - others.reserved_tokens - mine.reserved_tokens)
    tokens = max(synthetic.reserved_tokens, pool.pool_tokens - mine.reserved_tokens - free_tokens // replicas)
    return LedgerSnapshot(min(pool.slots, slots), min(pool.pool_tokens, tokens))


def freed(before: LedgerSnapshot, now: LedgerSnapshot) -> bool:
    """Whether a pool has more room than before: fewer sequences or tokens held, in all or by some tenant."""
    return (now.active_sequences < before.active_sequences or now.reserved_tokens < before.reserved_tokens
            or any(now.per_tenant_active.get(t, 0) < n for t, n in before.per_tenant_active.items()))
