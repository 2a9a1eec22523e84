"""API keys name tenants; a tenant's caps apply; kvgate's keys never reach the backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from gateway.config import ConfigError, load_settings
from tests.support.fake_backend import FakeLLM, running
from tests.support.gateway_server import running_gateway

TENANTS = {
    "ci": {"api_keys": ["ci-key-1"], "max_prompt_tokens": 50, "max_output_tokens": 128},
    "team": {"api_keys": ["team-key"]},
}
CHAT = {"model": "llama3.1:8b", "stream": False, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[str, FakeLLM]]:
    async with running(FakeLLM()) as fake, running_gateway(
        [{"name": "b", "url": fake.url}], tenants=TENANTS, server={"require_api_key": True}
    ) as url:
        yield url, fake


async def _post(url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=headers) as response:
        return response.status, orjson.loads(await response.read())


@pytest.mark.parametrize(
    ("headers", "expected"),
    [({}, "no API key was sent"), ({"Authorization": "Bearer nope"}, "is not one of kvgate's"),
     ({"X-Api-Key": "ci-key-"}, "is not one of kvgate's")],
)
async def test_missing_or_unknown_keys_get_401_in_the_dialect(
    gateway: tuple[str, FakeLLM], headers: dict[str, str], expected: str
) -> None:
    url, fake = gateway
    status, body = await _post(f"{url}/api/chat", CHAT, headers)
    assert status == 401 and expected in body["error"]
    status, body = await _post(f"{url}/v1/chat/completions", CHAT, headers)
    assert status == 401 and body["error"]["type"] == "authentication_error"
    assert fake.seen == []


async def test_a_known_key_passes_and_stays_in_kvgate(gateway: tuple[str, FakeLLM]) -> None:
    url, fake = gateway
    for headers in ({"Authorization": "Bearer team-key"}, {"X-Api-Key": "team-key"}):
        status, _ = await _post(f"{url}/api/chat", CHAT, headers)
        assert status == 200
        assert "Authorization" not in fake.seen[-1].headers and "X-Api-Key" not in fake.seen[-1].headers


async def test_tenant_caps_prompt_and_output(gateway: tuple[str, FakeLLM]) -> None:
    url, fake = gateway
    long_chat = {**CHAT, "messages": [{"role": "user", "content": "word " * 400}]}
    status, body = await _post(f"{url}/api/chat", long_chat, {"Authorization": "Bearer ci-key-1"})
    assert status == 400
    assert "tenant 'ci' allows 50; shorten it or ask for a larger cap" in body["error"]
    async with aiohttp.ClientSession() as http, http.post(
        f"{url}/api/chat", json={**CHAT, "options": {"num_predict": 4000}}, headers={"X-Api-Key": "ci-key-1"}
    ) as response:
        assert response.status == 200
        assert "options.num_predict=128 (was 4000)" in response.headers["X-Kvgate-Rewrite"].split("; ")
    assert orjson.loads(fake.seen[-1].body)["options"]["num_predict"] == 128
    status, _ = await _post(f"{url}/api/chat", long_chat, {"Authorization": "Bearer team-key"})
    assert status == 200  # no cap for this tenant


def test_tenant_configuration_is_checked() -> None:
    with pytest.raises(ConfigError, match="more than one tenant"):
        load_settings(None, tenants={"a": {"api_keys": ["k"]}, "b": {"api_keys": ["k"]}})
    with pytest.raises(ConfigError, match="no tenant has api_keys"):
        load_settings(None, server={"require_api_key": True})
    settings = load_settings(None, tenants=TENANTS)
    assert "ci-key-1" not in repr(settings) and "ci-key-1" not in str(settings.model_dump())


async def test_kvgate_client_routes_take_the_same_keys(gateway: tuple[str, FakeLLM]) -> None:
    url, _ = gateway
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/kvgate/count", json=CHAT) as response:
            assert response.status == 401
        async with http.post(f"{url}/kvgate/count", json=CHAT, headers={"X-Api-Key": "team-key"}) as response:
            assert response.status == 200
        async with http.get(f"{url}/kvgate/fit?model=llama3.1:8b") as response:
            assert response.status == 401
        async with http.get(f"{url}/kvgate/health") as response:
            assert response.status == 200
        await _post(f"{url}/api/chat", CHAT, {"X-Api-Key": "team-key"})
        async with http.get(f"{url}/kvgate/metrics") as response:
            text = await response.text()
    assert 'kvgate_tenant_requests_total{status="200",tenant="team"} 1.0' in text
