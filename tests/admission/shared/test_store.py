"""The shared ledger's Redis scripts against a real redis-server: two replicas (two stores) on one pool."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.admission.ledger import Ledger, Reservation
from gateway.admission.rates import RateLimit
from gateway.admission.shared.store import Answer, Limits, Place, SharedStore, Turn, announcement
from gateway.admission.types import PoolKey
from tests.support.llama_server import free_port
from tests.support.poll import until
from tests.support.redis_server import running_redis

KEY = PoolKey("gpu0", "llama3.1:8b")
UNIFIED = Limits(slots=4, pool_tokens=10_000, tenant_max_active=None, tenant_share_tokens=None)
POLL_S = 0.05
"""How often a test asks Redis again while it waits for a lease or a place to lapse."""


async def _admitted(store: SharedStore, ask: Reservation, ttl_s: float, overtake_s: float = 5.0) -> Answer | None:
    """``store.reserve``'s answer when it is ``ok``, else None (a refusal changes nothing in Redis)."""
    answer = await store.reserve(ask, UNIFIED, ttl_s, Turn(overtake_s=overtake_s))
    return answer if answer.verdict == "ok" else None


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
    first, again = await a.release(held.key, [held]), await a.release(held.key, [held])
    assert (first.verdict, again.verdict, again.totals.reserved_tokens) == ("1", "0", 0)
    dying = ledger.reserve(KEY, 8_000, "ci")
    assert (await a.reserve(dying, UNIFIED, ttl_s=0.3)).verdict == "ok"  # replica a then stops renewing
    blocked = Ledger().reserve(KEY, 5_000, "web")
    assert (await b.reserve(blocked, UNIFIED, ttl_s=10)).verdict == "tokens"

    async def dying_lease_expired() -> Answer | None:
        return await _admitted(b, blocked, ttl_s=10)

    answer = await until(dying_lease_expired, timeout_s=5, interval_s=POLL_S)
    assert answer is not None and (answer.verdict, answer.expired, answer.totals.reserved_tokens) == ("ok", 1, 5_000)


async def test_a_renewal_extends_live_leases_and_never_adds_back_one_that_expired(two: list[SharedStore]) -> None:
    """Issue 23: replica a is cut off past the ttl, its lease expires, replica b takes the room; a's renewal used to
    add the lease back unchecked (the pool at 110 %). Now it extends only live leases and names the missing one; the
    capacity-checked re-add then finds no room (a fences the request instead)."""
    a, b = two
    ttl_s, renew_every_s = 0.45, 0.15  # renewed 3x as often as it would lapse
    live = Ledger().reserve(KEY, 2_000, "ci")
    assert (await a.reserve(live, UNIFIED, ttl_s=ttl_s)).verdict == "ok"
    for _ in range(4):  # 0.6 s in all: past the first lease's ttl
        await asyncio.sleep(renew_every_s)  # the time between two renewals is what is tested here
        await a.renew(KEY, [live], ttl_s=ttl_s)  # renewed in time: still there
        assert (await a.totals(KEY)).totals.reserved_tokens == 2_000

    async def live_lease_expired() -> bool:  # cut off for longer than the ttl
        return (await a.totals(KEY)).totals.reserved_tokens == 0

    await until(live_lease_expired, timeout_s=5, interval_s=POLL_S)
    taken = Ledger().reserve(KEY, 9_000, "web")
    assert (await b.reserve(taken, UNIFIED, ttl_s=10)).verdict == "ok"
    renewed = await a.renew(KEY, [live], ttl_s=0.3)
    assert (await a.totals(KEY)).totals.reserved_tokens == 9_000  # not 11,000 of 10,000
    assert renewed.missing == (a.lease_id(live),)
    readded = await a.reserve(live, UNIFIED, ttl_s=0.3, readd=True)
    assert (readded.verdict, readded.totals.reserved_tokens) == ("tokens", 9_000)
    await b.release(taken.key, [taken])
    readded = await a.reserve(live, UNIFIED, ttl_s=0.3, readd=True)  # room again: the running request counts
    assert (readded.verdict, readded.totals.reserved_tokens) == ("ok", 2_000)


