"""200 random concurrent requests against one unified pool: it is never oversubscribed and ends empty."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

from gateway.admission import (
    AdmissionRejected,
    Ledger,
    Policy,
    PoolKey,
    PoolSpec,
    RequestCost,
    Reservation,
    WaitingRoom,
)

POOL = PoolSpec.unified_pool("gpu1", "qwen2.5:7b", pool_tokens=16_384, slots=4, slot_ctx_tokens=8192)


class CheckingLedger(Ledger):
    """A real ledger that also checks the pool's bounds at the instant of every reservation, and its own totals
    after every reservation and release."""

    def __init__(self, pool: PoolSpec) -> None:
        super().__init__()
        self.pool = pool
        self.peak_tokens = 0

    def reserve(self, key: PoolKey, tokens: int, tenant: str, sequences: int = 1) -> Reservation:
        reservation = super().reserve(key, tokens, tenant, sequences)
        snapshot = self.snapshot(key)
        assert snapshot.reserved_tokens <= self.pool.pool_tokens, snapshot
        assert snapshot.active_sequences <= self.pool.slots, snapshot
        self.peak_tokens = max(self.peak_tokens, snapshot.reserved_tokens)
        self.check_invariants()
        return reservation

    def release(self, reservation: Reservation) -> bool:
        freed = super().release(reservation)
        self.check_invariants()
        return freed


async def one_request(room: WaitingRoom, rng: random.Random, seen: Counter[str]) -> str:
    """One client: returns how its request ended; raises CancelledError if its task was cancelled."""
    request = RequestCost(
        prompt_tokens=rng.choice([rng.randrange(0, 3000), rng.randrange(3000, 9000)]),
        prompt_exact=rng.random() < 0.5,
        max_output_tokens=rng.choice([None, rng.randrange(0, 4000)]),
        requested_num_ctx=None,
        tenant=rng.choice("abc"),
        priority=rng.choice([0, 0, 0, 1]),
    )
    policy = Policy(
        queue_timeout_s=rng.choice([2.0, 2.0, 2.0, 0.005]),
        max_queue=rng.choice([256, 256, 256, 3]),
        overtake_window_s=0.01,
        per_tenant_max_active=rng.choice([None, None, 2]),
    )
    left = rng.random() < 0.05
    hold_s, breaks = rng.random() * 0.004, rng.random() < 0.1
    await asyncio.sleep(rng.random() * 0.02)  # random arrivals
    try:
        with await room.acquire(POOL.key, POOL, request, policy, is_disconnected=lambda: left) as permit:
            seen["admitted"] += 1
            seen["waited"] += permit.waited_s > 0
            await asyncio.sleep(hold_s)  # the request runs this long
            if breaks:
                raise ConnectionResetError("the client went away mid-stream")
            return "completed"
    except AdmissionRejected as rejected:
        return rejected.code
    except ConnectionResetError:
        return "broke"


async def test_200_random_concurrent_requests_never_oversubscribe_the_pool() -> None:
    rng = random.Random(2024)
    ledger = CheckingLedger(POOL)
    room = WaitingRoom(ledger, disconnect_poll_s=0.002)
    seen: Counter[str] = Counter()
    tasks = [asyncio.create_task(one_request(room, rng, seen)) for _ in range(200)]
    await asyncio.sleep(0.01)  # mid-run: some wait, some run, some have not arrived
    for task in rng.sample(tasks, 10):  # these clients left: their handler tasks are cancelled wherever they are
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)

    ends = Counter(r if isinstance(r, str) else type(r).__name__ for r in results)
    assert set(ends) <= {
        "completed", "broke", "CancelledError",
        "context_length_exceeded", "queue_full", "queue_timeout", "client_closed_request",
    }, ends  # fmt: skip
    assert seen["admitted"] > 50 and seen["waited"] > 10, seen  # the pool really was contended
    assert ends["context_length_exceeded"] > 0 and ends["broke"] > 0, ends
    ledger.check_invariants()
    assert ledger.keys() == () and room.queue_length(POOL.key) == 0  # everything released, nobody left behind
    assert room.stats()[POOL.key].admitted_total == seen["admitted"]
    assert POOL.pool_tokens // 2 < ledger.peak_tokens <= POOL.pool_tokens
