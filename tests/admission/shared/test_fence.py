"""Fencing the shared ledger (issue 23, point 1): a replica that can't renew its leases ends its requests first.

The attack: replica 0 holds long requests; its path to Redis pauses past ``lease_ttl_s``; its leases expire and the
other replicas admit into their room while they still run at the backend (Context size has been exceeded). Now the
replica ends them at last renewal + ``lease_ttl_s`` - ``fence_margin_s``: a stream with a final error event in its
dialect, a reply not yet begun with a 503 and Retry-After in the route's format; closing the upstream connection stops
them at the backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import aiohttp
import orjson
import pytest
import redis.asyncio as aioredis

from gateway.admission import PoolSpec
from gateway.admission.shared.fence import FenceBook
from gateway.admission.shared.snapshots import known_share_others, local_share_others
from gateway.admission.types import LedgerSnapshot
from kvsim.config import SimConfig
from kvsim.runner import start_sim
from tests.support.gateway_server import running_gateway
from tests.support.poll import until
from tests.support.redis_server import RunningRedis
from tests.support.tcp_cut import CuttableProxy

LONG = {"model": "llama3.1:8b", "max_tokens": 2000, "ignore_eos": True,
        "messages": [{"role": "user", "content": "tell me a long story"}]}


@pytest.mark.parametrize(("confirmed", "now_s", "due"), [
    ({1: 0.0, 2: 0.5}, 0.9, []),  # deadline = confirmed + 2.0 - 1.0
    ({1: 0.0, 2: 0.5}, 1.0, [1]),
    ({1: 0.0, 2: 0.5}, 1.6, [1, 2]),
    ({}, 99.0, []),
])
def test_the_fence_book_says_which_leases_are_due(confirmed: dict[int, float], now_s: float, due: list[int]) -> None:
    book = FenceBook(lease_ttl_s=2.0, fence_margin_s=1.0)
    for lease, at_s in confirmed.items():
        book.confirm([lease], at_s)
    book.confirm([1], -5.0)  # an older confirmation never moves a deadline back
    assert book.due(now_s) == due
    assert book.next_deadline_s() == (min(confirmed.values()) + 1.0 if confirmed else None)
    book.forget(1)
    assert 1 not in book and book.deadline_s(1) is None


POOL = PoolSpec.unified_pool("ls", "", pool_tokens=8_192, slots=4)


@pytest.mark.parametrize(("replica", "others", "mine", "allowed_tokens"), [
    ("replica 0 (holds 7,599)", 0, 7_599, 0),  # its synthetic share is 2,730: it is over it already
    ("replica 1", 7_599, 0, 197),  # (8,192 - 7,599) // 3: a third of what was free
    ("replica 2", 7_599, 0, 197),
    ("idle fleet", 0, 0, 2_730),  # nothing held: the synthetic share
])
def test_local_share_plans_against_the_last_known_holdings(replica: str, others: int, mine: int,
                                                           allowed_tokens: int) -> None:
    """Issue 23: replica 0 held 7,599 of 8,192, Redis died, replicas 1 and 2 admitted 'their third' and 4 of 7
    requests failed. Against what each last knew, the three together stay within the pool."""
    assumed = known_share_others(POOL, 3, LedgerSnapshot(1 if others else 0, others), LedgerSnapshot(0, mine))
    assert assumed.reserved_tokens >= local_share_others(POOL, 3).reserved_tokens  # never less than the share
    assert max(0, POOL.pool_tokens - assumed.reserved_tokens - mine) == allowed_tokens, replica


async def _stream_until_it_ends(http: aiohttp.ClientSession, url: str, started: asyncio.Event) -> tuple[float, bytes]:
    async with http.post(f"{url}/v1/chat/completions", json={**LONG, "stream": True}) as reply:
        assert reply.status == 200
        await reply.content.readline()
        started.set()
        last = b""
        async for line in reply.content:
            if line.strip():
                last = line
    return time.monotonic(), last


async def _reply(http: aiohttp.ClientSession, url: str) -> tuple[float, int, dict[str, str], Any]:
    async with http.post(f"{url}/v1/chat/completions", json=LONG) as reply:
        return time.monotonic(), reply.status, dict(reply.headers), orjson.loads(await reply.read())


@pytest.mark.parametrize("on_unreachable", ["refuse", "local_share"])
async def test_a_replica_cut_off_from_redis_ends_its_requests_before_their_leases_expire(
    redis_server: RunningRedis, redis_url: str, on_unreachable: str,
) -> None:
    ttl_s, margin_s = 1.5, 0.5
    runner, sim = await start_sim(SimConfig(mode="llama-server", ctx_size=8192, gen_tokens_per_s=20.0))
    direct = aioredis.Redis.from_url(redis_url)
    try:
        async with CuttableProxy(redis_server.port) as path, aiohttp.ClientSession() as http:
            shared = {"redis_url": path.url, "lease_ttl_s": ttl_s, "fence_margin_s": margin_s, "poll_s": 0.02,
                      "timeout_s": 0.2, "on_unreachable": on_unreachable, "replicas": 3}
            async with running_gateway([{"name": "ls", "kind": "llama-server", "url": sim}],
                                       shared_ledger=shared) as url:
                started = asyncio.Event()
                stream = asyncio.create_task(_stream_until_it_ends(http, url, started))
                await started.wait()
                reply = asyncio.create_task(_reply(http, url))

                async def both_held() -> bool:  # and both at the server: the replica has had its answers (a lease
                    # in Redis whose answer was still on its way when the path paused was refused, 1 run in 10)
                    return await _leases(direct) == 2 and await _processing(http, sim) == 2
                await until(both_held, timeout_s=5)
                path.pause()  # replica 0's path to Redis goes silent: no renewal gets through from now on
                paused_s = time.monotonic()
                stream_end_s, last_event = await asyncio.wait_for(stream, timeout=ttl_s + 2)
                reply_end_s, status, headers, body = await asyncio.wait_for(reply, timeout=ttl_s + 2)
                path.resume()
    finally:
        await direct.aclose()
        with contextlib.suppress(Exception):
            stream.cancel()
            reply.cancel()
        await runner.cleanup()
    print(f"\n  {on_unreachable:<11} paused at 0: stream ended at {stream_end_s - paused_s:.2f} s, reply at "
          f"{reply_end_s - paused_s:.2f} s ({status}) (lease_ttl_s {ttl_s}, fence_margin_s {margin_s})")
    assert last_event.startswith(b"data: ") and b"ledger_fenced" in last_event, last_event
    assert (status, headers.get("Retry-After")) == (503, "1")
    assert body["error"]["code"] == "ledger_fenced" and "lease_ttl_s = 1.5" in body["error"]["message"]
    assert max(stream_end_s, reply_end_s) < paused_s + ttl_s  # before the leases may expire (last renewal <= pause)


async def _processing(http: aiohttp.ClientSession, server: str) -> int:
    """How many of the server's slots are running a request (llama-server's /slots)."""
    async with http.get(f"{server}/slots") as reply:
        return sum(1 for slot in orjson.loads(await reply.read()) if slot["is_processing"])


async def _leases(direct: aioredis.Redis) -> int:
    return sum([await direct.hlen(k) async for k in direct.scan_iter("kvgate:pool:*:leases")])


async def test_a_request_that_ends_while_its_renewal_is_on_its_way_leaves_no_deadline_behind(redis_url: str) -> None:
    """The renewal confirms the leases it sent once Redis answers; a request released meanwhile must not get its
    deadline back (it had none any more: the fence timer then re-armed at that past deadline, at once, forever, and
    a replica under load spun a core after every burst)."""
    from tests.admission.shared.test_replicas import POLICY, cost, fast, replica

    async with replica(fast(redis_url, lease_ttl_s=5.0, fence_margin_s=1.0)) as room:
        shared = room.shared
        assert shared is not None
        permits = [await room.acquire(POOL.key, POOL, cost(1_000), POLICY) for _ in range(3)]
        assert len(shared.fences.book) == 3
        renewing = asyncio.ensure_future(shared.renew_all())
        await asyncio.sleep(0)  # the renewal is on its way to Redis
        for permit in permits[:2]:
            permit.release()
        await renewing
        assert len(shared.fences.book) == 1  # the one still running, renewed; the two ended: no deadline
        permits[2].release()
        assert len(shared.fences.book) == 0


async def test_a_deadline_nobody_fences_is_dropped_not_rearmed_forever() -> None:
    """Defence in depth: a due lease that ``on_due`` did not fence (its request is gone) is forgotten, so the timer
    fires once for it, not in a loop."""
    from gateway.admission.shared.fencing import Fences

    calls: list[list[int]] = []
    fences = Fences(lease_ttl_s=0.2, fence_margin_s=0.1, on_due=calls.append)
    fences.confirm([7], asyncio.get_running_loop().time())
    await until(lambda: calls)
    await asyncio.sleep(0.1)  # a timer re-armed at a past deadline would have fired hundreds of times by now
    assert calls == [[7]] and 7 not in fences.book
    fences.close()