async def test_a_restarted_empty_redis_takes_the_running_requests_back_before_new_ones() -> None:
    """Redis restarts empty: every lease is gone. A replica that saw the old Redis says so, and for lease_ttl_s new
    leases wait ('behind') while running requests are added back (capacity-checked); a pooled connection Redis
    closed is retried once, not taken for an outage."""
    port = free_port()
    with running_redis(port=port) as server:
        a = SharedStore.from_url(server.url, prefix="t", timeout_s=1.0)
        b = SharedStore.from_url(server.url, prefix="t", timeout_s=1.0)
        running = Ledger().reserve(KEY, 6_000, "ci")
        assert (await a.reserve(running, UNIFIED, ttl_s=0.5)).verdict == "ok"
        assert (await b.totals(KEY)).totals.reserved_tokens == 6_000
        await b.renew(KEY, [], ttl_s=0.5)  # b has seen this Redis too
    with running_redis(port=port):
        new = Ledger().reserve(KEY, 6_000, "web")
        first = await b.reserve(new, UNIFIED, ttl_s=0.5)  # no StoreUnreachable: the dead connection is retried
        assert first.verdict == "behind"  # a's request may still run: it comes back first
        renewed = await a.renew(KEY, [running], ttl_s=0.5)
        assert renewed.missing == (a.lease_id(running),)
        assert (await a.reserve(running, UNIFIED, ttl_s=0.5, readd=True)).verdict == "ok"
        assert (await b.reserve(new, UNIFIED, ttl_s=0.5)).verdict == "tokens"  # 6,000 + 6,000 > 10,000

        async def grace_over_and_a_lease_expired() -> Answer | None:  # a stopped renewing
            return await _admitted(b, new, ttl_s=0.5)

        await until(grace_over_and_a_lease_expired, timeout_s=5, interval_s=POLL_S)
        await a.close()
        await b.close()


async def test_a_pooled_connection_redis_closed_is_retried_once() -> None:
    """After a Redis restart every pooled connection fails once; that is not an outage (issue 23: replicas flapped
    for 13 s and 12 requests got 503 ledger_unavailable)."""
    port = free_port()
    with running_redis(port=port) as server:
        store = SharedStore.from_url(server.url, prefix="t", timeout_s=1.0)
        await asyncio.gather(*(store.totals(KEY) for _ in range(4)))  # four pooled connections
    with running_redis(port=port):
        answers = await asyncio.gather(*(store.totals(KEY) for _ in range(4)), return_exceptions=True)
        await store.close()
    assert [type(a).__name__ for a in answers] == ["Answer"] * 4


async def test_the_queue_holds_at_most_max_queue_across_replicas(two: list[SharedStore]) -> None:
    a, b = two

    async def join(store: SharedStore, waiter: str) -> tuple[bool, int]:
        joined = await store.join_queue(KEY, waiter, max_queue=2, ttl_s=10, place=Place(0, 1, "web"))
        return joined.placed, joined.waiting

    assert await join(a, "1") == (True, 1)
    assert await join(b, "1") == (True, 2)  # another replica's waiter 1
    assert await join(b, "2") == (False, 2)
    assert await join(a, "1") == (True, 2)  # joining again keeps the place
    await a.leave_queue(KEY, "1")
    assert await join(b, "2") == (True, 2)


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


async def test_a_shared_refund_gives_back_the_unused_output_never_above_capacity(two: list[SharedStore]) -> None:
    """Issue 23, point 3b: a request takes its prompt and reserved output up front; settling a negative amount
    gives the unused part back, across replicas, capped at the bucket's capacity."""
    a, b = two
    limit = RateLimit(tokens_per_minute=3_000)
    assert await a.take_rate("up", limit, 2_500) is None
    assert await b.take_rate("up", limit, 1_000) is not None  # 500 left
    await a.settle_rate("up", limit, -2_000)  # 2,000 of the reservation unused
    assert await b.take_rate("up", limit, 2_400) is None
    await b.settle_rate("up", limit, -10_000)  # more than was ever taken: back to a full bucket, no more
    assert await a.take_rate("up", limit, 3_000) is None
    assert await a.take_rate("up", limit, 10) is not None


async def test_the_store_never_shows_the_redis_password(redis_url: str) -> None:
    store = SharedStore.from_url(redis_url.replace("redis://", "redis://:s3cret-pass@"), prefix="t", timeout_s=1.0)
    assert "s3cret" not in repr(store)
    await store.close()


