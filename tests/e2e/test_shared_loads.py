"""Issue 27, point 1: one GPU ledger across replicas (gateway/loads/shared_gpu.py), end to end.

Three kvgate replicas in front of one simulated Ollama on a 24 GiB GPU, with three models no two of which fit
together (qwen2.5:32b ~23.5 GiB at the context that fits, gemma3:27b ~18.7 GiB, llama3.1:8b ~8.8 GiB at its default
32768 context), and concurrent requests for different models through different replicas. The simulator's own
counters (/sim/stats) are the truth: loads, evictions (a load Ollama's own scheduler had to make room for, i.e. one
kvgate did not plan), load failures, runtime out-of-memory crashes. Replicas that each decide alone evict each other's
fresh loads and fail requests; sharing the ledger in Redis, the loads are decided one replica at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from tests.e2e.test_load_admission import backend_for, call, chat, simulator, stats
from tests.support.gateway_server import running_gateway
from tests.support.poll import until
from tests.support.redis_server import RunningRedis, running_redis
from tests.support.serve_process import listening, serve_process

MODELS = ("qwen2.5:32b", "gemma3:27b", "llama3.1:8b")
REPLICAS = 3
REQUESTS = 9


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RunningRedis]:
    with running_redis() as server:
        yield server


async def _burst(redis_url: str | None) -> tuple[list[tuple[int, Any]], dict[str, Any]]:
    """REQUESTS chats at once, model i % 3 through replica i % 3; the statuses and the simulator's counters."""
    overrides: dict[str, Any] = {"residency": {"min_resident_s": 0.0, "load_wait_s": 30.0}}
    if redis_url is not None:
        overrides["shared_ledger"] = {"redis_url": redis_url, "lease_ttl_s": 2.0, "poll_s": 0.02}
    async with simulator(time_scale=5.0) as sim, contextlib.AsyncExitStack() as stack:
        urls = [await stack.enter_async_context(running_gateway([backend_for(sim)], **overrides))
                for _ in range(REPLICAS)]
        results = await asyncio.gather(*(chat(urls[i % REPLICAS], MODELS[i % len(MODELS)],
                                              options={"num_predict": 96}) for i in range(REQUESTS)))
        return [(status, body) for status, _, body in results], await stats(sim)


