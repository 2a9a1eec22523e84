"""Issue 14, point 3, end to end: a tenant over its requests or tokens per minute gets a 429 with Retry-After, in its
dialect's format, and nothing reaches the backend; other tenants are not affected; output tokens the backend reports
count against the tenant's tokens per minute."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import aiohttp
import orjson
import pytest

from tests.support.fake_backend import FakeLLM, Script, running
from tests.support.gateway_server import running_gateway
from tests.support.poll import until

TENANTS = {
    "slow": {"api_keys": ["slow-key-0123456789"], "requests_per_minute": 2},
    "thin": {"api_keys": ["thin-key-0123456789"], "tokens_per_minute": 120},
    "free": {"api_keys": ["free-key-0123456789"]},
}


async def _post(http: aiohttp.ClientSession, url: str, path: str, key: str, body: dict[str, Any],
                ) -> tuple[int, dict[str, str], Any]:  # fmt: skip
    async with http.post(f"{url}{path}", json=body, headers={"Authorization": f"Bearer {key}"}) as response:
        return response.status, dict(response.headers), orjson.loads(await response.read())


async def test_rates_per_tenant_answer_429_with_retry_after() -> None:
    chat = {"model": "llama3.1:8b", "stream": False, "messages": [{"role": "user", "content": "hi"}]}
    async with running(FakeLLM()) as fake, running_gateway([{"name": "f", "url": fake.url}], tenants=TENANTS) as url, \
            aiohttp.ClientSession() as http:
        rows = []
        for path in ("/api/chat", "/v1/chat/completions", "/v1/chat/completions"):
            status, headers, body = await _post(http, url, path, "slow-key-0123456789", chat)
            rows.append(("slow", path, status, headers.get("Retry-After")))
        assert [row[2] for row in rows] == [200, 200, 429]
        assert 25 <= int(rows[-1][3] or 0) <= 31  # one request refills in 30 s
        assert body["error"]["code"] == "rate_limited" and "2 requests per minute" in body["error"]["message"]
        forwarded = len([s for s in fake.seen if s.path_qs in ("/api/chat", "/v1/chat/completions")])
        assert forwarded == 2  # the refused request never reached the backend
        status, _, _ = await _post(http, url, "/api/chat", "free-key-0123456789", chat)
        assert status == 200  # other tenants are not affected

        thin = []
        for _ in range(12):
            status, headers, body = await _post(http, url, "/api/chat", "thin-key-0123456789", chat)
            thin.append((status, headers.get("X-Kvgate-Prompt-Tokens"), body.get("eval_count")))
            if status == 429:
                assert int(headers["Retry-After"]) >= 1 and "120 tokens per minute" in body["error"]
                break
        print("\nslow:", rows, "\nthin:", thin)
        served = [row for row in thin if row[0] == 200]
        spent = sum(int(p or 0) + int(e or 0) for _, p, e in served)
        assert thin[-1][0] == 429 and spent <= 120 + int(served[-1][1] or 0) + int(served[-1][2] or 0)
        long = {**chat, "messages": [{"role": "user", "content": "word " * 400}]}
        status, headers, body = await _post(http, url, "/api/chat", "thin-key-0123456789", long)
        # the fake has no /api/show: an estimate, never refused for good; charged a whole minute, it waits for it
        assert status == 429 and int(headers["Retry-After"]) >= 1, body


async def test_a_counted_prompt_larger_than_a_minute_of_tokens_is_refused_for_good() -> None:
    """With a real count (the simulated Ollama: the model's tokenizer from /api/show), a prompt over the tenant's
    whole tokens per minute is a 400 naming the rate: waiting would never help."""
    from kvsim.config import SimConfig
    from kvsim.runner import start_sim
    from tests.tokens.vocab_vectors import warm_sim_tokenizers

    runner, sim = await start_sim(SimConfig(models=("llama3.1:8b",), load_s=0.01, time_scale=50.0,
                                            tokenizer_cache_dir=warm_sim_tokenizers("llama3.1:8b")))
    chat = {"model": "llama3.1:8b", "stream": False, "messages": [{"role": "user", "content": "word " * 400}]}
    try:
        async with running_gateway([{"name": "sim", "url": sim}], tenants=TENANTS,
                                   counting={"count_budget_s": 30.0}) as url, aiohttp.ClientSession() as http:
            status, _, body = await _post(http, url, "/api/chat", "thin-key-0123456789", chat)
    finally:
        await runner.cleanup()
    assert status == 400 and "more than tenant 'thin' may send in a minute" in body["error"]


RATED = {"rated": {"api_keys": ["rated-key-0123456789"], "tokens_per_minute": 3000}}
RATED_KEY = "rated-key-0123456789"


async def test_output_is_charged_up_front_so_concurrent_requests_cant_outrun_the_rate() -> None:
    """Issue 23, point 3b: ``tokens_per_minute = 3000`` and 12 concurrent chats asking for 1,000 output tokens each
    (the simulated Ollama generates all 1,000). Before the fix each was charged its prompt alone: all 12 ran, 12,000
    output tokens in under 2 s. Charged prompt + reserved output up front, at most 3,000 tokens' worth run."""
    from kvsim.config import SimConfig
    from kvsim.runner import start_sim

    runner, sim = await start_sim(SimConfig(models=("llama3.1:8b",), load_s=0.01, num_parallel=4,
                                            gen_tokens_per_s=20_000.0, min_response_tokens=1000,
                                            max_response_tokens=1000))
    chat = {"model": "llama3.1:8b", "stream": False, "options": {"num_predict": 1000},
            "messages": [{"role": "user", "content": "hi"}]}
    try:
        async with running_gateway([{"name": "sim", "url": sim}], tenants=RATED) as url, \
                aiohttp.ClientSession() as http:
            answers = await asyncio.gather(*(_post(http, url, "/api/chat", RATED_KEY, chat) for _ in range(12)))
    finally:
        await runner.cleanup()
    served = [body.get("eval_count", 0) for status, _, body in answers if status == 200]
    refused = [(headers.get("Retry-After"), body["error"]) for status, headers, body in answers if status == 429]
    print(f"\n12 concurrent, max 1,000 output each, 3,000 tokens per minute: {len(served)} served, "
          f"{sum(served):,} output tokens; {len(refused)} refused, e.g. {refused[:1]}")
    assert len(served) + len(refused) == 12
    assert sum(served) <= 3000  # before the fix: 12,000
    assert len(served) == 2 and all(int(after or 0) >= 1 for after, _ in refused)
    assert "the 1,000 output tokens it may generate" in refused[0][1]


async def test_the_unused_part_of_the_reserved_output_is_refunded() -> None:
    """Each answer uses 3 of the 1,000 output tokens it reserved: the rest comes back when its usage arrives, so 12
    chats one after the other all pass a 3,000 tokens-per-minute rate (charged the reservation and kept, the
    third would get a 429)."""
    chat = {"model": "llama3.1:8b", "stream": False, "options": {"num_predict": 1000},
            "messages": [{"role": "user", "content": "hi"}]}
    async with running(FakeLLM()) as fake, running_gateway([{"name": "f", "url": fake.url}], tenants=RATED) as url, \
            aiohttp.ClientSession() as http:
        statuses = [(await _post(http, url, "/api/chat", RATED_KEY, chat))[0] for _ in range(12)]
    assert statuses == [200] * 12


@pytest.mark.parametrize("cut", ["backend", "client"])
async def test_a_stream_cut_before_its_usage_is_charged_for_what_it_sent(cut: str) -> None:
    """Issue 23, point 3b: a stream that ends before its last chunk (the backend broke off, or the client left)
    carries no usage; before the fix it was charged nothing. Now it is charged one token per chunk it streamed (60
    here), so the tenant's next request, which needs its prompt and 100 output tokens, finds too few left in a
    150-token minute (before the fix: 200)."""
    tenants = {"small": {"api_keys": ["small-key-0123456789"], "tokens_per_minute": 150}}
    script = Script(chunks=100, disconnect_after_chunks=60 if cut == "backend" else None,
                    hold_after_chunks=60 if cut == "client" else None)
    stream = {"model": "llama3.1:8b", "stream": True, "options": {"num_predict": 100},
              "messages": [{"role": "user", "content": "hi"}]}
    async with running(FakeLLM(script)) as fake, \
            running_gateway([{"name": "f", "url": fake.url}], tenants=tenants) as url, \
            aiohttp.ClientSession() as http:
        headers = {"Authorization": "Bearer small-key-0123456789"}
        async with http.post(f"{url}/api/chat", json=stream, headers=headers) as response:
            assert response.status == 200
            lines = 0
            while lines < 60:
                lines += (await response.content.readline()).count(b"\n")
            if cut == "client":
                response.close()  # the client leaves before the last chunk; the backend goes on
        if cut == "client":
            script.release.set()
            await until(lambda: fake.cancelled or fake.script.release.is_set())

            async def the_cut_request_ended() -> re.Match[str] | None:  # its next write failed: ended and settled
                async with http.get(f"{url}/kvgate/metrics") as reply:
                    return re.search(r'kvgate_tenant_requests_total\{status="\d+",tenant="small"\}', await reply.text())

            await until(the_cut_request_ended)
        status, _, body = await _post(http, url, "/api/chat", "small-key-0123456789",
                                      {**stream, "stream": False})
    print(f"\ncut by the {cut}: the next request got {status}: {body.get('error')}")
    assert status == 429 and "150 tokens per minute" in body["error"]
