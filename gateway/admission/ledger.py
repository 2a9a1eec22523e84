"""The ledger: which sequences hold how many tokens of which pool, right now.

Theory of operation
-------------------
For every pool key (backend, model) the ledger keeps the live reservations, and four running totals derived from
them, so a snapshot costs no scan:

    pool ('gpu0', 'llama3.1:8b'):
        live:    { #1: 5,120 tokens 'ci' | #2: 2,048 tokens 'web' | #4: 900 tokens 'ci' }
        totals:  active_sequences = 3,  reserved_tokens = 8,068,  per_tenant_active = {'ci': 2, 'web': 1},
                 per_tenant_tokens = {'ci': 6,020, 'web': 2,048}

Guarantees:
- ``reserve`` always succeeds: it records, it does not decide. Whether a reservation fits is the planner's question,
  asked with a snapshot just before (the waiting room does both without yielding to the event loop in between).
- ``release`` frees a reservation exactly once. Releasing it again, or releasing one this ledger never issued, is a
  no-op that returns False, so the completion, error and disconnect paths may all call it without double-freeing.
- The totals always equal what the live reservations add up to, and none is negative; ``check_invariants`` asserts
  it with a full scan, which the tests run after every step (the request path does not pay for the scan).
  A pool with no live reservation is forgotten.

Single-threaded by design: no locks, no asyncio. The waiting room owns the only instance on the event loop.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from gateway.admission.types import LedgerSnapshot, PoolKey


@dataclass(frozen=True, slots=True)
class Reservation:
    """A request's hold on a pool: a ledger-unique id, the pool, the tokens it reserved, whose it is, and how many
    sequences it runs (OpenAI ``n``: one request, several completions)."""

    id: int
    key: PoolKey
    tokens: int
    tenant: str
    sequences: int = 1


@dataclass(slots=True)
class _Book:
    live: dict[int, Reservation] = field(default_factory=dict)
    reserved_tokens: int = 0
    active_sequences: int = 0
    per_tenant_active: Counter[str] = field(default_factory=Counter)
    per_tenant_tokens: Counter[str] = field(default_factory=Counter)

    def check(self) -> None:
        assert self.reserved_tokens >= 0, self.reserved_tokens
        assert self.reserved_tokens == sum(r.tokens for r in self.live.values()), (self.reserved_tokens, self.live)
        assert self.active_sequences == sum(r.sequences for r in self.live.values()), self.active_sequences
        tenants: Counter[str] = Counter()
        tokens: Counter[str] = Counter()
        for reservation in self.live.values():
            tenants[reservation.tenant] += reservation.sequences
            tokens[reservation.tenant] += reservation.tokens
        assert self.per_tenant_active == tenants, self.per_tenant_active
        assert dict(self.per_tenant_tokens) == dict(tokens), (self.per_tenant_tokens, tokens)
        assert all(count > 0 for count in self.per_tenant_active.values()), self.per_tenant_active


class Ledger:
    """Live reservations per pool key; see the module docstring for the guarantees."""

    def __init__(self) -> None:
        self._books: dict[PoolKey, _Book] = {}
        self._ids = itertools.count(1)

    def snapshot(self, key: PoolKey) -> LedgerSnapshot:
        book = self._books.get(key)
        if book is None:
            return LedgerSnapshot()
        return LedgerSnapshot(book.active_sequences, book.reserved_tokens, book.per_tenant_active,
                              book.per_tenant_tokens)

    def reserve(self, key: PoolKey, tokens: int, tenant: str, sequences: int = 1) -> Reservation:
        if tokens < 0 or sequences < 1:
            raise ValueError(f"a reservation of {tokens} tokens for {sequences} sequences; neither can be negative")
        key = PoolKey(*key)
        reservation = Reservation(next(self._ids), key, tokens, tenant, sequences)
        book = self._books.setdefault(key, _Book())
        book.live[reservation.id] = reservation
        book.reserved_tokens += tokens
        book.active_sequences += sequences
        book.per_tenant_active[tenant] += sequences
        book.per_tenant_tokens[tenant] += tokens
        return reservation

    def release(self, reservation: Reservation) -> bool:
        """Free the reservation; True the first time, False (and nothing changes) on every later call."""
        book = self._books.get(reservation.key)
        if book is None or book.live.get(reservation.id) is not reservation:
            return False
        del book.live[reservation.id]
        book.reserved_tokens -= reservation.tokens
        book.active_sequences -= reservation.sequences
        book.per_tenant_active[reservation.tenant] -= reservation.sequences
        book.per_tenant_tokens[reservation.tenant] -= reservation.tokens
        if book.per_tenant_active[reservation.tenant] == 0:
            del book.per_tenant_active[reservation.tenant]
            del book.per_tenant_tokens[reservation.tenant]
        if not book.live:
            del self._books[reservation.key]
        return True

    def resize(self, reservation: Reservation, tokens: int) -> Reservation | None:
        """The live reservation holding ``tokens`` instead (an elastic reply's growth): the new one, which replaces it
        (same id; release that one from now on), or None when it is not live."""
        book = self._books.get(reservation.key)
        if book is None or book.live.get(reservation.id) is not reservation:
            return None
        if tokens < 0:
            raise ValueError(f"a reservation of {tokens} tokens; it can't be negative")
        resized = Reservation(reservation.id, reservation.key, tokens, reservation.tenant, reservation.sequences)
        book.live[reservation.id] = resized
        book.reserved_tokens += tokens - reservation.tokens
        book.per_tenant_tokens[reservation.tenant] += tokens - reservation.tokens
        return resized

    def is_live(self, reservation: Reservation) -> bool:
        book = self._books.get(reservation.key)
        return book is not None and book.live.get(reservation.id) is reservation

    def keys(self) -> tuple[PoolKey, ...]:
        """Pools that hold at least one live reservation."""
        return tuple(self._books)

    def reservations(self, key: PoolKey) -> Iterator[Reservation]:
        """The live reservations of one pool, oldest first (for the status page)."""
        book = self._books.get(key)
        return iter(tuple(book.live.values()) if book else ())

    def check_invariants(self) -> None:
        for book in self._books.values():
            book.check()
            assert book.live, "an empty book should have been forgotten"