@pytest.mark.parametrize("shared", [False, True], ids=["three independent replicas", "one shared GPU ledger"])
async def test_replicas_sharing_the_ledger_load_one_at_a_time_and_no_load_fails(
    redis_server: RunningRedis, shared: bool
) -> None:
    if shared:
        client = aioredis.Redis.from_url(redis_server.url)
        await client.flushall()
        await client.aclose()
    results, sim = await _burst(redis_server.url if shared else None)
    statuses = [status for status, _ in results]
    failed = sum(1 for status in statuses if status != 200)
    label = "one shared GPU ledger" if shared else "three independent replicas"
    print(f"\n  {label:<27} {REQUESTS} requests, {len(MODELS)} models, {REPLICAS} replicas: {REQUESTS - failed} ok, "
          f"{failed} failed; simulator: loads {sim['loads']}, evictions by Ollama {sim['evictions']}, load failures "
          f"{sim['load_failures']}, runtime OOMs {sim['runtime_ooms']}, partial offloads {sim['partial_offloads']}")
    if not shared:  # what the shared GPU ledger prevents: Ollama evicting a load kvgate did not plan, failed requests
        assert failed + sim["evictions"] + sim["load_failures"] + sim["runtime_ooms"] >= 1, (statuses, sim)
        return
    assert statuses == [200] * REQUESTS, results
    assert (sim["evictions"], sim["load_failures"], sim["runtime_ooms"]) == (0, 0, 0), sim
    assert sim["loads"] <= REQUESTS
    client = aioredis.Redis.from_url(redis_server.url)
    leases = [key async for key in client.scan_iter("kvgate:gpu:*") if not key.endswith(b":loaded")]
    loaded = await client.hgetall(f"kvgate:gpu:{len('sim')}:sim:loaded")
    await client.aclose()
    assert leases == []  # every lease was given back
    assert {_text(name) for name in loaded} <= set(MODELS) and loaded  # the loads every replica reads


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def test_a_model_another_replica_runs_requests_on_is_not_unloaded_as_idle(redis_server: RunningRedis) -> None:
    """Replica a runs a long answer on gemma3:27b; replica b, which never served gemma, is asked for qwen2.5:32b,
    which fits only once gemma is unloaded. b reads a's lease in gemma's pool before it decides, so it waits for the
    answer to end (rather than unloading the model under it), then unloads gemma and loads qwen."""
    client = aioredis.Redis.from_url(redis_server.url)
    await client.flushall()
    ttl_s = 1.5
    overrides: dict[str, Any] = {"residency": {"min_resident_s": 0.0, "load_wait_s": 30.0},
                                 "shared_ledger": {"redis_url": redis_server.url, "lease_ttl_s": ttl_s,
                                                   "fence_margin_s": 0.4, "poll_s": 0.02}}
    long_answer = {"min_response_tokens": 240, "max_response_tokens": 240, "gen_tokens_per_s": 60.0}  # 4 s
    async with simulator(time_scale=1.0, **long_answer) as sim, \
            running_gateway([backend_for(sim)], **overrides) as a, \
            running_gateway([backend_for(sim)], **overrides) as b:
        running = asyncio.ensure_future(chat(a, "gemma3:27b"))

        async def a_holds_a_lease_in_gemmas_pool() -> bool:
            return any([await client.hlen(key) async for key in client.scan_iter("kvgate:pool:*gemma*:leases")])

        await until(a_holds_a_lease_in_gemmas_pool, timeout_s=10)
        await asyncio.sleep(1.5 * ttl_s)  # past the grace a fresh load from another replica gets: only the lease holds
        asked = await chat(b, "qwen2.5:32b")
        answered = await running
        b_status = await call(b, "GET", "/kvgate/status")
        sim_stats = await stats(sim)
    await client.aclose()
    b_loads = b_status[2]["gpus"][0]["loads"]
    print(f"\n  a on gemma: {answered[0]}; b on qwen: {asked[0]}; b's gate: {b_loads}; simulator: evictions "
          f"{sim_stats['evictions']}, load failures {sim_stats['load_failures']}")
    assert (answered[0], asked[0]) == (200, 200), (answered[2], asked[2])
    assert b_loads["waited"] >= 1 and b_loads["unloads"] == 1 and b_loads["loads"] == 1
    assert (sim_stats["evictions"], sim_stats["load_failures"]) == (0, 0)


async def test_a_model_one_replica_unloads_is_read_anew_by_the_others_so_none_runs_on_a_layout_that_is_gone(
    redis_server: RunningRedis,
) -> None:
    """Two replicas take turns on two models that don't fit together: a on qwen2.5:32b, b on gemma3:27b, a on qwen
    again... Each load unloads the other's model; the unloading replica announces it, so the other reads its pool
    anew and loads through the gate (unloading in turn), instead of sending a request for a model that is gone,
    which Ollama would load on its own, evicting past every check."""
    client = aioredis.Redis.from_url(redis_server.url)
    await client.flushall()
    await client.aclose()
    overrides: dict[str, Any] = {"residency": {"min_resident_s": 0.0, "load_wait_s": 30.0},
                                 "shared_ledger": {"redis_url": redis_server.url, "lease_ttl_s": 2.0,
                                                   "fence_margin_s": 0.5}}
    async with simulator(time_scale=5.0) as sim, \
            running_gateway([backend_for(sim)], **overrides) as a, \
            running_gateway([backend_for(sim)], **overrides) as b:
        statuses = []
        for turn in range(6):
            url, model = (a, "qwen2.5:32b") if turn % 2 == 0 else (b, "gemma3:27b")
            statuses.append((await chat(url, model, options={"num_predict": 16}))[0])
        sim_stats = await stats(sim)
    print(f"\n  6 turns on 2 replicas: {statuses}; simulator: loads {sim_stats['loads']}, unloads "
          f"{sim_stats['unloads']}, evictions by Ollama {sim_stats['evictions']}")
    assert statuses == [200] * 6
    assert (sim_stats["evictions"], sim_stats["load_failures"]) == (0, 0), sim_stats
    assert sim_stats["loads"] == 6  # one per turn: each model loaded by kvgate, never by Ollama on its own


