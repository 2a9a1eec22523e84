"""The GPU leases across replicas (gateway/loads/shared_gpu.py, backend_lock.py) on a real redis-server: one holder
per backend, loads in flight seen by the others, a dead holder's lease expiring, Redis unreachable."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.errors import GpuLedgerUnavailable
from gateway.loads.backend_lock import BackendLock
from gateway.loads.shared_gpu import GpuLedgerUnreachable, InFlight, SharedGpu
from tests.support.llama_server import free_port
from tests.support.poll import until
from tests.support.redis_server import RunningRedis, running_redis

TTL_S = 0.6
POLL_S = 0.01


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RunningRedis]:
    with running_redis() as server:
        yield server


@pytest.fixture
async def replicas(redis_server: RunningRedis) -> AsyncIterator[list[SharedGpu]]:
    """Two replicas' views of one Redis, each on its own client, as two kvgate processes have."""
    clients = [aioredis.Redis.from_url(redis_server.url) for _ in range(2)]
    await clients[0].flushall()
    yield [SharedGpu(client, prefix="kvgate", replica=name, ttl_s=TTL_S, poll_s=POLL_S)
           for client, name in zip(clients, ("a", "b"), strict=True)]
    for client in clients:
        await client.aclose()


async def test_one_replica_holds_a_backend_at_a_time_and_the_next_sees_what_it_loaded(
    replicas: list[SharedGpu],
) -> None:
    a, b = replicas
    held = await a.hold("gpu-host")
    waiting = asyncio.ensure_future(b.hold("gpu-host"))
    other = await b.hold("another-host")  # another backend's lease is another lease
    await asyncio.sleep(TTL_S)  # a's lease outlives its ttl: it is renewed while held
    assert not waiting.done() and not held.lost
    held.loaded("qwen2.5:32b")
    await held.release()
    theirs = await asyncio.wait_for(waiting, timeout=3 * TTL_S)
    assert [(seen.model, seen.age_s < 3 * TTL_S) for seen in theirs.loaded_elsewhere] == [("qwen2.5:32b", True)]
    assert b.waits_total == 1
    await theirs.release()
    await other.release()
    mine = await a.hold("gpu-host")
    assert mine.loaded_elsewhere == ()  # its own load is not "elsewhere" to itself
    await mine.release()


async def test_a_load_in_flight_counts_for_the_other_replicas_only_until_it_ends(replicas: list[SharedGpu]) -> None:
    a, b = replicas
    held = await a.hold("gpu-host")
    assert await b.in_flight("gpu-host") is None  # held, deciding: nothing in flight yet
    await held.loading("gemma3:27b", 20_000_000_000)
    assert await b.in_flight("gpu-host") == InFlight("gemma3:27b", 20_000_000_000, "a")
    assert await a.in_flight("gpu-host") is None  # its own load is in its own reservations already
    await held.release()
    assert await b.in_flight("gpu-host") is None


async def test_a_replica_that_dies_mid_load_releases_its_lease_by_expiry(replicas: list[SharedGpu]) -> None:
    a, b = replicas
    held = await a.hold("gpu-host")
    await held.loading("gemma3:27b", 20_000_000_000)
    held.abandon()  # SIGKILL: no release, no renewal
    started = time.monotonic()
    theirs = await asyncio.wait_for(b.hold("gpu-host"), timeout=3 * TTL_S)
    waited_s = time.monotonic() - started
    assert waited_s >= TTL_S / 3  # it did wait for the lease (renewed last as it was taken)
    assert await a.in_flight("gpu-host") is None  # the dead load's bytes went with it
    await held.release()  # the dead one's late release (a replica that only stalled) frees nothing of b's
    assert await a.in_flight("gpu-host") is None and await _holder(a, "gpu-host") == theirs.token
    await theirs.release()


async def test_a_lease_lost_while_held_is_said_and_its_release_frees_nobody_elses(
    replicas: list[SharedGpu], redis_server: RunningRedis,
) -> None:
    a, b = replicas
    held = await a.hold("gpu-host")
    client = aioredis.Redis.from_url(redis_server.url)
    await client.flushall()  # Redis restarted empty
    await client.aclose()
    theirs = await b.hold("gpu-host")
    await until(lambda: held.lost, timeout_s=3 * TTL_S)
    await held.release()
    assert await _holder(b, "gpu-host") == theirs.token
    await theirs.release()


