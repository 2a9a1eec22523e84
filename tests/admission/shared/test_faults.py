"""Fault injection on the shared ledger (issue 23, point 1): Redis killed, paused, restarted empty; a replica killed,
paused, cut off from Redis only; 102 tenants with one 2,000-token request each over three replicas.

Each replica is a waiting room and its ``SharedPools`` in this process, with its own path to one real redis-server
through a ``CuttableProxy`` (so it can be cut off alone). The backend is a ledger of what runs at once: a request
runs from its admission until it ends or is fenced (closing its connection stops it there), so "max held" is what a
llama-server's unified pool would hold. Every case must show 0 overruns (max held never above the pool) and 0 leaks
(the ledger in Redis, and every replica's, back to 0 after). ``pytest -s`` prints the table.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from gateway.admission import Ledger, PoolSpec, RequestCost, WaitingRoom
from gateway.admission.rejections import AdmissionRejected
from gateway.admission.shared.fencing import fenced
from gateway.admission.shared.shared_pools import SharedPools
from gateway.admission.shared.store import SharedStore
from gateway.admission.types import Policy
from gateway.config.shared_ledger import SharedLedgerSettings
from gateway.support.tasks import stop
from tests.support.llama_server import free_port
from tests.support.poll import until
from tests.support.redis_server import RunningRedis, running_redis
from tests.support.tcp_cut import CuttableProxy

POOL = PoolSpec.unified_pool("ls", "", pool_tokens=8_192, slots=4)
POLICY = Policy(queue_timeout_s=8.0, overtake_window_s=0.5)
TTL_S, MARGIN_S = 1.0, 0.3
FAULT_S = 3 * TTL_S
"""A fault "past every lease's deadline" lasts 3x the ttl: every lease renewed before it has lapsed by then."""
PAUSED_TTL_S, PAUSE_S = 3.0, 0.5
"""A pause "under the fence deadline": the first fence may come ttl - margin - ttl / 3 (the renewal period) = 1.7 s
after the pause begins, over 3x the pause; so in that case alone the leases last 3 s."""
TENANTS = 102
RUN_S = 0.06
LONG_S = 2.0  # replica 0's three long requests (7,599 of 8,192 tokens, as in the issue), running when the fault hits
ROWS: list[str] = []


@dataclass
class Backend:
    """What runs at the backend at once, in tokens."""

    held_tokens: int = 0
    max_held_tokens: int = 0

    @contextlib.contextmanager
    def running(self, tokens: int) -> Any:
        self.held_tokens += tokens
        self.max_held_tokens = max(self.max_held_tokens, self.held_tokens)
        try:
            yield
        finally:
            self.held_tokens -= tokens


@dataclass
class Replica:
    path: CuttableProxy
    shared: SharedPools
    room: WaitingRoom
    runner: asyncio.Task[None]
    requests: set[asyncio.Task[None]] = field(default_factory=set)

    def kill(self) -> None:
        """SIGKILL: nothing more reaches Redis from it; its connections to the backend close (its requests end)."""
        self.path.cut()
        self.runner.cancel()
        for task in self.requests:
            task.cancel()


@dataclass
class Tally:
    admitted: int = 0
    fenced: int = 0
    refused: int = 0
    killed: int = 0  # ended with their replica (SIGKILL)
    decided: int = 0  # past the waiting room: admitted, refused or killed there


@contextlib.asynccontextmanager
async def replica(port: int, on_unreachable: str, ttl_s: float) -> AsyncIterator[Replica]:
    async with CuttableProxy(port) as path:
        settings: dict[str, Any] = {"redis_url": path.url, "lease_ttl_s": ttl_s, "fence_margin_s": MARGIN_S,
                                    "poll_s": 0.02, "timeout_s": 0.1, "on_unreachable": on_unreachable, "replicas": 3}
        config = SharedLedgerSettings(**settings)
        shared = SharedPools(SharedStore.from_url(path.url, prefix="kvgate", timeout_s=0.1), config)
        room = WaitingRoom(Ledger(), shared=shared)
        runner = asyncio.create_task(shared.run(room.waiting_keys, room.redispatch))
        try:
            yield Replica(path, shared, room, runner)
        finally:
            await stop(runner)  # cancelled again until it ends: Python 3.11 may lose one (gateway/support/tasks.py)
            await shared.close()


async def _request(one: Replica, index: int, backend: Backend, tally: Tally, hold_s: float,
                   tokens: int = 2_000) -> None:
    cost = RequestCost(tokens - 100, True, 100, None, f"tenant{index}")
    try:
        permit = await one.room.acquire(POOL.key, POOL, cost, POLICY)
    except AdmissionRejected:
        tally.refused += 1
        tally.decided += 1
        return
    except asyncio.CancelledError:
        tally.killed += 1
        tally.decided += 1
        return
    tally.decided += 1
    try:
        with fenced(one.shared.fences, permit.reservation.id), backend.running(permit.reservation.tokens):
            await asyncio.sleep(hold_s)  # the request runs at the backend this long
        tally.admitted += 1
    except AdmissionRejected:
        tally.fenced += 1
    except asyncio.CancelledError:
        tally.killed += 1
    finally:
        permit.release()


Fault = Callable[[list[Replica], "RedisBox"], Awaitable[None]]


@dataclass
class RedisBox:
    """The one redis-server, on a fixed port so it can be killed and started again (empty)."""

    port: int
    server: contextlib.ExitStack
    running: RunningRedis | None = None

    def start(self) -> None:
        self.running = self.server.enter_context(running_redis(port=self.port))

    def kill(self) -> None:
        assert self.running is not None
        self.running.process.kill()
        self.running.process.wait()

    def signal(self, sig: int) -> None:
        assert self.running is not None
        os.kill(self.running.process.pid, sig)


async def _kill_redis(replicas: list[Replica], redis: RedisBox) -> None:
    redis.kill()
    await asyncio.sleep(FAULT_S)  # the outage: past every lease's deadline, the requests still running are fenced
    redis.start()  # empty


async def _pause_redis(replicas: list[Replica], redis: RedisBox) -> None:
    redis.signal(signal.SIGSTOP)
    await asyncio.sleep(FAULT_S)  # the outage itself
    redis.signal(signal.SIGCONT)


async def _restart_redis(replicas: list[Replica], redis: RedisBox) -> None:
    redis.kill()
    redis.start()  # at once, empty: the running requests come back (capacity-checked) before new ones


async def _kill_replica(replicas: list[Replica], redis: RedisBox) -> None:
    replicas[0].kill()


async def _pause_replica(replicas: list[Replica], redis: RedisBox) -> None:
    replicas[0].path.pause()  # nothing it sends arrives, nothing comes back: under its fence deadline
    await asyncio.sleep(PAUSE_S)  # the pause itself
    replicas[0].path.resume()


async def _cut_off_replica(replicas: list[Replica], redis: RedisBox) -> None:
    replicas[0].path.pause()  # replica 0 alone: the others still reach Redis
    await asyncio.sleep(FAULT_S)  # the outage itself
    replicas[0].path.resume()


async def _held_then_redis_killed(replicas: list[Replica], redis: RedisBox) -> None:
    redis.kill()
    await asyncio.sleep(FAULT_S)  # the outage itself
    redis.start()


CASES: dict[str, tuple[str, Fault, float]] = {  # on_unreachable, the fault, lease_ttl_s
    f"redis killed {FAULT_S:g} s": ("refuse", _kill_redis, TTL_S),
    f"redis paused {FAULT_S:g} s": ("refuse", _pause_redis, TTL_S),
    "redis restarted empty": ("refuse", _restart_redis, TTL_S),
    "replica killed": ("refuse", _kill_replica, TTL_S),
    f"replica paused {PAUSE_S:g} s": ("refuse", _pause_replica, PAUSED_TTL_S),
    f"replica cut off {FAULT_S:g} s": ("refuse", _cut_off_replica, TTL_S),
    "local_share, redis killed": ("local_share", _held_then_redis_killed, TTL_S),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_faults_never_overrun_the_pool_nor_leak(case: str) -> None:
    on_unreachable, fault, ttl_s = CASES[case]
    backend, tally = Backend(), Tally()
    with contextlib.ExitStack() as stack:
        redis = RedisBox(free_port(), stack)
        redis.start()
        async with contextlib.AsyncExitStack() as replicas_stack:
            replicas = [await replicas_stack.enter_async_context(replica(redis.port, on_unreachable, ttl_s))
                        for _ in range(3)]
            for index in range(3):  # issue 23: replica 0 holds 7,599 of 8,192 when the fault hits
                _spawn(replicas[0], _request(replicas[0], 1_000 + index, backend, tally, LONG_S, tokens=2_533))

            def long_requests_running() -> bool:
                return backend.held_tokens == 3 * 2_533

            await until(long_requests_running, timeout_s=15)
            for index in range(TENANTS):
                _spawn(replicas[index % 3], _request(replicas[index % 3], index, backend, tally, RUN_S))

            def every_request_arrived() -> bool:  # 593 tokens free: the short ones wait (unless, slowed, they got in)
                return sum(_waiting_here(one) for one in replicas) + tally.decided == TENANTS + 3

            await until(every_request_arrived, timeout_s=15)
            await fault(replicas, redis)
            every = [task for one in replicas for task in one.requests]
            await asyncio.wait_for(asyncio.gather(*every, return_exceptions=True), timeout=15)
            local = sum(one.room.ledger.snapshot(POOL.key).reserved_tokens for one in replicas)
        leaked = await _leaked_tokens(redis.port, ttl_s)
    row = (f"  {case:<26} | {tally.admitted:>8} | {tally.fenced:>6} | {tally.refused:>7} | {tally.killed:>6} | "
           f"{backend.max_held_tokens:>6,} / {POOL.pool_tokens:,} | {leaked + local:>6}")
    ROWS.append(row)
    print("\n  case                       | admitted | fenced | refused | killed | max held / pool | leaked\n"
          + "\n".join(ROWS))
    assert tally.admitted + tally.fenced + tally.refused + tally.killed == TENANTS + 3
    assert backend.max_held_tokens <= POOL.pool_tokens, "overrun"
    assert leaked + local == 0, "leaked"
    assert tally.admitted >= 1  # the fleet kept serving around the fault (refuse mode refuses while it is down)


def _waiting_here(one: Replica) -> int:
    stats = one.room.stats().get(POOL.key)
    return 0 if stats is None else stats.queued


def _spawn(one: Replica, coro: Awaitable[None]) -> None:
    task = asyncio.ensure_future(coro)
    one.requests.add(task)


async def _leaked_tokens(port: int, ttl_s: float) -> int:
    """What the ledger in Redis still holds once every lease not released has expired (a script purges them): it
    waits up to 3x the ttl for that."""
    store = SharedStore.from_url(f"redis://127.0.0.1:{port}/0", prefix="kvgate", timeout_s=1.0)
    try:

        async def ledger_empty() -> bool:
            return (await store.totals(POOL.key)).totals.reserved_tokens == 0

        with contextlib.suppress(AssertionError):  # the caller says how much leaked
            await until(ledger_empty, timeout_s=3 * ttl_s, interval_s=0.05)
        return (await store.totals(POOL.key)).totals.reserved_tokens
    finally:
        await store.close()
