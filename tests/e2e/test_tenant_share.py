"""Issue 14, point 2, through the gateway: a tenant at its ``max_pool_share`` waits while another tenant is admitted.

One backend, 4 sequences of 4,096 tokens (a pool of 16,384). Tenant 'a' may hold a fifth of it (3,276 tokens): its
first streamed answer holds about 3,030 tokens open, so its second request (about 1,130 more) waits, named on the
status page as held back by a's share, while tenant 'b' walks past it. When a's first answer ends, its second goes in;
a request of a's that alone exceeds the share is a 400 naming it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson

from tests.support.exact_count import exact_counting
from tests.support.fake_backend import FakeLLM, Script, running
from tests.support.gateway_server import running_gateway
from tests.support.poll import until

TENANTS = {"a": {"api_keys": ["a-key"], "max_pool_share": 0.2}, "b": {"api_keys": ["b-key"]}}
BACKEND = {"name": "one", "kind": "openai", "parallel": 4, "context_tokens": 4096}
A, B = {"X-Api-Key": "a-key"}, {"X-Api-Key": "b-key"}


def _chat(max_tokens: int, *, stream: bool = False) -> dict[str, Any]:
    return {"model": "llama3.1:8b", "stream": stream, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "hi"}]}


async def _post(http: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str]
                ) -> tuple[int, Any]:
    async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as response:
        raw = await response.read()  # a stream holds its reservation until its last byte
        return response.status, None if body["stream"] else orjson.loads(raw)


async def _waiting(http: aiohttp.ClientSession, url: str) -> list[dict[str, Any]] | None:
    async with http.get(f"{url}/kvgate/status") as response:
        pools = orjson.loads(await response.read())["pools"]
    return [w for pool in pools for w in pool["waiting"]] or None


async def test_a_tenant_at_its_share_waits_while_another_is_admitted() -> None:
    fake = FakeLLM(Script(chunks=2, hold_after_chunks=1))
    async with running(fake), running_gateway([BACKEND | {"url": fake.url}], tenants=TENANTS,
                                              **exact_counting("llama3.1:8b")) as url, \
            aiohttp.ClientSession() as http:
        holder = asyncio.ensure_future(_post(http, url, _chat(3000, stream=True), A))
        await until(lambda: fake.requests_to("/v1/chat/completions"))
        second = asyncio.ensure_future(_post(http, url, _chat(1100), A))
        (waiting,) = await until(lambda: _waiting(http, url))
        print(f"\nwaiting: {waiting}")
        assert waiting["tenant"] == "a"
        assert "tenant 'a' holds" in waiting["reason"] and "of its 3,276 tokens (max_pool_share 0.2 " in \
            waiting["reason"]

        fake.script.hold_after_chunks = None  # b's answer streams straight through
        status, _ = await asyncio.wait_for(_post(http, url, _chat(1000), B), 5.0)
        assert status == 200 and not second.done()  # b went past a's waiter; a still waits for its own tokens

        status, refused = await _post(http, url, _chat(4000), A)
        print(f"refused: {refused['error']['message']}")
        assert status == 400 and refused["error"]["code"] == "tenant_share_exceeded"
        assert "3,276 tokens (max_pool_share 0.2 of 16,384)" in refused["error"]["message"]

        fake.script.release.set()
        assert (await holder)[0] == 200
        assert (await asyncio.wait_for(second, 5.0))[0] == 200
        assert len(fake.requests_to("/v1/chat/completions")) == 3
