"""Issue 14, point 3, end to end: a tenant over its requests or tokens per minute gets a 429 with Retry-After, in its
dialect's format, and nothing reaches the backend; other tenants are not affected; output tokens the backend reports
count against the tenant's tokens per minute."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from tests.support.fake_backend import FakeLLM, running
from tests.support.gateway_server import running_gateway

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
