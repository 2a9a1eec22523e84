"""Several kvgate replicas sharing one ledger through a real redis-server (issue 16, points 2 and 3).

The proof: three replicas in front of the simulated llama-server's unified pool, 8 clients spread across them. With
the shared ledger no request meets "Context size has been exceeded."; the same burst through three independent
replicas (each with its own in-process ledger, each admitting up to the whole pool) overruns it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from gateway.admission import Ledger, PoolSpec, RequestCost, WaitingRoom
from gateway.admission.rejections import AdmissionRejected
from gateway.admission.shared.shared_pools import SharedPools
from gateway.admission.shared.store import SharedStore
from gateway.admission.types import Policy, PoolKey
from gateway.config.shared_ledger import SharedLedgerSettings
from gateway.support.tasks import stop
from kvsim.config import SimConfig
from kvsim.runner import start_sim
from tests.support.child_env import child_env
from tests.support.gateway_server import running_gateway
from tests.support.llama_server import free_port
from tests.support.poll import until
from tests.support.redis_server import running_redis

CONTEXT_EXCEEDED = "Context size has been exceeded."
POOL = PoolSpec.unified_pool("ls", "", pool_tokens=10_000, slots=4)
POLICY = Policy(queue_timeout_s=5.0)


def fast(url: str, **changes: Any) -> SharedLedgerSettings:
    settings: dict[str, Any] = {"redis_url": url, "lease_ttl_s": 0.6, "fence_margin_s": 0.2, "poll_s": 0.02,
                                **changes}
    return SharedLedgerSettings(**settings)


@contextlib.asynccontextmanager
async def replica(config: SharedLedgerSettings) -> AsyncIterator[WaitingRoom]:
    assert config.redis_url is not None
    store = SharedStore.from_url(config.redis_url.get_secret_value(), prefix=config.prefix, timeout_s=config.timeout_s,
                                 connections=config.connections)
    shared = SharedPools(store, config)
    room = WaitingRoom(Ledger(), shared=shared)
    task = asyncio.create_task(shared.run(room.waiting_keys, room.redispatch))
    try:
        yield room
    finally:
        await stop(task)
        await shared.close()


def cost(tokens: int, tenant: str = "t") -> RequestCost:
    return RequestCost(tokens - 100, True, 100, None, tenant)


async def test_two_rooms_never_admit_more_than_the_pool_together(redis_url: str) -> None:
    async with replica(fast(redis_url)) as a, replica(fast(redis_url)) as b:
        first = await a.acquire(POOL.key, POOL, cost(6_000), POLICY)
        assert b.shared is not None and b.shared.others(POOL.key).reserved_tokens == 0  # b has not looked yet
        waiting = asyncio.create_task(b.acquire(POOL.key, POOL, cost(6_000), POLICY))  # b plans it fits; Redis: no
        shared = b.shared

        def b_lost_the_race_and_queued() -> bool:
            return b.queue_length(POOL.key) == 1 and shared.lost_races_total == 1

        await until(b_lost_the_race_and_queued)
        assert not waiting.done()
        assert b.shared.others(POOL.key).reserved_tokens == 6_000  # the lost race brought the fresh totals
        first.release()  # on replica a: b sees it within poll_s
        second = await asyncio.wait_for(waiting, timeout=1.0)
        assert second.reservation.tokens == 6_000
        second.release()


async def test_a_dead_replicas_leases_expire_and_the_pool_is_whole_again(redis_url: str) -> None:
    ttl_s = 0.6
    async with replica(fast(redis_url)) as survivor:
        dead = SharedStore.from_url(redis_url, prefix="kvgate", timeout_s=1.0)
        for _ in range(3):  # a replica that took 9,000 tokens and then died: nobody renews its leases
            held = Ledger().reserve(POOL.key, 3_000, "t")
            assert (await dead.reserve(held, survivor_limits(), ttl_s=ttl_s)).verdict == "ok"
        await dead.close()
        started_s = asyncio.get_running_loop().time()
        permit = await survivor.acquire(POOL.key, POOL, cost(9_000), POLICY)
        waited_s = asyncio.get_running_loop().time() - started_s
        # it waited for the leases to expire (ttl_s), then got the whole pool back: bounds 3x either side of the ttl
        assert ttl_s / 3 < waited_s < 3 * ttl_s
        permit.release()


def survivor_limits() -> Any:
    from gateway.admission.shared.snapshots import limits_for
    return limits_for(POOL, POLICY)


async def test_redis_unreachable_refuses_or_falls_back_to_a_share(redis_url: str) -> None:
    gone = "redis://127.0.0.1:1/0"  # nothing listens there
    async with replica(fast(gone, timeout_s=0.2)) as refusing:
        with pytest.raises(AdmissionRejected) as caught:
            await refusing.acquire(POOL.key, POOL, cost(1_000), POLICY)
        assert (caught.value.status, caught.value.code) == (503, "ledger_unavailable")
        assert "Redis" in caught.value.message and caught.value.retry_after_s == 1.0
    async with replica(fast(gone, timeout_s=0.2, on_unreachable="local_share", replicas=2)) as sharing:
        first = await sharing.acquire(POOL.key, POOL, cost(5_000), POLICY)  # lost its commit, planned again
        assert sharing.shared is not None and not sharing.shared.up
        with pytest.raises(AdmissionRejected):  # 1/2 of 10,000 is taken: the next one waits, then times out
            await sharing.acquire(POOL.key, POOL, cost(1_000), Policy(queue_timeout_s=0.2))
        first.release()


async def _post_spread(urls: list[str], body: dict[str, Any], clients: int) -> list[tuple[int, str]]:
    async with aiohttp.ClientSession() as http:
        async def one(index: int) -> tuple[int, str]:
            async with http.post(f"{urls[index % len(urls)]}/v1/chat/completions", json=body) as response:
                return response.status, await response.text()
        return await asyncio.gather(*(one(i) for i in range(clients)))


@pytest.mark.parametrize("shared", [False, True], ids=["three ledgers", "one shared ledger"])
async def test_three_replicas_share_one_unified_pool_and_three_independent_ones_overrun_it(
    redis_url: str, shared: bool,
) -> None:
    config = SimConfig(mode="llama-server", ctx_size=8192, time_scale=80.0, gen_tokens_per_s=400.0)
    words = " ".join(f"w{i}" for i in range(1200))
    body = {"model": "llama3.1:8b", "max_tokens": 1200, "messages": [{"role": "user", "content": words}]}
    runner, sim = await start_sim(config)
    overrides: dict[str, Any] = {"shared_ledger": {"redis_url": redis_url, "lease_ttl_s": 2, "poll_s": 0.02}}
    try:
        async with contextlib.AsyncExitStack() as stack:
            urls = [await stack.enter_async_context(
                running_gateway([{"name": "ls", "kind": "llama-server", "url": sim}],
                                **(overrides if shared else {}))) for _ in range(3)]
            results = await _post_spread(urls, body, clients=8)
    finally:
        await runner.cleanup()
    overrun = sum(1 for status, text in results if CONTEXT_EXCEEDED in text)
    print(f"\n  {'one shared ledger' if shared else 'three ledgers':<18} 8 clients on 3 replicas: "
          f"{sum(1 for s, _ in results if s == 200)} ok, {overrun} 'Context size has been exceeded.'")
    if not shared:
        assert overrun >= 1  # what the shared ledger prevents
        return
    assert [status for status, _ in results] == [200] * 8, results
    client = aioredis.Redis.from_url(redis_url)
    leases = [key async for key in client.scan_iter("kvgate:pool:*:leases")]
    assert [await client.hlen(key) for key in leases] == [0] * len(leases)  # every lease was released
    await client.aclose()


async def test_a_replica_killed_mid_run_loses_its_leases_within_the_ttl(redis_url: str) -> None:
    """A real ``kvgate serve`` replica holds two long answers, then gets SIGKILL: nothing releases its leases, and
    they expire within ``lease_ttl_s``; the surviving replica then has the whole pool."""
    config = SimConfig(mode="llama-server", ctx_size=8192, time_scale=1.0, gen_tokens_per_s=50.0)
    runner, sim = await start_sim(config)
    ttl_s = 0.5
    env = child_env({"KVGATE_SHARED_LEDGER__REDIS_URL": redis_url, "KVGATE_SHARED_LEDGER__LEASE_TTL_S": str(ttl_s),
                     "KVGATE_SHARED_LEDGER__FENCE_MARGIN_S": "0.2"})
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--port", "0", "--backend", f"llama-server={sim}",
        stderr=asyncio.subprocess.PIPE, env=env,
    )
    store = SharedStore.from_url(redis_url, prefix="kvgate", timeout_s=1.0)
    try:
        url = await _listening(process)
        words = " ".join(f"w{i}" for i in range(1000))
        body = {"model": "m", "max_tokens": 2000, "stream": True, "messages": [{"role": "user", "content": words}]}
        async with aiohttp.ClientSession() as http:
            streams = [await http.post(f"{url}/v1/chat/completions", json=body) for _ in range(2)]
            for stream in streams:
                assert stream.status == 200
                await stream.content.readline()  # admitted and answering
            key = await _only_pool(redis_url)
            held = (await store.totals(key)).totals
            assert held.active_sequences == 2 and held.reserved_tokens > 5_000
            process.kill()  # SIGKILL: no release, no goodbye
            await process.wait()
            killed_s = asyncio.get_running_loop().time()

            async def the_killed_replicas_leases_expired() -> bool:
                return not (await store.totals(key)).totals.active_sequences

            await until(the_killed_replicas_leases_expired, timeout_s=3 * ttl_s, interval_s=0.05)
            expired_after_s = asyncio.get_running_loop().time() - killed_s
            for stream in streams:
                stream.close()
        print(f"\n  SIGKILL: 2 leases ({held.reserved_tokens:,} tokens) gone {expired_after_s:.2f} s later "
              f"(lease_ttl_s = {ttl_s})")
        assert (await store.totals(key)).totals.reserved_tokens == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await store.close()
        await runner.cleanup()


async def _listening(process: asyncio.subprocess.Process) -> str:
    assert process.stderr is not None
    while True:
        line = (await asyncio.wait_for(process.stderr.readline(), timeout=20)).decode()
        assert line, "kvgate serve exited before listening"
        match = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        if match:
            return match.group(1)


async def _only_pool(redis_url: str) -> PoolKey:
    """The one pool the replicas reserved in (its key as kvgate named it)."""
    client = aioredis.Redis.from_url(redis_url)
    try:
        names = [name.decode() async for name in client.scan_iter("kvgate:pool:*:leases")]
    finally:
        await client.aclose()
    assert len(names) == 1, names
    _, _, length, rest = names[0].split(":", 3)
    backend = rest[: int(length)]
    return PoolKey(backend, rest[int(length) + 1: -len(":leases")])


async def test_when_redis_comes_back_the_replica_shares_again_and_its_leases_are_counted() -> None:
    """Redis down at first: local_share admits into this replica's share; once Redis answers, the renewal adds the
    lease still held to the shared totals and admission is shared again."""
    port = free_port()
    config = fast(f"redis://127.0.0.1:{port}/0", timeout_s=0.2, on_unreachable="local_share", replicas=2)
    async with replica(config) as room:
        held = await room.acquire(POOL.key, POOL, cost(3_000), POLICY)
        assert room.shared is not None and not room.shared.up
        with running_redis(port=port) as server:
            shared = room.shared

            def the_replica_sees_redis_up() -> bool:
                return shared.up

            await until(the_replica_sees_redis_up, interval_s=0.05)
            store = SharedStore.from_url(server.url, prefix="kvgate", timeout_s=1.0)
            totals = (await store.totals(POOL.key)).totals
            await store.close()
            assert (totals.reserved_tokens, totals.active_sequences) == (3_000, 1)  # the held lease, counted
            held.release()


async def test_freed_room_goes_to_the_fair_order_across_replicas_and_wakes_the_other_replica(redis_url: str) -> None:
    """Replica a holds the pool with tenant batch and has 4 more batch requests queued; replica b has one code
    request queued (tag: the pool's virtual time, ahead of batch's backlog). When a frees room, b's code request gets
    it, not a's own next waiter; and b hears of it at once, though it reads the pool's totals only every 2 s."""
    slow = fast(redis_url, poll_s=2.0)
    order: list[str] = []
    async with replica(fast(redis_url)) as a, replica(slow) as b:
        fill = [await a.acquire(POOL.key, POOL, cost(5_000, "batch"), POLICY) for _ in range(2)]

        async def take(room: WaitingRoom, label: str, tokens: int, tenant: str) -> float:
            started_s = asyncio.get_running_loop().time()
            permit = await room.acquire(POOL.key, POOL, cost(tokens, tenant), POLICY)
            order.append(label)
            waited_s = asyncio.get_running_loop().time() - started_s
            await asyncio.sleep(0.05)  # the request runs this long
            permit.release()
            return waited_s

        backlog = [asyncio.create_task(take(a, f"a: batch {n}", 4_500, "batch")) for n in range(4)]

        def a_queued_its_backlog() -> bool:
            return a.queue_length(POOL.key) == 4

        await until(a_queued_its_backlog)
        code = asyncio.create_task(take(b, "b: code", 1_000, "code"))

        def b_hears_of_all_five() -> bool:  # its own and a's 4, as Redis announced them
            return b.queue_length(POOL.key) == 5

        await until(b_hears_of_all_five)
        assert order == []
        released_s = asyncio.get_running_loop().time()
        fill[0].release()  # 5,000 free: a's next batch request (4,500) would fit, but code's tag is lower
        await asyncio.wait_for(code, timeout=1.5)
        code_after_s = asyncio.get_running_loop().time() - released_s
        fill[1].release()
        await asyncio.wait_for(asyncio.gather(*backlog), timeout=5)
    print(f"\n  admitted in order: {order}; b's code request admitted {code_after_s * 1000:.0f} ms after a freed "
          f"room (b polls every 2 s)")
    assert order[0] == "b: code"
    assert code_after_s < 0.5  # woken by the release, not by its 2 s poll
    assert b.shared is not None and b.shared.wakeups_total >= 1


async def _backlogged_shares(redis_url: str, policy: Policy, run_s: float = 2.5) -> dict[str, float]:
    """Three replicas on one pool, every tenant backlogged: flood (weight 1) with 12 clients on each of replicas a
    and b, requests of 2,500 tokens; a (weight 1) and b (weight 2) with 6 clients each on replica c, 1,000 tokens.
    Each admitted request holds its reservation 40 ms. Answers each tenant's share of the reserved tokens admitted
    after a warm-up."""
    got: dict[str, int] = {"flood": 0, "a": 0, "b": 0}
    weights = {"flood": 1.0, "a": 1.0, "b": 2.0}
    loop = asyncio.get_running_loop()
    async with replica(fast(redis_url)) as ra, replica(fast(redis_url)) as rb, replica(fast(redis_url)) as rc:
        warm_s, end_s = loop.time() + 0.5, loop.time() + 0.5 + run_s

        async def client(room: WaitingRoom, tenant: str, tokens: int) -> None:
            while loop.time() < end_s:
                request = RequestCost(tokens - 100, True, 100, None, tenant, weight=weights[tenant])
                try:
                    permit = await room.acquire(POOL.key, POOL, request, policy)
                except AdmissionRejected:
                    continue
                if warm_s <= loop.time() < end_s:
                    got[tenant] += permit.reservation.tokens
                await asyncio.sleep(0.04)  # the request runs this long
                permit.release()

        clients = [client(room, "flood", 2_500) for room in (ra, rb) for _ in range(12)]
        clients += [client(rc, tenant, 1_000) for tenant in ("a", "b") for _ in range(6)]
        await asyncio.gather(*clients)
    total = sum(got.values())
    return {tenant: tokens / total for tenant, tokens in got.items()}


async def test_backlogged_tenants_on_different_replicas_get_their_weighted_shares(redis_url: str) -> None:
    """One fair order across replicas: flood's 24 clients on two replicas get its weight's share (1/4), not most of
    the pool; in arrival order they do."""
    fair = {"flood": 0.25, "a": 0.25, "b": 0.50}
    shares = await _backlogged_shares(redis_url, Policy(queue_timeout_s=5.0))
    arrival = await _backlogged_shares(redis_url, Policy(queue_timeout_s=5.0, fair_queueing=False))
    print("\n  tenant (weight)   fair   fair order   arrival order")
    for tenant, share in fair.items():
        print(f"  {tenant:<17} {share:>5.0%} {shares[tenant]:>11.1%} {arrival[tenant]:>15.1%}")
    for tenant, share in fair.items():
        assert shares[tenant] >= 0.9 * share, (tenant, shares)
    assert arrival["flood"] > 0.4  # what the fair order prevents
