"""API keys name tenants; a tenant's caps apply; kvgate's keys never reach the backend."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from gateway.config.settings import ConfigError, load_settings
from tests.support.exact_count import exact_counting
from tests.support.fake_backend import FakeLLM, running
from tests.support.gateway_server import running_gateway

EXACT = exact_counting("llama3.1:8b")
"""The caps apply to a real count (an estimate is never refused): the model is counted with its vocabulary."""

TENANTS = {
    "ci": {"api_keys": ["ci-key-1"], "max_prompt_tokens": 50, "max_output_tokens": 128},
    "team": {"api_keys": ["team-key"]},
}
CHAT = {"model": "llama3.1:8b", "stream": False, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[str, FakeLLM]]:
    async with running(FakeLLM()) as fake, running_gateway(
        [{"name": "b", "url": fake.url}], tenants=TENANTS, server={"require_api_key": True}, **EXACT
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


HASHED_KEY = "hashed-team-key-7"
HASHED_DIGEST = hashlib.sha256(HASHED_KEY.encode()).hexdigest()
OPEN_TENANTS: dict[str, Any] = {
    "ci": {"api_keys": ["ci-key-1"]},
    "team": {"api_key_sha256": [HASHED_DIGEST]},
    "anonymous": {"max_prompt_tokens": 60, "max_output_tokens": 64},
}
DIALECTS: dict[str, tuple[str, dict[str, Any]]] = {
    "ollama": ("/api/chat", CHAT),
    "openai": ("/v1/chat/completions", CHAT),
    "anthropic": ("/v1/messages", {**CHAT, "max_tokens": 16}),
}


def _error(dialect: str, body: Any) -> tuple[str, tuple[str, str] | None]:
    """An error body's message and (for the dialects that have them) its types, each in its dialect's format."""
    if dialect == "ollama":  # {"error": "..."}
        return body["error"], None
    if dialect == "openai":  # {"error": {"message", "type", "param", "code"}}
        return body["error"]["message"], (body["error"]["type"], body["error"]["code"])
    return body["error"]["message"], (body["type"], body["error"]["type"])  # {"type": "error", "error": {...}}


ERROR_TYPES = {"ollama": None, "openai": ("authentication_error", "invalid_api_key"),
               "anthropic": ("error", "authentication_error")}


@pytest.fixture
async def open_gateway() -> AsyncIterator[tuple[str, FakeLLM]]:
    """Tenants with keys (one plain, one hashed) and an anonymous policy; keys are not required."""
    async with running(FakeLLM()) as fake, running_gateway(
        [{"name": "b", "url": fake.url}], tenants=OPEN_TENANTS, **EXACT
    ) as url:
        yield url, fake


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("key", ["sk-not-kvgates", HASHED_DIGEST, "ci-key-1x"], ids=["unknown", "digest", "near"])
async def test_an_unknown_key_gets_401_in_each_dialect_once_tenants_have_keys(
    open_gateway: tuple[str, FakeLLM], dialect: str, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    url, fake = open_gateway
    path, body = DIALECTS[dialect]
    caplog.set_level(logging.DEBUG)
    status, answer = await _post(f"{url}{path}", body, {"Authorization": f"Bearer {key}"})
    message, kind = _error(dialect, answer)
    assert status == 401 and kind == ERROR_TYPES[dialect]
    assert message == ("the API key is not one of kvgate's; send a tenant's key as 'Authorization: Bearer <key>' "
                       "or 'X-Api-Key', or none to run as the tenant 'anonymous'")
    assert key not in orjson.dumps(answer).decode() and key not in caplog.text and HASHED_DIGEST not in caplog.text
    assert fake.requests_to(path) == []


@pytest.mark.parametrize("dialect", ["ollama", "openai"])
async def test_a_missing_key_runs_as_anonymous_with_its_caps(open_gateway: tuple[str, FakeLLM], dialect: str) -> None:
    url, fake = open_gateway
    path, body = DIALECTS[dialect]
    long_chat = {**body, "messages": [{"role": "user", "content": "word " * 100}]}
    status, answer = await _post(f"{url}{path}", long_chat, {})
    message, _ = _error(dialect, answer)
    assert status == 400 and "tenant 'anonymous' allows 60; shorten it or ask for a larger cap" in message
    options = {"options": {"num_predict": 4000}} if dialect == "ollama" else {"max_tokens": 4000}
    async with aiohttp.ClientSession() as http, http.post(f"{url}{path}", json={**body, **options}) as response:
        assert response.status == 200
        field = "options.num_predict" if dialect == "ollama" else "max_tokens"
        assert f"{field}=64 (was 4000)" in response.headers["X-Kvgate-Rewrite"].split("; ")
    status, _ = await _post(f"{url}{path}", long_chat, {"X-Api-Key": HASHED_KEY})
    assert status == 200  # the hashed key's tenant has no cap
    assert len(fake.requests_to(path)) == 2


async def test_a_hashed_key_names_its_tenant_and_stays_in_kvgate(
    open_gateway: tuple[str, FakeLLM], caplog: pytest.LogCaptureFixture
) -> None:
    url, fake = open_gateway
    caplog.set_level(logging.DEBUG)
    for headers in ({"Authorization": f"Bearer {HASHED_KEY}"}, {"X-Api-Key": HASHED_KEY}):
        for path in ("/api/chat", "/v1/chat/completions"):
            status, _ = await _post(f"{url}{path}", CHAT, headers)
            assert status == 200
            assert "Authorization" not in fake.seen[-1].headers and "X-Api-Key" not in fake.seen[-1].headers
    await _post(f"{url}/api/chat", CHAT, {})
    async with aiohttp.ClientSession() as http, http.get(f"{url}/kvgate/metrics") as response:
        text = await response.text()
    assert 'kvgate_tenant_requests_total{status="200",tenant="team"} 4.0' in text
    assert 'kvgate_tenant_requests_total{status="200",tenant="anonymous"} 1.0' in text
    assert HASHED_KEY not in caplog.text and HASHED_DIGEST not in caplog.text


async def test_allow_unknown_keys_runs_them_as_anonymous_without_forwarding_them() -> None:
    tenants = {**OPEN_TENANTS, "anonymous": {**OPEN_TENANTS["anonymous"], "allow_unknown_keys": True}}
    async with running(FakeLLM()) as fake, running_gateway([{"name": "b", "url": fake.url}], tenants=tenants,
                                                                **EXACT) as url:
        for path in ("/api/chat", "/v1/chat/completions"):
            status, _ = await _post(f"{url}{path}", CHAT, {"Authorization": "Bearer sk-not-kvgates"})
            assert status == 200
            assert "Authorization" not in fake.seen[-1].headers  # a key in kvgate's place is kvgate's business
        long_chat = {**CHAT, "messages": [{"role": "user", "content": "word " * 100}]}
        status, body = await _post(f"{url}/api/chat", long_chat, {"X-Api-Key": "sk-not-kvgates"})
        assert status == 400 and "tenant 'anonymous' allows 60" in body["error"]


async def test_without_tenant_keys_the_anonymous_caps_apply_and_keys_go_to_the_backend() -> None:
    tenants = {"anonymous": OPEN_TENANTS["anonymous"]}
    async with running(FakeLLM()) as fake, running_gateway([{"name": "b", "url": fake.url}], tenants=tenants,
                                                                **EXACT) as url:
        status, _ = await _post(f"{url}/v1/chat/completions", CHAT, {"Authorization": "Bearer sk-for-the-backend"})
        assert status == 200 and fake.seen[-1].headers["Authorization"] == "Bearer sk-for-the-backend"
        long_chat = {**CHAT, "messages": [{"role": "user", "content": "word " * 100}]}
        status, body = await _post(f"{url}/api/chat", long_chat, {"Authorization": "Bearer sk-for-the-backend"})
        assert status == 400 and "tenant 'anonymous' allows 60" in body["error"]


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Basic dXNlcjpwdw=="}, {"Authorization": "Token ci-key-1"}],
                         ids=["none", "basic", "token"])
async def test_keyless_requests_get_the_tightest_tenant_caps_when_anonymous_has_none(
    headers: dict[str, str],
) -> None:
    """Issue 23, point 3c: tenants have keys, keys are not required, and no ``[tenants.anonymous]``: a request with
    no key or a non-bearer one runs with the tightest of the tenants' caps (ci's max_prompt_tokens 50), not uncapped
    (before the fix: 200); the start-up line that says so: tests/admission/test_keyless.py, test_serve_process.py."""
    async with running(FakeLLM()) as fake, running_gateway([{"name": "b", "url": fake.url}], tenants=TENANTS,
                                                                **EXACT) as url:
        long_chat = {**CHAT, "messages": [{"role": "user", "content": "word " * 100}]}
        status, body = await _post(f"{url}/api/chat", long_chat, headers)
        assert status == 400 and "tenant 'anonymous' allows 50; shorten it" in body["error"], body
        status, _ = await _post(f"{url}/api/chat", long_chat, {"X-Api-Key": "team-key"})
        assert status == 200
        assert fake.requests_to("/api/chat") and all(
            "ci-key-1" not in str(seen.headers) for seen in fake.seen)
