"""Elastic reservations, step by step: a simulated unified pool where replies generate a token a tick, kvgate sees
them late, and ended replies stop only after their connection closes. After every tick the pool's real use fits
the pool, every reply's use fits its hold, and the ledger's totals match its reservations."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.admission import Ledger, Policy, PoolSpec, RequestCost, WaitingRoom
from gateway.admission.elastic import ElasticPools, Growth
from gateway.admission.permit import Permit

POOL = PoolSpec.unified_pool("cpp", "m", pool_tokens=4096, slots=8)
POLICY = Policy(elastic_watermark=0.9, elastic_floor_tokens=64, queue_timeout_s=60.0)


@dataclass
class Reply:
    prompt: int
    length: int
    """Tokens it generates unless ended (at most its limit)."""
    limit: int
    lag: int
    """How many of its tokens kvgate has not seen yet (the wire, the relay's coalescing)."""
    expected: int
    generated: int = 0
    growth: Growth | None = None
    permit: Permit | None = None
    stopping: int = -1
    """Ticks left before the backend stops it once kvgate ended it (-1: not ended)."""
    done: bool = False

    @property
    def actual(self) -> int:
        return self.prompt + self.generated


async def _admit(room: WaitingRoom, elastic: ElasticPools, reply: Reply) -> None:
    cost = RequestCost(reply.prompt, True, reply.limit, None, expected_output_tokens=reply.expected)
    reply.permit = await room.acquire(POOL.key, POOL, cost, POLICY)
    reply.growth = elastic.start(reply.permit, POOL, reply.prompt)


def _tick(replies: list[Reply], elastic: ElasticPools, rng: random.Random) -> None:
    for reply in replies:
        tick(reply, elastic, rng)


def tick(reply: Reply, elastic: ElasticPools, rng: random.Random) -> None:
    """One token's time for one reply: it ends (its own end, or a tick after kvgate ended it) or generates a token,
    which kvgate sees ``lag`` tokens late."""
    if reply.done or reply.permit is None:
        return
    growth = reply.growth
    if reply.stopping == 0 or (reply.stopping < 0 and reply.generated >= min(reply.length, reply.limit)):
        if growth is not None:
            elastic.end(growth)
        reply.permit.release()
        reply.done = True
        return
    if reply.stopping > 0:
        reply.stopping -= 1
    reply.generated += 1  # the backend generates until it notices the closed connection
    if growth is not None and reply.stopping < 0 and growth.ended is None:
        seen = max(0, reply.generated - rng.randint(0, reply.lag))
        if not growth.seen(seen):
            reply.stopping = 1
    if growth is not None and growth.ended is not None and reply.stopping < 0:
        reply.stopping = 1  # another's growth ended it: its relay stops, the connection closes


def _check(room: WaitingRoom, elastic: ElasticPools, replies: list[Reply]) -> None:
    room.ledger.check_invariants()
    elastic.check_invariants({POOL.key: POOL})
    running = [r for r in replies if r.permit is not None and not r.done]
    assert sum(r.actual for r in running) <= POOL.pool_tokens, [(r.actual, r.permit) for r in running]
    for reply in running:
        assert reply.permit is not None
        assert reply.actual <= reply.permit.reservation.tokens, (reply, reply.permit)


async def _run(seed: int, count: int, long_share: float) -> tuple[int, int, int]:
    rng = random.Random(seed)
    room = WaitingRoom(Ledger())
    elastic = ElasticPools(room.grow, step_tokens=64)
    replies = [Reply(prompt=rng.randint(50, 900), length=rng.randint(2000, 3000) if rng.random() < long_share
                     else rng.randint(10, 250), limit=rng.randint(1000, 3000), lag=rng.randint(0, 4),
                     expected=250) for _ in range(count)]
    tasks = [asyncio.ensure_future(_admit(room, elastic, reply)) for reply in replies]
    peak = 0
    for _ in range(20_000):
        await asyncio.sleep(0)
        _tick(replies, elastic, rng)
        _check(room, elastic, replies)
        peak = max(peak, sum(1 for r in replies if r.permit is not None and not r.done))
        if all(r.done for r in replies):
            break
    else:
        pytest.fail("the replies did not all finish")
    await asyncio.gather(*tasks)
    assert room.ledger.snapshot(POOL.key).reserved_tokens == 0
    cuts = elastic.counts[POOL.key].cuts_total if POOL.key in elastic.counts else 0
    steps = elastic.counts[POOL.key].steps_total if POOL.key in elastic.counts else 0
    return peak, cuts, steps


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), count=st.integers(1, 24), long_share=st.sampled_from([0.0, 0.1, 0.5, 1.0]))
async def test_the_pool_never_overruns_whatever_the_replies_do(seed: int, count: int, long_share: float) -> None:
    await _run(seed, count, long_share)


@pytest.mark.parametrize(("long_share", "most_cuts"), [(0.0, 0), (0.1, 6), (1.0, 24)])
async def test_short_answers_run_side_by_side_and_long_ones_are_ended_only_when_the_pool_is_short(
    long_share: float, most_cuts: int
) -> None:
    peak, cuts, steps = await _run(7, 24, long_share)
    print(f"long share {long_share}: at most {peak} replies at once, {steps} growth steps, {cuts} ended by kvgate")
    assert peak >= 4  # fixed reservations (prompt + 1,000..3,000) hold 1 to 3
    assert cuts <= most_cuts
