"""Ollama's real capacity, learned (issue 22 point 2): kvgate started with only the backend's URL runs as many
sequences of a model at once as Ollama does (OLLAMA_NUM_PARALLEL, read from the /api/ps size), re-reads it after a
reload at another context, and says where the number came from (the log, /kvgate/status); a configured
``parallel`` still wins, and one the size disagrees with is reported.

The simulated Ollama (kvsim) counts the requests that wait inside it for a slot (``max_waiting``): kvgate admitting
more than Ollama runs would show there; kvgate admitting fewer shows as its own queue. The clients are the official
``ollama`` package. Each case is printed (pytest -s).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import ollama
import pytest

from kvsim.config import SimConfig
from kvsim.runner import start_sim
from tests.kvsim.helpers import running_sim
from tests.support.gateway_server import running_gateway
from tests.support.poll import until

MODEL = "llama3.1:8b"


def _sim(parallel: int) -> SimConfig:
    return SimConfig(models=(MODEL,), num_parallel=parallel, context_length=8192, load_s=0.2, time_scale=1.0,
                     gen_tokens_per_s=60.0, min_response_tokens=24, max_response_tokens=24,
                     prompt_tokens_per_s=50_000.0)


@asynccontextmanager
async def _ollama(parallel: int) -> AsyncIterator[str]:
    async with running_sim(_sim(parallel)) as url:
        yield url


async def _get(url: str, path: str) -> Any:
    async with aiohttp.ClientSession() as http, http.get(f"{url}{path}") as response:
        return await response.json()


async def _chat(client: ollama.AsyncClient, index: int) -> str:
    parts = []
    stream = await client.chat(model=MODEL, stream=True, messages=[{"role": "user", "content": f"question {index}"}])
    async for chunk in stream:
        parts.append(chunk.message.content or "")
    return "".join(parts)


async def _burst(url: str, count: int) -> tuple[list[str], int]:
    """``count`` concurrent streamed chats through kvgate; the most sequences kvgate's pool held at once."""
    peak = 0
    done = asyncio.Event()

    async def watch() -> None:
        nonlocal peak
        while not done.is_set():
            status = await _get(url, "/kvgate/status")
            peak = max([peak, *(pool["active_sequences"] for pool in status["pools"] if pool["model"] == MODEL)])
            await asyncio.sleep(0.02)  # the sampling period of the peak

    watcher = asyncio.ensure_future(watch())
    async with ollama.AsyncClient(host=url) as client:
        answers = await asyncio.gather(*(_chat(client, i) for i in range(count)))
    done.set()
    await watcher
    return list(answers), peak


def _pool(status: dict[str, Any]) -> dict[str, Any]:
    pool: dict[str, Any] = next(p for p in status["pools"] if p["model"] == MODEL)
    return pool


@pytest.mark.parametrize("parallel", [1, 2, 4])
async def test_kvgate_with_only_the_url_runs_as_many_sequences_as_ollama(
    parallel: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.admission.kv_pools")
    async with _ollama(parallel) as sim, running_gateway([{"name": "ollama", "url": sim}]) as url:
        answers, peak = await _burst(url, 2 * parallel)
        pool = _pool(await _get(url, "/kvgate/status"))
        stats = await _get(sim, "/sim/stats")
    source = pool["slots_source"]
    print(f"\nOLLAMA_NUM_PARALLEL={parallel}: kvgate planned {pool['slots']} slot(s) ({source['source']}: "
          f"{source['detail']}); {len(answers)} chats, at most {peak} at once through kvgate, "
          f"{stats['max_waiting']} waited inside Ollama")
    assert all(answers)
    assert pool["slots"] == parallel and source["source"] == "inferred"
    assert "inferred from /api/ps size" in source["detail"] and "8,192 tokens" in source["detail"]
    assert peak == parallel  # all of Ollama's slots used: nothing serialised that Ollama would run at once
    assert stats["max_waiting"] == 0  # and never more than it runs
    logged = [r.getMessage() for r in caplog.records if "slot" in r.getMessage()]
    assert any(f"model '{MODEL}' on" in line and f": {parallel} slot" in line and "set parallel = N in [[backends]]"
               in line for line in logged), logged


async def test_after_a_reload_at_another_context_the_slots_are_read_again() -> None:
    async with _ollama(2) as sim, running_gateway([{"name": "ollama", "url": sim}],
                                                 admission={"pool_refresh_s": 0.2}) as url:
        await _burst(url, 2)
        before = _pool(await _get(url, "/kvgate/status"))["slots_source"]
        # another client of the same Ollama reloads the model at another context, past kvgate
        async with aiohttp.ClientSession() as http, http.post(
            f"{sim}/api/generate", json={"model": MODEL, "options": {"num_ctx": 16384}, "stream": False}
        ) as response:
            assert response.status == 200
        assert (await _get(sim, "/sim/stats"))["reloads"] == 1

        async def reread() -> dict[str, Any] | None:
            await _burst(url, 1)
            pool = _pool(await _get(url, "/kvgate/status"))
            return pool if pool["slot_context_tokens"] == 16384 else None

        after = await until(reread, timeout_s=10.0)
        answers, peak = await _burst(url, 4)
        stats = await _get(sim, "/sim/stats")
    print(f"\nbefore: {before['detail']}\nafter:  {after['slots_source']['detail']}; then at most {peak} at once")
    assert "8,192 tokens" in before["detail"]
    assert after["slots"] == 2 and "16,384 tokens" in after["slots_source"]["detail"]
    assert peak == 2 and stats["max_waiting"] == 0 and all(answers)


async def test_a_configured_parallel_wins_and_a_size_that_disagrees_is_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.admission.kv_pools")
    async with _ollama(2) as sim, running_gateway([{"name": "ollama", "url": sim, "parallel": 1}]) as url:
        _, peak = await _burst(url, 2)
        status = await _get(url, "/kvgate/status")
    pool = _pool(status)
    notes = next(b["notes"] for b in status["backends"] if b["name"] == "ollama")
    print(f"\nparallel = 1 configured, Ollama runs 2: {pool['slots_source']}\nnotes: {notes}")
    assert pool["slots"] == 1 and pool["slots_source"]["source"] == "configured" and peak == 1
    assert any("has parallel = 1 but model" in note and "runs 2 sequence(s) at once" in note for note in notes)
    assert any("has parallel = 1 but model" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")


async def test_where_kvgate_cannot_tell_it_says_what_it_assumed_and_how_to_set_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Ollama before v0.30 reports estimates in /api/ps: nothing is read from them, one slot is assumed, said so."""
    caplog.set_level(logging.INFO, logger="gateway.admission.kv_pools")
    runner, sim = await start_sim(SimConfig(models=(MODEL,), num_parallel=2, era="e2", context_length=4096,
                                            load_s=0.1, time_scale=20.0))
    try:
        async with running_gateway([{"name": "ollama", "url": sim}]) as url:
            await _burst(url, 1)
            pool = _pool(await _get(url, "/kvgate/status"))
    finally:
        await runner.cleanup()
    print(f"\n{pool['slots_source']}")
    assert pool["slots"] == 1 and pool["slots_source"]["source"] == "assumed"
    assert "Ollama 0.20.0 reports its own estimates" in pool["slots_source"]["detail"]
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "assumed 1" in r.getMessage()]
    assert warned and "KVGATE_BACKEND__PARALLEL" in warned[0] and "OLLAMA_NUM_PARALLEL" in warned[0]
