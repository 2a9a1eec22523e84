"""Every route of the table reaches a backend with its method, path and query intact."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from gateway.edge.routes import ROUTES, Handling
from tests.support.fake_backend import FakeLLM, running
from tests.support.gateway_server import running_gateway

BODY = {"model": "llama3.1:8b", "messages": [{"role": "user", "content": "hi"}], "prompt": "hi", "input": "hi",
        "content": "hi", "tokens": [1, 2], "query": "hi", "documents": ["a", "b"], "stream": False}
FORWARDED = [(method, route.path) for route in ROUTES if route.handling is not Handling.LISTING
             for method in route.methods]


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[str, FakeLLM]]:
    async with running(FakeLLM()) as fake, running_gateway([{"name": "b", "url": fake.url}]) as url:
        yield url, fake


@pytest.mark.parametrize(("method", "template"), FORWARDED)
async def test_route_is_forwarded(gateway: tuple[str, FakeLLM], method: str, template: str) -> None:
    url, fake = gateway
    path = (template.replace("{digest}", "sha256:abc").replace("{model:.+}", "llama3.1:8b").replace("{id_slot}", "0")
            + "?trace=1")
    async with aiohttp.ClientSession() as http, http.request(
        method, url + path, json=None if method in ("GET", "HEAD") else BODY
    ) as response:
        assert response.status < 500, await response.text()
        assert response.headers["X-Kvgate-Backend"] == "b"
    seen = fake.seen[-1]
    assert (seen.method, seen.path_qs) == (method, path)


@pytest.mark.parametrize("path", ["/api/ps", "/api/tags", "/v1/models"])
async def test_listing_routes_answer_from_the_backends(gateway: tuple[str, FakeLLM], path: str) -> None:
    url, _ = gateway
    async with aiohttp.ClientSession() as http, http.get(url + path) as response:
        body = await response.json()
    assert response.status == 200
    assert body.get("models") or body.get("data")


async def test_unknown_paths_go_to_the_default_backend_unchanged(gateway: tuple[str, FakeLLM]) -> None:
    url, fake = gateway
    async with aiohttp.ClientSession() as http, http.patch(f"{url}/custom/thing?x=1", data=b"raw") as response:
        assert (await response.json()) == {"echo": "/custom/thing"}
    assert (fake.seen[-1].method, fake.seen[-1].path_qs, fake.seen[-1].body) == ("PATCH", "/custom/thing?x=1", b"raw")


@pytest.mark.parametrize(("method", "path", "status", "allow"), [
    ("DELETE", "/kvgate/reload", 405, "POST"),
    ("POST", "/kvgate/status", 405, "GET"),
    ("PUT", "/kvgate/metrics", 405, "GET"),
    ("GET", "/kvgate/nothing-here", 404, None),
    ("POST", "/kvgate/v1/chat/completions", 404, None),
])
async def test_kvgates_own_namespace_is_never_forwarded(
    gateway: tuple[str, FakeLLM], method: str, path: str, status: int, allow: str | None,
) -> None:
    url, fake = gateway
    seen_before = len(fake.seen)
    async with aiohttp.ClientSession() as http, http.request(method, url + path, json=BODY) as response:
        body = await response.json()
        assert (response.status, response.headers.get("Allow")) == (status, allow)
    assert body["error"]["code"] == ("method_not_allowed" if status == 405 else "not_found")
    assert len(fake.seen) == seen_before  # the backend never saw it
