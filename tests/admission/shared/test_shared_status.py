"""Issue 22, point 6: a replica's view of a shared pool shows what every replica holds, and its own part.

Two kvgate replicas share one ledger in a real redis-server, in front of the simulated llama-server's unified pool.
Replica b has learned the pool (it probed it for a request it then refused at a tenant's prompt cap) but never
reserved in it; replica a holds two long answers. b's /kvgate/status, its metrics and its page must show a's
reservations in the pool's totals, none as b's own, and follow them when a's answers end.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from kvsim.config import SimConfig
from kvsim.runner import start_sim
from tests.support.chromium import find_chromium, headless_chromium
from tests.support.gateway_server import running_gateway
from tests.support.poll import until

TENANTS = {"capped": {"api_keys": ["capped-key-0123456789"], "max_prompt_tokens": 4}}
HELD = {"model": "llama3.1:8b", "max_tokens": 3000, "ignore_eos": True, "stream": True,
        "messages": [{"role": "user", "content": "tell me a long story"}]}
READ_POOL = """(() => {
  const pool = document.querySelector(".pool");
  return pool && {
    reserved: pool.querySelector("[data-field=reserved]").textContent,
    here: pool.querySelector("[data-field=reserved-here]")?.textContent,
    others: pool.querySelector("[data-field=reserved-others]")?.textContent,
    segments: [...pool.querySelectorAll(".bar span")].map((s) => [s.dataset.kind, Number(s.dataset.bytes)]),
  };
})()"""


async def _status(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(f"{url}/kvgate/status") as reply:
        status: dict[str, Any] = await reply.json()
    return status


async def _gauges(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with http.get(f"{url}/kvgate/metrics") as reply:
        text = await reply.text()
    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name.startswith("kvgate_pool_")
            and sample.name != "kvgate_pool_refusals_total"}


async def test_a_replica_shows_the_other_replicas_reservations_in_the_shared_totals(redis_url: str) -> None:
    runner, sim = await start_sim(SimConfig(mode="llama-server", ctx_size=16384, gen_tokens_per_s=20.0))
    shared = {"redis_url": redis_url, "lease_ttl_s": 2, "poll_s": 0.02}
    backend = {"name": "ls", "kind": "llama-server", "url": sim}
    held: list[asyncio.Future[int]] = []
    try:
        async with running_gateway([backend], shared_ledger=shared) as a, \
                running_gateway([backend], shared_ledger=shared, tenants=TENANTS) as b, \
                aiohttp.ClientSession() as http:
            async with http.post(f"{b}/v1/chat/completions", json={**HELD, "stream": False},
                                 headers={"Authorization": "Bearer capped-key-0123456789"}) as reply:
                assert reply.status == 400  # b probed the pool, reserved nothing in it

            async def hold() -> int:
                async with http.post(f"{a}/v1/chat/completions", json=HELD) as reply:
                    await reply.content.readany()
                    await asyncio.sleep(3600)  # the stream stays open until the test cancels it
                    return reply.status

            held = [asyncio.ensure_future(hold()) for _ in range(2)]
            mine = await until(lambda: _pool_holding(http, a, 2), timeout_s=10.0)
            seen = await until(lambda: _pool_holding(http, b, 2), timeout_s=10.0)
            gauges = await _gauges(http, b)
            page = await _page(b)
            print(f"\nreplica a: {_row(mine)}\nreplica b: {_row(seen)}\nb's gauges: {gauges}\nb's page: {page}")
            assert mine["scope"] == seen["scope"] == "shared"
            assert mine["local"] == {"active_sequences": 2, "reserved_tokens": mine["reserved_tokens"]}
            assert (seen["active_sequences"], seen["reserved_tokens"]) == (2, mine["reserved_tokens"])
            assert seen["local"] == {"active_sequences": 0, "reserved_tokens": 0} and seen["sequences"] == []
            assert seen["other_replicas"]["reserved_tokens"] == mine["reserved_tokens"] > 0
            assert seen["refused"] == {"max_prompt_tokens": 1} and mine["admitted_total"] == 0  # a's end later
            assert gauges["kvgate_pool_reserved_tokens"] == mine["reserved_tokens"]
            assert gauges["kvgate_pool_active_sequences"] == 2
            assert gauges["kvgate_pool_reserved_tokens_local"] == gauges["kvgate_pool_active_sequences_local"] == 0
            if page is not None:
                reserved = f"{mine['reserved_tokens']:,}"
                assert (page["reserved"], page["here"], page["others"]) == (reserved, "0", reserved)
                assert page["segments"][0] == ["others", mine["reserved_tokens"]]

            for task in held:
                task.cancel()
            await asyncio.gather(*held, return_exceptions=True)
            after = await until(lambda: _pool_holding(http, b, 0), timeout_s=10.0)
            assert after["reserved_tokens"] == after["other_replicas"]["reserved_tokens"] == 0
    finally:
        for task in held:
            task.cancel()
        await asyncio.gather(*held, return_exceptions=True)
        await runner.cleanup()


async def _pool_holding(http: aiohttp.ClientSession, url: str, sequences: int) -> dict[str, Any] | None:
    pools = (await _status(http, url))["pools"]
    return pools[0] if pools and pools[0]["active_sequences"] == sequences else None


def _row(pool: dict[str, Any]) -> str:
    return (f"{pool['layout']}; {pool['active_sequences']} sequences, {pool['reserved_tokens']:,} tokens in all; "
            f"here {pool['local']}; other replicas {pool['other_replicas']}")


async def _page(url: str) -> dict[str, Any] | None:
    """The pool card of b's page (None without Chromium: the JSON above is the test; the page is its rendering)."""
    binary = find_chromium()
    if binary is None:
        return None
    async with headless_chromium(binary) as page:
        await page.navigate(f"{url}/kvgate/")
        with contextlib.suppress(AssertionError):
            await until(lambda: page.evaluate("!!document.body && Number(document.body.dataset.updates || 0) >= 1"),
                        timeout_s=10.0)
        shown: dict[str, Any] | None = await page.evaluate(READ_POOL)
        return shown
