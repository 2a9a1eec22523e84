"""A batch holds one sequence per prompt in the shared ledger too (issue 22 point 5): across replicas, the slots a
batch's tasks take are counted, for a batch that waits in the shared queue as for one admitted at once."""

from __future__ import annotations

import asyncio

from gateway.admission import PoolSpec, RequestCost
from gateway.admission.types import Policy
from tests.admission.shared.test_replicas import fast, replica
from tests.support.poll import until

POOL = PoolSpec.unified_pool("ls", "", pool_tokens=10_000, slots=4)
POLICY = Policy(queue_timeout_s=5.0)


def batch(*prompts: int) -> RequestCost:
    return RequestCost(sum(prompts), True, 100, None, "t", batch_prompt_tokens=prompts)


async def test_a_batch_holds_a_slot_per_prompt_across_replicas(redis_url: str) -> None:
    async with replica(fast(redis_url)) as a, replica(fast(redis_url)) as b:
        first = await a.acquire(POOL.key, POOL, batch(100, 100, 100), POLICY)
        assert first.reservation.sequences == 3 and first.reservation.tokens == 600
        waiting = asyncio.create_task(b.acquire(POOL.key, POOL, batch(100, 100), POLICY))  # 3 + 2 > 4 slots
        shared = b.shared
        assert shared is not None

        def b_queued_it_and_sees_three_sequences() -> bool:  # the fresh totals: a's three sequences
            return b.queue_length(POOL.key) == 1 and shared.others(POOL.key).active_sequences == 3

        await until(b_queued_it_and_sees_three_sequences)
        assert not waiting.done()
        first.release()
        second = await asyncio.wait_for(waiting, timeout=1.0)
        assert (second.reservation.sequences, second.reservation.tokens) == (2, 400)
        second.release()


async def test_a_batch_past_the_slots_waits_for_all_of_them(redis_url: str) -> None:
    """Six prompts on four slots hold the four slots (the server queues the other two itself): one sequence held on
    another replica makes it wait in the shared queue, with the four it will take."""
    async with replica(fast(redis_url)) as a, replica(fast(redis_url)) as b:
        one = await a.acquire(POOL.key, POOL, RequestCost(100, True, 100, None, "t"), POLICY)
        waiting = asyncio.create_task(b.acquire(POOL.key, POOL, batch(*[100] * 6), POLICY))

        def b_queued_the_batch() -> bool:
            return b.queue_length(POOL.key) == 1

        await until(b_queued_the_batch)
        assert not waiting.done()
        one.release()
        held = await asyncio.wait_for(waiting, timeout=1.0)
        assert (held.reservation.sequences, held.reservation.tokens) == (4, 800)
        held.release()
