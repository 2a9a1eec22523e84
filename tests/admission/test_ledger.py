"""The ledger's bookkeeping: totals, exactly-once release, and invariants under any sequence of steps."""

from __future__ import annotations

import random

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from gateway.admission import Ledger, LedgerSnapshot, PoolKey, Reservation

GPU0 = PoolKey("gpu0", "llama3.1:8b")
GPU1 = PoolKey("gpu1", "qwen2.5:7b")


def test_an_unknown_pool_is_empty() -> None:
    assert Ledger().snapshot(GPU0) == LedgerSnapshot(0, 0, {})


def test_reserve_adds_to_the_totals_of_its_pool_only() -> None:
    ledger = Ledger()
    ledger.reserve(GPU0, 5120, "ci")
    ledger.reserve(GPU0, 2048, "web")
    ledger.reserve(GPU0, 900, "ci")
    ledger.reserve(GPU1, 7, "ci")
    snapshot = ledger.snapshot(GPU0)
    assert (snapshot.active_sequences, snapshot.reserved_tokens) == (3, 8068)
    assert dict(snapshot.per_tenant_active) == {"ci": 2, "web": 1}
    assert ledger.snapshot(GPU1).reserved_tokens == 7


def test_release_is_exactly_once() -> None:
    ledger = Ledger()
    kept = ledger.reserve(GPU0, 100, "a")
    gone = ledger.reserve(GPU0, 40, "a")
    assert ledger.release(gone) is True
    assert ledger.release(gone) is False
    assert ledger.snapshot(GPU0) == LedgerSnapshot(1, 100, {"a": 1}, {"a": 100})
    assert ledger.is_live(kept) and not ledger.is_live(gone)


def test_a_released_pool_is_forgotten_and_a_late_release_stays_a_no_op() -> None:
    ledger = Ledger()
    first = ledger.reserve(GPU0, 100, "a")
    assert ledger.release(first)
    assert ledger.keys() == ()
    ledger.reserve(GPU0, 50, "a")
    assert ledger.release(first) is False
    assert ledger.snapshot(GPU0).reserved_tokens == 50


def test_a_reservation_from_another_ledger_is_not_freed() -> None:
    ours, theirs = Ledger(), Ledger()
    ours.reserve(GPU0, 100, "a")
    foreign = theirs.reserve(GPU0, 100, "a")  # same id, same key, not ours
    assert ours.release(foreign) is False
    assert ours.snapshot(GPU0).reserved_tokens == 100


def test_a_snapshot_does_not_change_afterwards() -> None:
    ledger = Ledger()
    ledger.reserve(GPU0, 10, "a")
    snapshot = ledger.snapshot(GPU0)
    ledger.reserve(GPU0, 10, "a")
    assert snapshot.per_tenant_active["a"] == 1
    with pytest.raises(TypeError):
        snapshot.per_tenant_active["a"] = 5  # type: ignore[index]


def test_plain_tuples_name_the_same_pool() -> None:
    ledger = Ledger()
    reservation = ledger.reserve(("gpu0", "llama3.1:8b"), 10, "a")  # type: ignore[arg-type]
    assert reservation.key == GPU0 and ledger.snapshot(GPU0).active_sequences == 1


def test_negative_reservations_are_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        Ledger().reserve(GPU0, -1, "a")


def test_reservations_lists_live_ones_oldest_first() -> None:
    ledger = Ledger()
    first, second, third = (ledger.reserve(GPU0, n, "a") for n in (1, 2, 3))
    ledger.release(second)
    assert list(ledger.reservations(GPU0)) == [first, third]
    assert list(ledger.reservations(GPU1)) == []


def test_a_random_walk_keeps_the_totals_equal_to_the_live_reservations() -> None:
    rng = random.Random(7)
    ledger = Ledger()
    handed_out: list[Reservation] = []
    live: set[int] = set()
    for _ in range(2000):
        if handed_out and rng.random() < 0.45:
            victim = rng.choice(handed_out)
            assert ledger.release(victim) == (victim.id in live)
            live.discard(victim.id)
        else:
            reservation = ledger.reserve(rng.choice([GPU0, GPU1]), rng.randrange(0, 9000), rng.choice("xyz"))
            handed_out.append(reservation)
            live.add(reservation.id)
        ledger.check_invariants()
    for key in (GPU0, GPU1):
        mine = [r for r in handed_out if r.id in live and r.key == key]
        assert ledger.snapshot(key).reserved_tokens == sum(r.tokens for r in mine)


class LedgerMachine(RuleBasedStateMachine):
    """Any interleaving of reserve and release (including repeats) keeps the ledger equal to a plain model."""

    reservations = Bundle("reservations")

    def __init__(self) -> None:
        super().__init__()
        self.ledger = Ledger()
        self.model: dict[int, Reservation] = {}

    @rule(
        target=reservations,
        key=st.sampled_from([GPU0, GPU1]),
        tokens=st.integers(0, 10_000),
        tenant=st.sampled_from(["a", "b", "c"]),
    )
    def reserve(self, key: PoolKey, tokens: int, tenant: str) -> Reservation:
        reservation = self.ledger.reserve(key, tokens, tenant)
        assert reservation.id not in self.model
        self.model[reservation.id] = reservation
        return reservation

    @rule(reservation=reservations)
    def release(self, reservation: Reservation) -> None:
        was_live = self.model.pop(reservation.id, None) is not None
        assert self.ledger.release(reservation) == was_live

    @invariant()
    def totals_match_the_model(self) -> None:
        self.ledger.check_invariants()
        for key in (GPU0, GPU1):
            live = [r for r in self.model.values() if r.key == key]
            per_tenant: dict[str, int] = {}
            per_tenant_tokens: dict[str, int] = {}
            for r in live:
                per_tenant[r.tenant] = per_tenant.get(r.tenant, 0) + 1
                per_tenant_tokens[r.tenant] = per_tenant_tokens.get(r.tenant, 0) + r.tokens
            assert self.ledger.snapshot(key) == LedgerSnapshot(len(live), sum(r.tokens for r in live), per_tenant,
                                                               per_tenant_tokens)


TestLedgerMachine = LedgerMachine.TestCase
TestLedgerMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
