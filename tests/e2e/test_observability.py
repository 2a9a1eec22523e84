"""What kvgate decided is visible: Prometheus metrics at /kvgate/metrics and the status page at /kvgate/status."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from gateway.support.safe_text import sanitize
from kvsim.config import SimConfig
from kvsim.runner import start_sim
from tests.support.gateway_server import running_gateway


@pytest.fixture
async def gateway() -> AsyncIterator[str]:
    runner, sim = await start_sim(SimConfig(models=("llama3.1:8b",), load_s=0.05, time_scale=50.0,
                                            min_response_tokens=2, max_response_tokens=4))
    backend = {"name": "sim", "url": sim, "context_tokens": 8192, "parallel": 2}
    try:
        async with running_gateway([backend]) as url:
            yield url
    finally:
        await runner.cleanup()


async def test_metrics_and_status_show_requests_decisions_and_pools(gateway: str) -> None:
    chat = {"model": "llama3.1:8b", "stream": False, "messages": [{"role": "user", "content": "hi"}],
            "options": {"num_ctx": 16384}}
    async with aiohttp.ClientSession() as http:
        for _ in range(2):
            async with http.post(f"{gateway}/api/chat", json=chat) as response:
                assert response.status == 200
        async with http.post(f"{gateway}/api/chat", json={"messages": "x"}) as response:
            assert response.status == 400
        async with http.get(f"{gateway}/kvgate/metrics") as response:
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = await response.text()
        async with http.get(f"{gateway}/kvgate/status") as response:
            status = await response.json()
        async with http.get(f"{gateway}/kvgate/status", headers={"Accept": "text/html"}) as response:
            page = await response.text()
    assert 'kvgate_requests_total{backend="sim",route="/api/chat",status="200"} 2.0' in text
    assert 'kvgate_requests_total{backend="-",route="/api/chat",status="400"} 1.0' in text
    assert 'kvgate_decisions_total{backend="sim",decision="rewritten"} 2.0' in text
    assert 'kvgate_decisions_total{backend="sim",decision="admitted"} 2.0' in text
    assert 'kvgate_pool_capacity_tokens{backend="sim",model="llama3.1:8b"} 16384.0' in text
    assert 'kvgate_pool_reserved_tokens{backend="sim",model="llama3.1:8b"} 0.0' in text
    assert "kvgate_prompt_tokens_total{" in text
    pool = status["pools"][0]
    assert (pool["backend"], pool["model"], pool["kind"], pool["slots"], pool["slot_context_tokens"]) == (
        "sim", "llama3.1:8b", "split", 2, 8192)
    assert pool["active_sequences"] == 0 and pool["admitted_total"] == 2
    assert status["backends"][0]["models"] and status["backends"][0]["last_error"] is None
    assert "<h2>KV pools</h2>" in page and "llama3.1:8b" in page
    assert status["truncations"] == {"counts": [], "recent": []}  # the prompts fit: nothing was cut
    assert "<h2>Silent truncations</h2>" in page and "kvgate_truncations_total{" not in text


@pytest.mark.parametrize(
    ("given", "logged"),
    [("llama3.1:8b", "llama3.1:8b"), ("a\nfake line", "a?fake line"), ("\x1b[31mred", "?[31mred"),
     ("modèle", "mod?le"), ("x" * 200, "x" * 128 + "...")],
)
def test_client_strings_are_sanitized_for_logs(given: str, logged: str) -> None:
    assert sanitize(given) == logged


async def test_admin_routes_need_the_admin_key_when_one_is_set() -> None:
    async with running_gateway([{"name": "b", "url": "http://127.0.0.1:9"}],
                               server={"admin_key": "s3cret-admin"}) as url, aiohttp.ClientSession() as http:
        for path in ("/kvgate/status", "/kvgate/metrics"):
            async with http.get(url + path) as response:
                assert response.status == 403
                assert (await response.json())["error"]["code"] == "admin_only"
            async with http.get(url + path, headers={"Authorization": "Bearer wrong"}) as response:
                assert response.status == 403
            async with http.get(url + path, headers={"Authorization": "Bearer s3cret-admin"}) as response:
                assert response.status == 200

