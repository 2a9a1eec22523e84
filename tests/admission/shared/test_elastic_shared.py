"""Elastic reservations across replicas (issue 25 point 6): growth steps go through the shared ledger's script, one
call a step, so three replicas growing replies in one unified pool never overrun it together. Each replica is a
waiting room with its SharedPools on one real redis-server; the backend is what the replies really hold at once."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import pytest
import redis.asyncio as aioredis

from gateway.admission import PoolSpec, RequestCost, WaitingRoom
from gateway.admission.elastic import ElasticPools
from gateway.admission.types import Policy
from tests.admission.shared.test_replicas import fast, replica
from tests.admission.test_elastic import Reply, tick

POOL = PoolSpec.unified_pool("ls", "", pool_tokens=4_096, slots=8)
POLICY = Policy(queue_timeout_s=30.0, elastic_watermark=0.9, elastic_floor_tokens=64)


@pytest.fixture
async def rooms(redis_url: str) -> AsyncIterator[list[WaitingRoom]]:
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(replica(fast(redis_url))) for _ in range(3)]


async def _admit(room: WaitingRoom, elastic: ElasticPools, reply: Reply) -> None:
    cost = RequestCost(reply.prompt, True, reply.limit, None, expected_output_tokens=reply.expected)
    reply.permit = await room.acquire(POOL.key, POOL, cost, POLICY)
    reply.growth = elastic.start(reply.permit, POOL, reply.prompt)


@pytest.mark.parametrize("long_share", [0.0, 0.2])
async def test_three_replicas_growing_replies_never_overrun_the_pool(rooms: list[WaitingRoom], redis_url: str,
                                                                     long_share: float) -> None:
    rng = random.Random(25)
    elastics = [ElasticPools(room.grow, step_tokens=64) for room in rooms]
    replies = [Reply(prompt=rng.randint(100, 700), length=rng.randint(1500, 2500) if rng.random() < long_share
                     else rng.randint(10, 250), limit=2000, lag=rng.randint(0, 3), expected=250) for _ in range(30)]
    placed = [(rooms[i % 3], elastics[i % 3], reply) for i, reply in enumerate(replies)]
    tasks = [asyncio.ensure_future(_admit(room, elastic, reply)) for room, elastic, reply in placed]
    peak_tokens = peak_replies = 0
    for _ in range(10_000):
        await asyncio.sleep(0.0005)  # a token a tick: Redis answers a growth step within a tick or two
        for _room, elastic, reply in placed:
            tick(reply, elastic, rng)
        running = [r for _, _, r in placed if r.permit is not None and not r.done]
        held = sum(r.actual for r in running)
        assert held <= POOL.pool_tokens, held
        for reply in running:
            assert reply.permit is not None and reply.actual <= reply.permit.reservation.tokens
        for room in rooms:
            room.ledger.check_invariants()
        peak_tokens, peak_replies = max(peak_tokens, held), max(peak_replies, len(running))
        if all(r.done for r in replies):
            break
    else:
        pytest.fail("the replies did not all finish")
    await asyncio.gather(*tasks)
    cuts = sum(e.counts[POOL.key].cuts_total for e in elastics if POOL.key in e.counts)
    steps = sum(e.counts[POOL.key].steps_total for e in elastics if POOL.key in e.counts)
    print(f"long share {long_share}: at most {peak_replies} replies and {peak_tokens:,} of {POOL.pool_tokens:,} "
          f"tokens at once, {steps} growth steps through Redis, {cuts} ended by kvgate")
    assert steps > 0
    assert peak_replies >= 4
    client = aioredis.Redis.from_url(redis_url)
    for room in rooms:
        assert room.shared is not None
    totals = await client.hgetall(f"{rooms[0].shared.store.pool_name(POOL.key)}:totals")  # type: ignore[union-attr]
    await client.aclose()
    assert int(totals.get(b"tokens", b"0")) == 0, totals
