"""Issue 14, point 4: answers a client can act on: per-request deadlines, Retry-After, the queue position.

A backend with one slot holds a streamed request open; the next request queues behind it. Its own deadline
(``X-Kvgate-Deadline``, or the ``X-Stainless-Read-Timeout`` the OpenAI SDK sends) ends its wait with a 503 that names
the header and carries Retry-After; a deadline never lengthens the configured ``queue_timeout_s``; a deadline that is
not a number of seconds is a 400 naming the header. While it waits, /kvgate/status lists it with its position.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from tests.support.fake_backend import FakeLLM, Script, running
from tests.support.gateway_server import running_gateway
from tests.support.poll import until

BODY = {"model": "llama3.1:8b", "stream": True, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


def _backend(url: str) -> dict[str, Any]:
    return {"name": "one", "kind": "openai", "url": url, "parallel": 1, "context_tokens": 4096}


async def _hold_the_slot(http: aiohttp.ClientSession, url: str) -> asyncio.Task[int]:
    async def stream() -> int:
        async with http.post(f"{url}/v1/chat/completions", json=BODY) as response:
            await response.read()
            return response.status

    return asyncio.ensure_future(stream())


async def _waiting(http: aiohttp.ClientSession, url: str) -> list[dict[str, Any]] | None:
    async with http.get(f"{url}/kvgate/status") as response:
        pools = orjson.loads(await response.read())["pools"]
    waiting = [w for pool in pools for w in pool["waiting"]]
    return waiting or None


@pytest.mark.parametrize(("headers", "names"), [
    ({"X-Kvgate-Deadline": "0.3"}, "the request's X-Kvgate-Deadline: 0.3"),
    ({"X-Stainless-Read-Timeout": "0.4"}, "the request's X-Stainless-Read-Timeout: 0.4"),
    ({"X-Kvgate-Deadline": "0.35", "X-Stainless-Read-Timeout": "0.4"}, "the request's X-Stainless-Read-Timeout: 0.4"),
    ({"X-Kvgate-Deadline": "100"}, "queue_timeout_s"),  # never longer than the operator's limit
], ids=["kvgate-header", "sdk-header", "the-smaller", "not-longer"])
async def test_a_queued_request_leaves_at_its_deadline_with_retry_after(headers: dict[str, str], names: str) -> None:
    fake = FakeLLM(Script(chunks=2, hold_after_chunks=1))
    async with running(fake), running_gateway([_backend(fake.url)], admission={"queue_timeout_s": 0.6}) as url, \
            aiohttp.ClientSession() as http:
        holder = await _hold_the_slot(http, url)
        started = time.monotonic()
        waiter = asyncio.ensure_future(http.post(f"{url}/v1/chat/completions", json=BODY, headers=headers))
        waiting = await until(lambda: _waiting(http, url))
        assert waiting == [{"position": 1, "tenant": "anonymous", "priority": 0, "waited_s": waiting[0]["waited_s"],
                            "reason": waiting[0]["reason"]}]
        async with await waiter as response:
            body = orjson.loads(await response.read())
            waited_s = time.monotonic() - started
            assert response.status == 503 and int(response.headers["Retry-After"]) >= 1
        assert body["error"]["code"] == "queue_timeout" and f"the limit ({names})" in body["error"]["message"]
        assert waited_s < 0.6 + 0.5 if names == "queue_timeout_s" else waited_s < 0.6
        fake.script.release.set()
        assert await holder == 200


async def test_the_openai_sdks_own_timeout_ends_the_wait() -> None:
    """The official client, unmodified: its timeout travels as X-Stainless-Read-Timeout, and kvgate answers before the
    client gives up, with a 503 the SDK can retry on (Retry-After)."""
    fake = FakeLLM(Script(chunks=2, hold_after_chunks=1))
    async with running(fake), running_gateway([_backend(fake.url)]) as url, aiohttp.ClientSession() as http:
        holder = await _hold_the_slot(http, url)
        await until(lambda: fake.seen)
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=0.8)
        with pytest.raises(openai.APIStatusError) as refused:
            await client.chat.completions.create(model="llama3.1:8b", max_tokens=8,
                                                 messages=[{"role": "user", "content": "hi"}])
        assert refused.value.status_code == 503
        assert int(refused.value.response.headers["Retry-After"]) >= 1
        assert "X-Stainless-Read-Timeout" in refused.value.message
        fake.script.release.set()
        assert await holder == 200
        await client.close()


@pytest.mark.parametrize("value", ["soon", "-1", "0", "nan", "1e9"])
async def test_a_deadline_that_is_not_seconds_is_a_400_naming_the_header(value: str) -> None:
    async with running(FakeLLM()) as fake, running_gateway([_backend(fake.url)]) as url, \
            aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/chat/completions", json=BODY, headers={"X-Kvgate-Deadline": value}) as r:
            body = orjson.loads(await r.read())
        assert r.status == 400 and "X-Kvgate-Deadline" in body["error"]["message"]
        assert [s for s in fake.seen if s.path_qs == "/v1/chat/completions"] == []
