"""The shared ledger's Redis scripts against a real redis-server: two replicas (two stores) on one pool."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gateway.admission.ledger import Ledger
from gateway.admission.rates import RateLimit
from gateway.admission.shared.store import Limits, SharedStore
from gateway.admission.types import PoolKey

KEY = PoolKey("gpu0", "llama3.1:8b")
UNIFIED = Limits(slots=4, pool_tokens=10_000, tenant_max_active=None, tenant_share_tokens=None)


@pytest.fixture
async def two(redis_url: str) -> AsyncIterator[list[SharedStore]]:
    """Two replicas' stores on one Redis."""
    made = [SharedStore.from_url(redis_url, prefix="t", timeout_s=1.0) for _ in range(2)]
    yield made
    for store in made:
        await store.close()


async def test_the_reserve_script_applies_the_planners_rules_across_replicas(two: list[SharedStore]) -> None:
    a, b = two
    ledger_a, ledger_b = Ledger(), Ledger()
    rows = []

    async def reserve(store: SharedStore, ledger: Ledger, tokens: int, tenant: str, limits: Limits) -> str:
        answer = await store.reserve(ledger.reserve(KEY, tokens, tenant), limits, ttl_s=10)
        rows.append(f"  {store.replica[:4]} {tenant:<4} {tokens:>6,} -> {answer.verdict:<13} pool now "
                    f"{answer.totals.reserved_tokens:>6,} tokens, {answer.totals.active_sequences} seqs")
        return answer.verdict

    capped = Limits(slots=4, pool_tokens=10_000, tenant_max_active=2, tenant_share_tokens=7_000)
    assert await reserve(a, ledger_a, 6_000, "ci", UNIFIED) == "ok"
    assert await reserve(b, ledger_b, 5_000, "web", UNIFIED) == "tokens"  # 11,000 > 10,000 across replicas
    assert await reserve(b, ledger_b, 4_000, "web", UNIFIED) == "ok"
    assert await reserve(b, ledger_b, 1_500, "ci", capped) == "tenant_share"  # ci: 6,000 + 1,500 > 7,000
    assert await reserve(a, ledger_a, 0, "ci", capped) == "ok"
    assert await reserve(b, ledger_b, 0, "ci", capped) == "tenant_active"  # ci already runs 2
    assert await reserve(b, ledger_b, 0, "web", UNIFIED) == "ok"
    assert await reserve(a, ledger_a, 0, "x", UNIFIED) == "slots"  # 4 of 4 slots
    print("\n" + "\n".join(rows))
    totals = (await a.totals(KEY)).totals
    assert (totals.reserved_tokens, totals.active_sequences) == (10_000, 4)
    assert dict(totals.per_tenant_active) == {"ci": 2, "web": 2}


async def test_a_release_frees_once_and_a_dead_replicas_leases_expire(two: list[SharedStore]) -> None:
    a, b = two
    ledger = Ledger()
    held = ledger.reserve(KEY, 3_000, "ci")
    assert (await a.reserve(held, UNIFIED, ttl_s=10)).verdict == "ok"
    first, again = await a.release(held), await a.release(held)
    assert (first.verdict, again.verdict, again.totals.reserved_tokens) == ("1", "0", 0)
    dying = ledger.reserve(KEY, 8_000, "ci")
    assert (await a.reserve(dying, UNIFIED, ttl_s=0.3)).verdict == "ok"  # replica a then stops renewing
    blocked = Ledger().reserve(KEY, 5_000, "web")
    assert (await b.reserve(blocked, UNIFIED, ttl_s=10)).verdict == "tokens"
    await asyncio.sleep(0.4)
    answer = await b.reserve(blocked, UNIFIED, ttl_s=10)
    assert (answer.verdict, answer.expired, answer.totals.reserved_tokens) == ("ok", 1, 5_000)


async def test_a_renewal_keeps_a_lease_alive_and_adds_back_one_that_expired(two: list[SharedStore]) -> None:
    a = two[0]
    ledger = Ledger()
    live = ledger.reserve(KEY, 2_000, "ci")
    assert (await a.reserve(live, UNIFIED, ttl_s=0.3)).verdict == "ok"
    for _ in range(3):
        await asyncio.sleep(0.15)
        assert (await a.renew(KEY, [live], ttl_s=0.3)).verdict == "0"  # renewed in time: nothing to add back
    await asyncio.sleep(0.4)
    assert (await a.totals(KEY)).totals.reserved_tokens == 0  # expired: cut off for longer than the ttl
    answer = await a.renew(KEY, [live], ttl_s=0.3)
    assert (answer.verdict, answer.totals.reserved_tokens) == ("1", 2_000)  # still running: counted again