async def test_a_replica_killed_mid_load_holds_no_other_replica_past_its_lease(
    redis_server: RunningRedis, tmp_path: Path,
) -> None:
    """A real ``kvgate serve`` replica is loading gemma3:27b (the simulated load takes 3 s) when it gets SIGKILL:
    its lease, and the load's bytes on it, expire within ``lease_ttl_s`` (the backend aborts the load whose client
    went away); the other replica, asked for qwen2.5:32b meanwhile, waits for the lease, then decides with a fresh
    reading and loads: no load fails, nothing is evicted past the check."""
    from kvsim.gpu.exporter import EXPORTER_PATH

    client = aioredis.Redis.from_url(redis_server.url)
    await client.flushall()
    ttl_s = 2.0  # with a margin for a loaded machine: a pool lease not renewed for 1.5 s is fenced
    async with simulator(time_scale=1.0, load_s=3.0) as sim, \
            running_gateway([backend_for(sim)], residency={"min_resident_s": 0.0, "load_wait_s": 30.0},
                            shared_ledger={"redis_url": redis_server.url, "lease_ttl_s": ttl_s,
                                           "fence_margin_s": 0.5}) as survivor:
        config = tmp_path / "replica.toml"
        config.write_text(f'[shared_ledger]\nredis_url = "{redis_server.url}"\nlease_ttl_s = {ttl_s}\n'
                          f'fence_margin_s = 0.5\n\n[[backends]]\nname = "sim"\nurl = "{sim}"\n'
                          f'vram = "{sim}{EXPORTER_PATH}"\nvram_refresh_s = 0.01\nparallel = 1\n')
        async with serve_process("--config", str(config)) as served:
            process = served.process
            doomed_url = await listening(served)
            doomed = asyncio.ensure_future(chat(doomed_url, "gemma3:27b"))
            lease = f"kvgate:gpu:{len('sim')}:sim"

            async def its_load_is_in_flight() -> bool:
                return await client.hget(lease, "model") is not None

            await until(its_load_is_in_flight, timeout_s=20)
            holder = await client.hget(lease, "holder")
            process.kill()  # SIGKILL mid-load: no release, no renewal
            await process.wait()
            killed_s = time.monotonic()
            asked = asyncio.ensure_future(chat(survivor, "qwen2.5:32b"))

            async def the_dead_replicas_lease_is_gone() -> bool:
                return await client.hget(lease, "holder") != holder

            await until(the_dead_replicas_lease_is_gone, timeout_s=3 * ttl_s, interval_s=0.02)
            expired_after_s = time.monotonic() - killed_s
            status, _, body = await asked
            answered_after_s = time.monotonic() - killed_s
            await asyncio.gather(doomed, return_exceptions=True)
        sim_stats = await stats(sim)
    await client.aclose()
    print(f"\n  SIGKILL mid-load: its lease gone {expired_after_s:.2f} s later (lease_ttl_s {ttl_s:g}); the other "
          f"replica answered {status} {answered_after_s:.2f} s after the kill; simulator: loads {sim_stats['loads']}, "
          f"evictions {sim_stats['evictions']}, load failures {sim_stats['load_failures']}")
    assert status == 200, body
    assert (sim_stats["evictions"], sim_stats["load_failures"], sim_stats["runtime_ooms"]) == (0, 0, 0), sim_stats
    assert answered_after_s < 3 * ttl_s + 2 * 3.0 + 4.0  # the expiry, the dead one's load ending, its own load