async def test_a_long_waiting_request_keeps_its_room_across_replicas(two: list[SharedStore]) -> None:
    """Replica a's request for 8,000 tokens does not fit (b holds 4,000 of 10,000). Within the overtake window b may
    pass it; once it has waited past the window, b may not: freed tokens accumulate for it, whichever replica frees
    them, and then it gets its room."""
    a, b = two
    ledger_b = Ledger()
    hold = ledger_b.reserve(KEY, 4_000, "web")
    assert (await b.reserve(hold, UNIFIED, ttl_s=10)).verdict == "ok"
    assert (await a.join_queue(KEY, "7", max_queue=10, ttl_s=10, place=Place(8_000, 1, "ci"))).placed
    await asyncio.sleep(0.05)  # the waiter waits 5x the 0.01 s window below, and 1/1,200 of the 60 s one
    early = ledger_b.reserve(KEY, 1_000, "web")
    passed = await b.reserve(early, UNIFIED, 10, Turn(overtake_s=60))  # within the window
    late = await b.reserve(ledger_b.reserve(KEY, 1_000, "web"), UNIFIED, 10, Turn(overtake_s=0.01))
    await b.release(hold.key, [hold])
    await b.release(early.key, [early])
    head = await a.reserve(Ledger().reserve(KEY, 8_000, "ci"), UNIFIED, 10, Turn("7", overtake_s=0.01))
    print(f"\n  b 1,000 (window 60 s) -> {passed.verdict}; b 1,000 (window 0.01 s) -> {late.verdict}; "
          f"the waiter, once b released -> {head.verdict}")
    assert (passed.verdict, late.verdict, head.verdict) == ("ok", "behind", "ok")
    after = await b.reserve(ledger_b.reserve(KEY, 0, "web"), UNIFIED, 10, Turn(overtake_s=0.01))
    assert after.verdict == "ok"  # the waiter was served and left the queue: nothing is kept back


async def test_a_dead_replicas_waiter_stops_holding_room_when_its_place_expires(two: list[SharedStore]) -> None:
    a, b = two
    assert (await a.join_queue(KEY, "1", max_queue=10, ttl_s=0.3, place=Place(9_000, 1, "ci"))).placed
    await asyncio.sleep(0.05)  # past the 0.01 s overtake window (5x), well within the place's 0.3 s ttl (6x)
    blocked = await b.reserve(Ledger().reserve(KEY, 5_000, "web"), UNIFIED, 10, Turn(overtake_s=0.01))
    assert blocked.verdict == "behind"
    ask = Ledger().reserve(KEY, 5_000, "web")

    async def waiters_place_expired() -> Answer | None:  # replica a stopped touching its waiter's place
        return await _admitted(b, ask, ttl_s=10, overtake_s=0.01)

    await until(waiters_place_expired, timeout_s=5, interval_s=POLL_S)


async def test_one_fair_order_across_replicas(two: list[SharedStore], redis_url: str) -> None:
    """The pool's virtual time and the tenants' tags live in Redis: replica a's batch backlog and replica b's code
    request are ordered as in one waiting room. Freed room goes to the lowest tag that fits, whichever replica asks
    first (a waiter ahead that does not fit, and has waited less than the overtake window, may be passed); a request
    that did not queue is placed where it would be tagged now."""
    a, b = two
    ledger_a, ledger_b = Ledger(), Ledger()
    big, small = ledger_a.reserve(KEY, 6_000, "batch"), ledger_a.reserve(KEY, 4_000, "batch")
    for held in (big, small):
        assert (await a.reserve(held, UNIFIED, ttl_s=10)).verdict == "ok"  # batch: tags 0 and 6,000, finish 10,000
    tags = {}
    for n in range(3):
        joined = await a.join_queue(KEY, f"b{n}", max_queue=10, ttl_s=10, place=Place(4_000, 1, "batch"))
        tags[f"a batch waiter {n}"] = (joined.start, joined.finish)
    joined = await b.join_queue(KEY, "c0", max_queue=10, ttl_s=10, place=Place(1_000, 1, "code", weight=2.0))
    tags["b code waiter (weight 2)"] = (joined.start, joined.finish)
    assert tags == {"a batch waiter 0": (10_000, 14_000), "a batch waiter 1": (14_000, 18_000),
                    "a batch waiter 2": (18_000, 22_000), "b code waiter (weight 2)": (6_000, 6_500)}
    await a.release(small.key, [small])  # 4,000 free: enough for a's next batch request, or for b's code request
    rows = {}

    async def ask(label: str, store: SharedStore, tokens: int, tenant: str, **turn: Any) -> str:
        ledger = ledger_a if store is a else ledger_b  # one ledger per replica: its reservation ids are unique
        answer = await store.reserve(ledger.reserve(KEY, tokens, tenant), UNIFIED, 10, Turn(**turn))
        rows[label] = answer.verdict
        return answer.verdict

    await ask("a: batch waiter 0 (tag 10,000), first to ask", a, 4_000, "batch", waiter="b0")
    await ask("a: batch, not queued (tag 22,000)", a, 3_500, "batch")
    await ask("a: chat, not queued (tag 6,000, after code's)", a, 3_500, "chat")
    await ask("b: code waiter (tag 6,000)", b, 1_000, "code", waiter="c0")
    await ask("a: batch waiter 0, again", a, 4_000, "batch", waiter="b0")
    await ask("a: chat, not queued, now", a, 3_000, "chat")
    print("\n" + "\n".join(f"  {label:<48} -> {verdict}" for label, verdict in rows.items()))
    assert list(rows.values()) == ["behind", "behind", "behind", "ok", "tokens", "ok"]
    client = aioredis.Redis.from_url(redis_url)
    fair = await client.hgetall(f"t:pool:{len(KEY.backend)}:{KEY.backend}:{KEY.model}:fair")
    await client.aclose()
    assert float(fair[b"v"]) == 6_000  # serving code's request moved virtual time to its start