async def test_the_queue_holds_at_most_max_queue_across_replicas(two: list[SharedStore]) -> None:
    a, b = two
    assert await a.join_queue(KEY, "1", max_queue=2, ttl_s=10) == (True, 1)
    assert await b.join_queue(KEY, "1", max_queue=2, ttl_s=10) == (True, 2)  # another replica's waiter 1
    assert await b.join_queue(KEY, "2", max_queue=2, ttl_s=10) == (False, 2)
    await a.leave_queue(KEY, "1")
    assert await b.join_queue(KEY, "2", max_queue=2, ttl_s=10) == (True, 2)


async def test_rate_buckets_are_shared_and_say_when_to_retry(two: list[SharedStore]) -> None:
    a, b = two
    limit = RateLimit(tokens_per_minute=6_000, requests_per_minute=3)
    assert await a.take_rate("ci", limit, 2_000) is None
    assert await b.take_rate("ci", limit, 2_000) is None
    refused = await a.take_rate("ci", limit, 3_000)  # 2,000 left across both replicas
    assert refused is not None and "6,000 tokens per minute" in refused.reason
    assert refused.retry_after_s == pytest.approx(10.0, abs=0.5)  # 1,000 tokens at 100 per second
    assert await b.take_rate("ci", limit, 1_000) is None  # the third request
    refused = await b.take_rate("ci", limit, 1)
    assert refused is not None and "3 requests per minute" in refused.reason
    never = await a.take_rate("web", RateLimit(tokens_per_minute=100), 500)
    assert never is not None and never.retry_after_s == float("inf")
    await a.settle_rate("ci", limit, 5_000)  # output settles later, and may go below zero
    refused = await a.take_rate("ci", RateLimit(tokens_per_minute=6_000), 1)
    assert refused is not None and refused.retry_after_s > 30


async def test_the_store_never_shows_the_redis_password(redis_url: str) -> None:
    store = SharedStore.from_url(redis_url.replace("redis://", "redis://:s3cret-pass@"), prefix="t", timeout_s=1.0)
    assert "s3cret" not in repr(store)
    await store.close()


async def test_a_long_waiting_request_keeps_its_room_across_replicas(two: list[SharedStore]) -> None:
    """Replica a's request for 8,000 tokens has waited past the overtake window: replica b may still take what
    leaves 8,000 free (2,000), not more; the waiter itself then gets its room."""
    a, b = two
    assert await a.join_queue(KEY, "7", max_queue=10, ttl_s=10, tokens=8_000, sequences=1) == (True, 1)
    await asyncio.sleep(0.05)
    ledger_b = Ledger()
    small = await b.reserve(ledger_b.reserve(KEY, 2_000, "web"), UNIFIED, ttl_s=10, overtake_s=0.01)
    big = await b.reserve(ledger_b.reserve(KEY, 3_000, "web"), UNIFIED, ttl_s=10, overtake_s=0.01)
    early = await b.reserve(ledger_b.reserve(KEY, 3_000, "web"), UNIFIED, ttl_s=10, overtake_s=60)  # within window
    head = await a.reserve(Ledger().reserve(KEY, 5_000, "ci"), UNIFIED, ttl_s=10, waiter="7", overtake_s=0.01)
    print(f"\n  b 2,000 -> {small.verdict}; b 3,000 -> {big.verdict}; b 3,000 (window 60 s) -> {early.verdict}; "
          f"the waiter -> {head.verdict}")
    assert (small.verdict, big.verdict, early.verdict, head.verdict) == ("ok", "behind", "ok", "ok")
    await a.leave_queue(KEY, "7")
    after = await b.reserve(ledger_b.reserve(KEY, 0, "web"), UNIFIED, ttl_s=10, overtake_s=0.01)
    assert after.verdict == "ok"  # the head left: nothing is kept back


async def test_a_dead_replicas_waiter_stops_holding_room_when_its_place_expires(two: list[SharedStore]) -> None:
    a, b = two
    assert (await a.join_queue(KEY, "1", max_queue=10, ttl_s=0.2, tokens=9_000, sequences=1))[0]
    await asyncio.sleep(0.05)
    blocked = await b.reserve(Ledger().reserve(KEY, 5_000, "web"), UNIFIED, ttl_s=10, overtake_s=0.01)
    assert blocked.verdict == "behind"
    await asyncio.sleep(0.25)  # replica a stopped touching its waiter's place
    assert (await b.reserve(Ledger().reserve(KEY, 5_000, "web"), UNIFIED, ttl_s=10, overtake_s=0.01)).verdict == "ok"
