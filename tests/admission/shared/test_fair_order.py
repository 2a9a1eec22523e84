"""One global fair order across replicas (issue 23, point 1): the livelock of 100 tenants over 3 replicas.

100+ tenants, one 2,000-token request each, spread over three replicas in front of one 8,192-token pool (4 fit at a
time). Before the fix each replica ordered its own queue by its own sequence while the reserve script ordered the
shared queue by ids compared as strings, and a replica only ever asked for its own head: once the global head was
no replica's local head, nobody asked for it and the pool sat empty with ~100 waiters queued.
"""

from __future__ import annotations

import asyncio

from gateway.admission import PoolSpec, RequestCost, WaitingRoom
from gateway.admission.rejections import AdmissionRejected
from gateway.admission.types import Policy
from tests.admission.shared.test_replicas import fast, replica

POOL = PoolSpec.unified_pool("ls", "", pool_tokens=8_192, slots=4)


async def test_a_hundred_tenants_over_three_replicas_are_all_served_in_bounded_time(redis_url: str) -> None:
    tenants = 102
    policy = Policy(queue_timeout_s=12.0, overtake_window_s=0.5)
    loop = asyncio.get_running_loop()
    served: list[float] = []
    refused: list[str] = []
    held_tokens = held_max = 0  # what the backend runs at once: every replica's admitted requests together

    async with replica(fast(redis_url)) as a, replica(fast(redis_url)) as b, replica(fast(redis_url)) as c:
        rooms: list[WaitingRoom] = [a, b, c]
        started_s = loop.time()

        async def one(index: int) -> None:
            nonlocal held_tokens, held_max
            room = rooms[index % 3]
            request = RequestCost(1_900, True, 100, None, f"tenant{index}")
            try:
                permit = await room.acquire(POOL.key, POOL, request, policy)
            except AdmissionRejected as exc:
                refused.append(exc.code)
                return
            held_tokens += permit.reservation.tokens
            held_max = max(held_max, held_tokens)
            served.append(loop.time() - started_s)
            await asyncio.sleep(0.03)  # the request runs this long
            held_tokens -= permit.reservation.tokens
            permit.release()

        await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(tenants))), timeout=30)
        took_s = loop.time() - started_s
    print(f"\n  {tenants} tenants x 2,000 tokens over 3 replicas, pool 8,192: {len(served)} served, "
          f"{len(refused)} refused {sorted(set(refused))}, in {took_s:.1f} s; max held seen {held_max:,}")
    assert len(served) == tenants, refused
    assert held_max <= POOL.pool_tokens