async def test_a_waiter_that_leaves_gives_its_tag_back(two: list[SharedStore]) -> None:
    a, _ = two
    first = await a.join_queue(KEY, "1", max_queue=10, ttl_s=10, place=Place(4_000, 1, "batch"))
    await a.leave_queue(KEY, "1")
    again = await a.join_queue(KEY, "2", max_queue=10, ttl_s=10, place=Place(4_000, 1, "batch"))
    assert (first.start, again.start) == (0, 0)  # not charged for work it never got
    second = await a.join_queue(KEY, "3", max_queue=10, ttl_s=10, place=Place(4_000, 1, "batch"))
    assert second.start == 4_000


async def test_priority_goes_first_and_a_waiter_held_by_its_tenant_cap_keeps_no_room(two: list[SharedStore]) -> None:
    a, b = two
    capped = Limits(slots=4, pool_tokens=10_000, tenant_max_active=1, tenant_share_tokens=None)
    ledger_a, ledger_b = Ledger(), Ledger()
    for tokens, tenant in ((5_000, "ops"), (1_000, "ci")):  # tags 0 for both; ops's finish 5,000, ci's 1,000
        assert (await a.reserve(ledger_a.reserve(KEY, tokens, tenant), capped, ttl_s=10)).verdict == "ok"
    # ci's waiter (tag 1,000) is ahead of ops's next request (tag 5,000), but ci runs 1 of its 1 allowed: held by
    # its own tenant's cap, it keeps none of the 4,000 free tokens
    place = Place(4_000, 1, "ci", tenant_max_active=1)
    assert (await a.join_queue(KEY, "ci", max_queue=10, ttl_s=10, place=place)).placed
    rows = {}

    async def ops(label: str, tokens: int, priority: int) -> None:
        answer = await b.reserve(ledger_b.reserve(KEY, tokens, "ops"), UNIFIED, 10, Turn(priority=priority))
        rows[label] = answer.verdict

    await ops("ops 3,000 (ci's capped waiter ahead)", 3_000, 0)
    # web's waiter (tag 0: web was idle) is ahead of ops's next request, and fits in the last 1,000
    assert (await a.join_queue(KEY, "web", max_queue=10, ttl_s=10, place=Place(1_000, 1, "web"))).placed
    await ops("ops 1,000, priority 0", 1_000, 0)
    await ops("ops 1,000, priority 1", 1_000, 1)
    print("\n" + "\n".join(f"  {label:<36} -> {verdict}" for label, verdict in rows.items()))
    assert list(rows.values()) == ["ok", "behind", "ok"]


async def test_a_change_is_announced_while_requests_wait_and_nothing_while_none_do(two: list[SharedStore]) -> None:
    a, b = two
    listener = b.subscriber()
    await listener.subscribe(b.channel)
    ledger = Ledger()
    held = ledger.reserve(KEY, 3_000, "ci")
    await a.reserve(held, UNIFIED, ttl_s=10)  # nobody waits: not announced
    await a.join_queue(KEY, "1", max_queue=10, ttl_s=10, place=Place(9_000, 1, "web"))  # the queue changed
    await a.release(held.key, [held])  # someone waits: announced
    await a.leave_queue(KEY, "1")  # the queue changed (now empty)
    again = ledger.reserve(KEY, 1_000, "ci")
    await a.reserve(again, UNIFIED, ttl_s=10)  # nobody waits: neither is announced
    await a.release(again.key, [again])
    heard: list[tuple[int, int, dict[str, int]]] = []
    deadline_s = asyncio.get_running_loop().time() + 1.0
    while asyncio.get_running_loop().time() < deadline_s:  # a second more: nothing else comes
        message = await listener.get_message(ignore_subscribe_messages=True, timeout=0.2)
        if message is None:  # the subscription's own confirmation reads as None
            continue
        told = announcement(message["data"])
        assert told is not None and told.pool == b.pool_name(KEY) and told.replica == a.replica
        assert announcement(message["data"], skip_replica=a.replica) is None  # a has the script's answer
        heard.append((told.waiting, told.totals.reserved_tokens, dict(told.totals.per_tenant_active)))
    await listener.aclose()  # type: ignore[no-untyped-call]
    print(f"\nheard: {heard}")
    assert heard == [(1, 3_000, {"ci": 1}), (1, 0, {}), (0, 0, {})]
    assert [announcement(odd) for odd in (b"", b"x", b"[1]", b'["p", "n", [], "r"]', b'{"a": 1}')] == [None] * 5
