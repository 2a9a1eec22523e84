"""Issue 23, point 3a, through the gateway: one tenant's flood fills only its share of the queue's places
(``admission.max_queue_share``, half of ``max_queue`` by default) and another tenant still queues, then is served.
The attack it reproduces: one tenant's 400 requests took all 256 places; another tenant got 503 ``queue_full``."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from typing import Any

import aiohttp
import orjson

from tests.support.fake_backend import FakeLLM, Script, running
from tests.support.gateway_server import running_gateway
from tests.support.poll import until

TENANTS = {"flood": {"api_keys": ["flood-key"]}, "other": {"api_keys": ["other-key"]}}
BACKEND = {"name": "one", "kind": "openai", "parallel": 1, "context_tokens": 4096}


def _chat(*, stream: bool = False) -> dict[str, Any]:
    return {"model": "llama3.1:8b", "stream": stream, "max_tokens": 500,
            "messages": [{"role": "user", "content": "hi"}]}


async def _post(http: aiohttp.ClientSession, url: str, key: str, *, stream: bool = False) -> tuple[int, Any]:
    async with http.post(f"{url}/v1/chat/completions", json=_chat(stream=stream),
                         headers={"X-Api-Key": key}) as response:
        raw = await response.read()
        return response.status, None if stream else orjson.loads(raw)


async def _waiting(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(f"{url}/kvgate/status") as response:
        pools = orjson.loads(await response.read())["pools"]
    return sum(len(pool["waiting"]) for pool in pools)


async def test_a_flood_fills_its_share_and_another_tenant_still_queues() -> None:
    fake = FakeLLM(Script(chunks=2, hold_after_chunks=1))
    async with running(fake), running_gateway([BACKEND | {"url": fake.url}], tenants=TENANTS,
                                              admission={"max_queue": 8, "queue_timeout_s": 20.0}) as url, \
            aiohttp.ClientSession() as http:
        holder = asyncio.ensure_future(_post(http, url, "flood-key", stream=True))
        await until(lambda: fake.requests_to("/v1/chat/completions"))
        flood = [asyncio.ensure_future(_post(http, url, "flood-key")) for _ in range(12)]
        await until(lambda: _settled(http, url, flood, 0))  # each one queued or refused
        refused = [task.result() for task in flood if task.done()]
        assert all(status == 503 for status, _ in refused)
        other = [asyncio.ensure_future(_post(http, url, "other-key")) for _ in range(3)]
        await until(lambda: _settled(http, url, other, len(flood) - len(refused)))
        print(f"\nbefore serving: flood refused {len(refused)} of 12; other refused "
              f"{sum(task.done() for task in other)} of 3")
        assert len(refused) == 8  # 4 places of 8 taken
        assert not any(task.done() for task in other)  # before the fix: 503 queue_full, 3 times of 3
        fake.script.hold_after_chunks = None
        fake.script.release.set()
        assert (await holder)[0] == 200
        flood_ends = Counter(status for status, _ in await asyncio.gather(*flood))
        other_ends = Counter(status for status, _ in await asyncio.gather(*other))
        print(f"\nflood (12 sent): {dict(flood_ends)}   other (3 sent): {dict(other_ends)}")
        assert flood_ends == Counter({200: 4, 503: 8}) and other_ends == Counter({200: 3})
        _, body = refused[0]
        assert body["error"]["code"] == "queue_full"
        assert "tenant 'flood' already has 4 requests waiting" in body["error"]["message"]
        assert "max_queue_share 0.5 of max_queue 8" in body["error"]["message"]


async def _settled(http: aiohttp.ClientSession, url: str, tasks: Sequence[asyncio.Future[Any]], before: int) -> bool:
    """Whether each of ``tasks`` is either answered or waiting (``before``: others already waiting)."""
    return await _waiting(http, url) - before + sum(task.done() for task in tasks) == len(tasks)
