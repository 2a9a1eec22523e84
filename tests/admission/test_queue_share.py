"""Issue 23, point 3a: one tenant's share of a pool's queue places (``admission.max_queue_share``, default half of
``max_queue``; ``tenants.NAME.max_queued``). The attack: one tenant's 400 requests took all 256 places, and another
tenant got 503 ``queue_full`` 10 times of 10."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from gateway.admission import AdmissionRejected, Ledger, Policy, PoolSpec, RequestCost, Reservation, WaitingRoom
from gateway.admission.queue_share import tenant_queue_places
from gateway.domain import BackendKind

ONE_SLOT = PoolSpec.split_pool("gpu0", "llama3.1:8b", BackendKind.OLLAMA, slot_ctx_tokens=8192, slots=1)


def cost(tenant: str) -> RequestCost:
    return RequestCost(100, True, 0, 8192, tenant, 0)


async def _admit(room: WaitingRoom, request: RequestCost, policy: Policy) -> Reservation:
    return (await room.acquire(ONE_SLOT.key, ONE_SLOT, request, policy)).reservation


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def _ends(tasks: list[asyncio.Task[Reservation]]) -> Counter[str]:
    await _settle()
    ends: Counter[str] = Counter()
    for task in tasks:
        if not task.done():
            ends["queued"] += 1
        elif isinstance(task.exception(), AdmissionRejected):
            ends[task.exception().code] += 1  # type: ignore[union-attr]
    return ends


async def _cancel(tasks: list[asyncio.Task[Reservation]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_one_tenants_flood_leaves_places_for_another_tenant() -> None:
    room = WaitingRoom(Ledger())
    policy = Policy(queue_timeout_s=30.0, max_queue=256)  # the defaults: a tenant may hold half the places
    holder = await _admit(room, cost("flood"), policy)  # the one slot is busy: everyone else queues
    flood = [asyncio.create_task(_admit(room, cost("flood"), policy)) for _ in range(400)]
    flood_ends = await _ends(flood)
    others = [asyncio.create_task(_admit(room, cost("other"), policy)) for _ in range(10)]
    other_ends = await _ends(others)
    print(f"\n{'tenant':8} {'sent':>5} {'queued':>7} {'queue_full':>11}")
    for name, sent, ends in (("flood", 400, flood_ends), ("other", 10, other_ends)):
        print(f"{name:8} {sent:>5} {ends['queued']:>7} {ends['queue_full']:>11}")
    assert flood_ends == Counter(queued=128, queue_full=272)
    assert other_ends == Counter(queued=10)  # before the fix: queue_full 10 times of 10
    refused = next(t.exception() for t in flood if t.done())
    assert isinstance(refused, AdmissionRejected) and refused.status == 503
    assert "tenant 'flood' already has 128 requests waiting" in refused.message
    assert "128 places (admission.max_queue_share 0.5 of max_queue 256)" in refused.message
    await _cancel(flood + others)
    room.release(holder)
    assert room.queue_length(ONE_SLOT.key) == 0


async def test_a_tenants_own_max_queued_overrides_the_share() -> None:
    room = WaitingRoom(Ledger())
    policy = Policy(queue_timeout_s=30.0, max_queue=256, tenant_max_queued=3)
    holder = await _admit(room, cost("ci"), policy)
    tasks = [asyncio.create_task(_admit(room, cost("ci"), policy)) for _ in range(5)]
    assert await _ends(tasks) == Counter(queued=3, queue_full=2)
    refused = next(t.exception() for t in tasks if t.done())
    assert isinstance(refused, AdmissionRejected) and "its max_queued of 3" in refused.message
    await _cancel(tasks)
    room.release(holder)


@pytest.mark.parametrize(("max_queue", "share", "own", "places"), [
    (256, 0.5, None, 128), (256, 1.0, None, 256), (1, 0.5, None, 1), (0, 0.5, None, 0), (5, 0.5, None, 3),
    (256, 0.5, 10, 10), (8, 0.5, 100, 8),
])  # fmt: skip
def test_tenant_queue_places(max_queue: int, share: float, own: int | None, places: int) -> None:
    policy = Policy(max_queue=max_queue, max_queue_share=share, tenant_max_queued=own)
    assert tenant_queue_places(policy)[0] == places
