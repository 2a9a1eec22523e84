"""Routing by model across backends, merged listings, and request ids in headers and logs."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest

from gateway.observability.logs import RequestIdFilter
from tests.support.fake_backend import FakeLLM, Script, running
from tests.support.gateway_server import running_gateway

Pair = tuple[str, FakeLLM, FakeLLM]


@pytest.fixture
async def two_backends() -> AsyncIterator[Pair]:
    ollama_fake = FakeLLM(Script(models=("llama3.1:latest", "shared:7b")))
    server_fake = FakeLLM(Script(models=("tiny-gguf", "shared:7b")))
    async with running(ollama_fake), running(server_fake):
        backends = [
            {"name": "ollama", "kind": "ollama", "url": ollama_fake.url},
            {"name": "cpp", "kind": "llama-server", "url": server_fake.url, "api_key": "upstream-secret"},
        ]
        async with running_gateway(backends) as url:
            yield url, ollama_fake, server_fake


async def _post(url: str, json: dict[str, object], headers: dict[str, str] | None = None) -> aiohttp.ClientResponse:
    async with aiohttp.ClientSession() as http, http.post(url, json=json, headers=headers) as response:
        await response.read()
        return response


async def test_a_request_goes_to_the_backend_serving_its_model(two_backends: Pair) -> None:
    url, ollama_fake, server_fake = two_backends
    response = await _post(f"{url}/v1/chat/completions", {"model": "tiny-gguf", "messages": []})
    assert response.headers["X-Kvgate-Backend"] == "cpp"
    assert server_fake.seen[-1].path_qs == "/v1/chat/completions"
    assert server_fake.seen[-1].headers["Authorization"] == "Bearer upstream-secret"
    response = await _post(f"{url}/api/chat", {"model": "llama3.1", "messages": []})
    assert response.headers["X-Kvgate-Backend"] == "ollama"
    assert "Authorization" not in ollama_fake.seen[-1].headers


async def test_unknown_model_goes_to_the_default_backend(two_backends: Pair) -> None:
    url, _, _ = two_backends
    response = await _post(f"{url}/api/chat", {"model": "nowhere:1b", "messages": []})
    assert response.headers["X-Kvgate-Backend"] == "ollama"


async def test_llama_server_routes_go_to_a_llama_server_backend(two_backends: Pair) -> None:
    url, _, server_fake = two_backends
    response = await _post(f"{url}/tokenize?with_pieces=1", {"content": "hello"})
    assert response.headers["X-Kvgate-Backend"] == "cpp"
    assert server_fake.seen[-1].path_qs == "/tokenize?with_pieces=1"


async def test_listings_merge_all_backends(two_backends: Pair) -> None:
    url, _, _ = two_backends
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{url}/api/tags") as response:
            tags = [model["name"] for model in (await response.json())["models"]]
        async with http.get(f"{url}/v1/models") as response:
            ids = [model["id"] for model in (await response.json())["data"]]
        async with http.get(f"{url}/v1/models/tiny-gguf") as response:
            assert response.headers["X-Kvgate-Backend"] == "cpp"
    assert tags == ["llama3.1:latest", "shared:7b", "tiny-gguf"]
    assert ids == ["llama3.1:latest", "shared:7b", "tiny-gguf"]


async def test_listing_survives_one_backend_down() -> None:
    async with running(FakeLLM()) as fake, running_gateway(
        [{"name": "up", "url": fake.url}, {"name": "down", "url": "http://127.0.0.1:9"}]
    ) as url, aiohttp.ClientSession() as http, http.get(f"{url}/api/tags") as response:
        assert response.status == 200
        assert response.headers["X-Kvgate-Unreachable"] == "down"
        assert len((await response.json())["models"]) == 2


async def test_request_id_is_kept_forwarded_and_logged(two_backends: Pair, caplog: pytest.LogCaptureFixture) -> None:
    url, ollama_fake, _ = two_backends
    caplog.handler.addFilter(RequestIdFilter())
    with caplog.at_level(logging.INFO):
        response = await _post(f"{url}/api/chat", {"model": "llama3.1", "messages": []}, {"X-Request-ID": "abc-123"})
        bad = await _post(f"{url}/api/chat", {"messages": "x"}, {"X-Request-ID": "bad-1"})
    assert response.headers["X-Request-ID"] == "abc-123"
    assert ollama_fake.seen[-1].headers["X-Request-ID"] == "abc-123"
    assert bad.status == 400 and bad.headers["X-Request-ID"] == "bad-1"
    ids = {getattr(record, "request_id", None) for record in caplog.records if record.name == "gateway.proxy"}
    assert {"abc-123", "bad-1"} <= ids


async def test_request_id_is_generated_when_absent(two_backends: Pair) -> None:
    url, ollama_fake, _ = two_backends
    response = await _post(f"{url}/api/chat", {"model": "llama3.1", "messages": []})
    generated = response.headers["X-Request-ID"]
    assert len(generated) == 32
    assert ollama_fake.seen[-1].headers["X-Request-ID"] == generated