async def test_a_release_ends_even_when_the_redis_client_loses_the_renewals_cancel(replicas: list[SharedGpu]) -> None:
    """A cancel that lands while a renewal's script call is in flight was lost inside the Redis client about one run
    in ten: ``release`` then waited for ever on a renewal that went on renewing. A renewal that swallows its cancel
    (a fake of that client, around the real script) must not hold the release up, nor keep the lease."""
    a, b = replicas
    held = await a.hold("gpu-host")
    real_renew, in_call = a._renew, asyncio.Event()

    test_over = False

    async def renew_losing_the_cancel(*, keys: list[str], args: list[Any]) -> Any:
        if test_over:  # ends a renewal that went on (the failure this test is about)
            raise RuntimeError("the test is over")
        if not in_call.is_set():
            in_call.set()
            with contextlib.suppress(asyncio.CancelledError):  # the client's part: the cancel goes no further
                await asyncio.sleep(TTL_S / 6)
        return await real_renew(keys=keys, args=args)

    a._renew = renew_losing_the_cancel  # type: ignore[assignment]  # a fake of the client's script call
    await asyncio.wait_for(in_call.wait(), timeout=TTL_S)  # a renewal in flight
    release = asyncio.ensure_future(held.release())
    try:
        done, _ = await asyncio.wait({release}, timeout=TTL_S)
        assert release in done, "release waits on a renewal that lost its cancel (it renews on, for ever)"
    finally:
        test_over = True
        await asyncio.wait({release}, timeout=2 * TTL_S)
        if release.done() and not release.cancelled():
            release.exception()  # read: a failed run's RuntimeError is not reported twice
    theirs = await asyncio.wait_for(b.hold("gpu-host"), timeout=TTL_S / 2)  # given back, not left to expire
    assert await _holder(b, "gpu-host") == theirs.token
    await theirs.release()


async def _holder(gpu: SharedGpu, backend: str) -> str:
    value = await gpu._redis.hget(gpu._keys(backend)[0], "holder")
    return "" if value is None else value.decode() if isinstance(value, bytes) else str(value)


@pytest.mark.parametrize("on_unreachable", ["refuse", "local_share"])
async def test_redis_unreachable_refuses_the_decision_or_decides_alone(on_unreachable: str) -> None:
    client = aioredis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.5)
    gone = SharedGpu(client, prefix="kvgate", replica="a", ttl_s=TTL_S)
    with pytest.raises(GpuLedgerUnreachable):
        await gone.hold("gpu-host")
    lock = BackendLock("gpu-host", gone, "refuse" if on_unreachable == "refuse" else "local_share")
    if on_unreachable == "refuse":
        with pytest.raises(GpuLedgerUnavailable) as refused:
            async with lock:
                raise AssertionError("decided without the lease")
        assert refused.value.status == 503 and refused.value.code == "ledger_unavailable"
        assert "shared_ledger.on_unreachable" in str(refused.value) and refused.value.retry_after_s == 1.0
    else:
        async with lock:
            assert lock.held is None and lock.locked()
    assert not lock.locked()  # the local lock is free again either way
    await client.aclose()


async def test_the_local_lock_queues_a_replicas_own_tasks_before_redis(replicas: list[SharedGpu]) -> None:
    """Two tasks of one replica: the second waits on the local lock, so only the holder's calls reach Redis."""
    a, _ = replicas
    lock = BackendLock("gpu-host", a)
    order: list[str] = []

    async def decide(name: str) -> None:
        async with lock:
            assert lock.held is not None
            order.append(f"{name} in")
            await asyncio.sleep(0.05)
            order.append(f"{name} out")

    await asyncio.gather(decide("first"), decide("second"))
    assert order == ["first in", "first out", "second in", "second out"]
    assert a.waits_total == 0  # the second never found the lease held in Redis: it queued in process


async def test_changes_are_announced_to_the_other_replicas_and_a_lost_channel_reads_everything_anew(
    replicas: list[SharedGpu], redis_server: RunningRedis,
) -> None:
    a, b = replicas
    heard: list[tuple[str, tuple[str, ...]]] = []
    missed: list[bool] = []
    following = asyncio.ensure_future(b.follow(lambda backend, models: heard.append((backend, models)),
                                               lambda: missed.append(True)))
    client = aioredis.Redis.from_url(redis_server.url)

    async def b_listens() -> bool:
        return bool((await client.pubsub_numsub(b.channel))[0][1])

    await until(b_listens)
    for hostile in (b"not json", b'{"backend": 1, "replica": "a", "models": []}', b'{"models": ["x"]}',
                    b'{"backend": "gpu-host", "replica": "a", "models": [1]}'):
        await client.publish(b.channel, hostile)  # ignored (and logged), never a crash of the listener
    mine = await b.hold("gpu-host")
    mine.unloaded("llama3.1:8b")
    await mine.release()  # b's own announcement: not news to b
    held = await a.hold("gpu-host")
    held.unloaded("gemma3:27b")
    held.loaded("qwen2.5:32b")
    await held.release()
    quiet = await a.hold("gpu-host")
    await quiet.release()  # nothing changed: nothing announced
    await until(lambda: heard)
    await client.client_kill_filter(_type="pubsub")  # the channel is lost a while
    await until(lambda: missed, timeout_s=3 * 1.0 + 2)  # FOLLOW_RETRY_S later, subscribed again
    following.cancel()
    await asyncio.gather(following, return_exceptions=True)
    await client.aclose()
    assert heard == [("gpu-host", ("gemma3:27b", "qwen2.5:32b"))]
    assert missed == [True]
