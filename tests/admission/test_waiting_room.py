"""The waiting room with real asyncio: order, wake-ups, deadlines, bounds, departures and exactly-once release."""

from __future__ import annotations

import asyncio

import pytest

from gateway.admission import (
    AdmissionRejected,
    Admit,
    Ledger,
    Policy,
    PoolSpec,
    RequestCost,
    Reservation,
    WaitingRoom,
)
from gateway.domain import BackendKind
from tests.support.clock import FakeClock
from tests.support.poll import until

ONE_SLOT = PoolSpec.split_pool("gpu0", "llama3.1:8b", BackendKind.OLLAMA, slot_ctx_tokens=8192, slots=1)
SHARED = PoolSpec.unified_pool("gpu1", "qwen2.5:7b", pool_tokens=10_000, slots=8)
POLICY = Policy(queue_timeout_s=5.0)


def cost(tokens: int = 100, *, tenant: str = "default", priority: int = 0) -> RequestCost:
    return RequestCost(tokens, True, 0, 8192, tenant, priority)


async def settle() -> None:
    """Let every ready task run until it blocks again."""
    for _ in range(5):
        await asyncio.sleep(0)


async def cancel(task: asyncio.Task[Reservation]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def admit(room: WaitingRoom, pool: PoolSpec, request: RequestCost, policy: Policy = POLICY) -> Reservation:
    permit = await room.acquire(pool.key, pool, request, policy)
    return permit.reservation


def queue(
    room: WaitingRoom, pool: PoolSpec, *requests: RequestCost, policy: Policy = POLICY
) -> list[asyncio.Task[Reservation]]:
    return [asyncio.create_task(admit(room, pool, r, policy)) for r in requests]


async def test_a_request_that_fits_is_admitted_at_once() -> None:
    room = WaitingRoom(Ledger())
    permit = await room.acquire(ONE_SLOT.key, ONE_SLOT, cost(100), POLICY)
    reservation, decision = permit.reservation, permit.admit
    assert decision == Admit(100)
    assert room.ledger.snapshot(ONE_SLOT.key).reserved_tokens == 100
    assert room.stats()[ONE_SLOT.key].admitted_after_wait_total == 0
    assert room.release(reservation) and not room.release(reservation)


async def test_a_rejection_is_raised_without_queueing() -> None:
    room = WaitingRoom(Ledger())
    await admit(room, ONE_SLOT, cost())  # the pool is full, and yet
    with pytest.raises(AdmissionRejected) as caught:
        await admit(room, ONE_SLOT, cost(9214))
    assert (caught.value.status, caught.value.code) == (400, "context_length_exceeded")
    assert room.queue_length(ONE_SLOT.key) == 0
    assert room.stats()[ONE_SLOT.key].plan_rejections_total == 1


async def test_waiters_are_served_first_come_first_served() -> None:
    room = WaitingRoom(Ledger())
    holder = await admit(room, ONE_SLOT, cost())
    tasks = queue(room, ONE_SLOT, *(cost(tenant=name) for name in "abc"))
    await settle()
    assert room.queue_length(ONE_SLOT.key) == 3
    served: list[str] = []
    for task in tasks:
        room.release(holder)
        holder = await task
        served.append(holder.tenant)
        assert room.ledger.snapshot(ONE_SLOT.key).active_sequences == 1
    assert served == ["a", "b", "c"]


async def test_higher_priority_goes_first_then_arrival() -> None:
    room = WaitingRoom(Ledger())
    holder = await admit(room, ONE_SLOT, cost())
    requests = [
        cost(tenant="low1"),
        cost(tenant="high1", priority=5),
        cost(tenant="low2"),
        cost(tenant="high2", priority=5),
    ]
    tasks = {r.tenant: t for r, t in zip(requests, queue(room, ONE_SLOT, *requests), strict=True)}
    await settle()
    served: list[str] = []
    for _ in requests:
        room.release(holder)
        done, _ = await asyncio.wait(tasks.values(), return_when=asyncio.FIRST_COMPLETED)
        (task,) = done
        holder = task.result()
        served.append(holder.tenant)
        del tasks[holder.tenant]
    assert served == ["high1", "high2", "low1", "low2"]


async def test_release_wakes_a_waiter_whose_tokens_now_fit() -> None:
    room = WaitingRoom(Ledger())
    big = await admit(room, SHARED, cost(9000))
    (waiting,) = queue(room, SHARED, cost(2000))
    await settle()
    assert not waiting.done()
    room.release(big)
    reservation = await waiting
    assert reservation.tokens == 2000
    stats = room.stats()[SHARED.key]
    assert (stats.admitted_total, stats.admitted_after_wait_total, stats.queued) == (2, 1, 0)


async def test_a_waiter_gives_up_at_its_deadline() -> None:
    room = WaitingRoom(Ledger())
    await admit(room, ONE_SLOT, cost())
    with pytest.raises(AdmissionRejected) as caught:
        await admit(room, ONE_SLOT, cost(), Policy(queue_timeout_s=0.05))
    assert (caught.value.status, caught.value.code) == (503, "queue_timeout")
    assert "queue_timeout_s) is 0.05 s" in caught.value.message
    assert "all 1 sequence slots" in caught.value.message
    assert room.queue_length(ONE_SLOT.key) == 0
    assert room.stats()[ONE_SLOT.key].timed_out_total == 1


async def test_a_full_queue_refuses_more() -> None:
    room = WaitingRoom(Ledger())
    await admit(room, ONE_SLOT, cost())
    policy = Policy(max_queue=1)
    (first,) = queue(room, ONE_SLOT, cost(), policy=policy)
    await settle()
    with pytest.raises(AdmissionRejected) as caught:
        await admit(room, ONE_SLOT, cost(), policy)
    assert (caught.value.status, caught.value.code) == (503, "queue_full")
    assert "1 requests are already waiting" in caught.value.message and "(max_queue) is 1" in caught.value.message
    assert room.queue_length(ONE_SLOT.key) == 1 and not first.done()
    await cancel(first)


async def test_max_queue_zero_never_queues_but_still_admits() -> None:
    room = WaitingRoom(Ledger())
    never = Policy(max_queue=0)
    holder = await admit(room, ONE_SLOT, cost(), never)
    with pytest.raises(AdmissionRejected, match="max_queue"):
        await admit(room, ONE_SLOT, cost(), never)
    room.release(holder)
    await admit(room, ONE_SLOT, cost(), never)


async def test_a_cancelled_waiter_leaves_the_queue_and_holds_nothing() -> None:
    room = WaitingRoom(Ledger())
    holder = await admit(room, ONE_SLOT, cost())
    gone, stays = queue(room, ONE_SLOT, cost(tenant="gone"), cost(tenant="stays"))
    await settle()
    gone.cancel()
    await settle()
    assert gone.cancelled() and room.queue_length(ONE_SLOT.key) == 1
    room.release(holder)
    assert (await stays).tenant == "stays"
    assert [r.tenant for r in room.ledger.reservations(ONE_SLOT.key)] == ["stays"]
    assert room.stats()[ONE_SLOT.key].left_total == 1


async def test_admitted_and_cancelled_in_the_same_instant_releases_the_reservation() -> None:
    room = WaitingRoom(Ledger())
    holder = await admit(room, ONE_SLOT, cost())
    (waiting,) = queue(room, ONE_SLOT, cost(tenant="late"))
    await settle()
    room.release(holder)  # dispatch reserves for "late" right here, synchronously ...
    assert room.ledger.snapshot(ONE_SLOT.key).per_tenant_active == {"late": 1}
    waiting.cancel()  # ... and its task is cancelled before it could resume
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert room.ledger.snapshot(ONE_SLOT.key).active_sequences == 0


async def test_a_disconnected_client_is_dropped_while_waiting() -> None:
    room = WaitingRoom(Ledger(), disconnect_poll_s=0.01)
    await admit(room, ONE_SLOT, cost())
    gone = False
    task = asyncio.create_task(room.acquire(ONE_SLOT.key, ONE_SLOT, cost(), POLICY, is_disconnected=lambda: gone))
    await until(lambda: room.stats()[ONE_SLOT.key].queued == 1)
    assert not task.done()
    gone = True
    with pytest.raises(AdmissionRejected) as caught:
        await task
    assert (caught.value.status, caught.value.code) == (499, "client_closed_request")
    assert room.queue_length(ONE_SLOT.key) == 0 and room.stats()[ONE_SLOT.key].left_total == 1


async def test_a_permit_releases_exactly_once_on_success_error_or_repeat() -> None:
    room = WaitingRoom(Ledger())
    with await room.acquire(SHARED.key, SHARED, cost(4000), POLICY) as permit:
        assert room.ledger.snapshot(SHARED.key).reserved_tokens == 4000
    assert permit.released and room.ledger.snapshot(SHARED.key).reserved_tokens == 0
    assert permit.release() is False

    with pytest.raises(RuntimeError):
        async with await room.acquire(SHARED.key, SHARED, cost(4000), POLICY) as failing:
            raise RuntimeError("upstream broke mid-stream")
    assert failing.released and room.ledger.snapshot(SHARED.key).reserved_tokens == 0
    assert room.release(failing.reservation) is False
    assert "released" in repr(failing)


async def test_small_requests_pass_a_big_head_only_within_the_overtake_window() -> None:
    clock = FakeClock()  # waits and windows become exact
    room = WaitingRoom(Ledger(), clock=clock)
    policy = Policy(overtake_window_s=5.0, queue_timeout_s=60.0)
    first = await admit(room, SHARED, cost(8000), policy)
    (big,) = queue(room, SHARED, cost(5000), policy=policy)
    await settle()
    await admit(room, SHARED, cost(1000), policy)  # the head waited 0 s: a small one may pass it
    clock.advance(5.0)
    (small,) = queue(
        room, SHARED, cost(500), policy=policy
    )  # 1,000 tokens are free, but the head has waited long enough
    await settle()
    assert not small.done() and room.queue_length(SHARED.key) == 2
    room.release(first)
    assert (await big).tokens == 5000 and (await small).tokens == 500
    assert room.stats()[SHARED.key].max_waited_s == 5.0


async def test_a_waiter_held_by_its_tenant_cap_never_blocks_other_tenants() -> None:
    clock = FakeClock()  # waits and windows become exact
    room = WaitingRoom(Ledger(), clock=clock)
    policy = Policy(per_tenant_max_active=1, overtake_window_s=1.0)
    await admit(room, SHARED, cost(tenant="ci"), policy)
    (capped,) = queue(room, SHARED, cost(tenant="ci"), policy=policy)
    await settle()
    clock.advance(60.0)
    await admit(room, SHARED, cost(tenant="web"), policy)
    assert not capped.done()
    assert "tenant 'ci' has 1 of 1" in room.stats()[SHARED.key].waiters[0].reason
    await cancel(capped)


async def test_stats_show_queue_length_and_waited_seconds() -> None:
    clock = FakeClock()  # waits and windows become exact
    room = WaitingRoom(Ledger(), clock=clock)
    holder = await admit(room, ONE_SLOT, cost())
    later = asyncio.create_task(admit(room, ONE_SLOT, cost(tenant="a")))
    sooner = asyncio.create_task(room.acquire(ONE_SLOT.key, ONE_SLOT, cost(tenant="b", priority=1), POLICY))
    await settle()
    clock.advance(2.5)
    stats = room.stats()[ONE_SLOT.key]
    assert (stats.queued, stats.oldest_waited_s) == (2, 2.5)
    assert [(w.tenant, w.waited_s) for w in stats.waiters] == [("b", 2.5), ("a", 2.5)]
    room.release(holder)
    permit = await sooner
    reservation, decision = permit.reservation, permit.admit
    assert decision.notes == ("waited 2.50 s in the queue",)
    assert room.stats()[ONE_SLOT.key].waited_s_total == 2.5
    room.release(reservation)
    room.release(await later)
    assert room.stats()[ONE_SLOT.key].queued == 0 and room.ledger.keys() == ()


async def test_when_the_blocking_head_leaves_the_ones_behind_it_move_up() -> None:
    clock = FakeClock()  # waits and windows become exact
    room = WaitingRoom(Ledger(), clock=clock)
    policy = Policy(overtake_window_s=0.0)  # strict FIFO
    await admit(room, SHARED, cost(8000), policy)
    big, small = queue(room, SHARED, cost(5000), cost(500), policy=policy)
    await settle()
    assert not small.done()  # 2,000 tokens are free, but FIFO keeps it behind the head
    big.cancel()
    assert (await small).tokens == 500
    assert room.queue_length(SHARED.key) == 0
