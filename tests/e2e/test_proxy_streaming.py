"""Streaming, headers, disconnects and backend faults, against scripted fake upstreams on loopback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import aiohttp
import orjson
import pytest

from tests.support.fake_backend import FakeLLM, Script, running
from tests.support.gateway_server import running_gateway
from tests.support.poll import until

CHAT = {"model": "llama3.1:8b", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def fake() -> AsyncIterator[FakeLLM]:
    async with running(FakeLLM()) as server:
        yield server


def _backend(fake: FakeLLM, *, first_byte_s: float = 30.0, idle_s: float = 30.0) -> dict[str, object]:
    """Long deadlines unless a test is about them: nothing else ends a request by the clock."""
    return {"name": "gpu0", "url": fake.url, "timeouts": {"first_byte_s": first_byte_s, "idle_s": idle_s}}


@pytest.fixture
async def gateway(fake: FakeLLM) -> AsyncIterator[str]:
    async with running_gateway([_backend(fake)]) as url:
        yield url


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def test_stream_chunks_reach_the_client_before_the_stream_ends(
    fake: FakeLLM, gateway: str, http: aiohttp.ClientSession
) -> None:
    fake.script.hold_after_chunks = 1
    async with http.post(f"{gateway}/api/chat", json=CHAT) as response:
        first = await asyncio.wait_for(response.content.readline(), timeout=2)
        assert orjson.loads(first)["message"]["content"] == "tok0 "
        fake.script.release.set()
        rest = await response.read()
    assert rest.count(b"\n") == 3
    assert response.headers["Content-Type"] == "application/x-ndjson"


async def test_sse_passes_through_byte_for_byte(fake: FakeLLM, gateway: str, http: aiohttp.ClientSession) -> None:
    body = {**CHAT, "stream": True}
    async with http.post(f"{fake.url}/v1/chat/completions", json=body) as direct:
        expected = await direct.read()
    async with http.post(f"{gateway}/v1/chat/completions", json=body) as response:
        assert response.headers["Content-Type"] == "text/event-stream"
        assert await response.read() == expected
    assert expected.endswith(b"data: [DONE]\n\n")


async def test_headers_end_to_end_kept_hop_by_hop_dropped_host_rewritten(
    fake: FakeLLM, gateway: str, http: aiohttp.ClientSession
) -> None:
    fake.script.extra_headers = {"Keep-Alive": "timeout=5", "X-Model-Info": "yes"}
    sent = {"Proxy-Authorization": "Basic xyz", "TE": "trailers", "Connection": "keep-alive, X-Secret",
            "X-Secret": "1", "X-Client": "kept", "Host": "evil.example.com"}
    async with http.post(f"{gateway}/api/chat", json=CHAT, headers=sent) as response:
        await response.read()
    assert response.headers["X-Upstream"] == "fake"
    assert response.headers["X-Model-Info"] == "yes"
    assert "Keep-Alive" not in response.headers
    assert response.headers["X-Kvgate-Backend"] == "gpu0"
    upstream = fake.seen[-1].headers
    assert upstream["Host"] == fake.url.removeprefix("http://")
    assert upstream["X-Client"] == "kept"
    for name in ("Proxy-Authorization", "TE", "X-Secret"):
        assert name not in upstream


async def test_client_disconnect_closes_the_upstream_request_within_a_second(
    fake: FakeLLM, gateway: str, http: aiohttp.ClientSession
) -> None:
    fake.script.stall_after_chunks = 1
    response = await http.post(f"{gateway}/api/chat", json=CHAT)
    await asyncio.wait_for(response.content.readline(), timeout=2)
    disconnected_at = time.monotonic()
    response.close()
    await until(lambda: fake.cancelled)  # the upstream request was closed
    path, cancelled_at = fake.cancelled[0]
    assert path == "/api/chat"
    assert cancelled_at - disconnected_at < 1.0


async def test_client_disconnect_while_waiting_for_first_byte_closes_upstream(
    fake: FakeLLM, gateway: str, http: aiohttp.ClientSession
) -> None:
    async with http.post(f"{gateway}/api/chat", json=CHAT) as primed:  # models listed, counter ready
        assert primed.status == 200
    fake.cancelled.clear()
    fake.script.first_byte_delay_s = 60  # never answers before the client gives up (the gateway waits 30 s)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await http.post(f"{gateway}/api/chat", json=CHAT)
    await until(lambda: fake.cancelled)
    assert [path for path, _ in fake.cancelled] == ["/api/chat"]


async def test_upstream_error_is_relayed_with_status_and_body(
    fake: FakeLLM, gateway: str, http: aiohttp.ClientSession
) -> None:
    fake.script.status = 500
    fake.script.error_body = b'{"error":"llama-server process has terminated: exit status 2"}'
    async with http.post(f"{gateway}/api/chat", json=CHAT) as response:
        assert response.status == 500
        assert await response.read() == fake.script.error_body


async def test_slow_first_byte_gives_504_in_dialect(fake: FakeLLM, http: aiohttp.ClientSession) -> None:
    async with running_gateway([_backend(fake, first_byte_s=0.2)]) as gateway:
        async with http.post(f"{gateway}/v1/chat/completions", json=CHAT) as primed:  # the KV pool learnt
            assert primed.status == 200
        fake.script.first_byte_delay_s = 60
        async with http.post(f"{gateway}/v1/chat/completions", json=CHAT) as response:
            assert response.status == 504
            error = (await response.json())["error"]
    assert "backend 'gpu0'" in error["message"] and "first_byte_s" in error["message"]
    assert error["type"] == "api_error" and error["code"] == "backend_timeout"


async def test_stall_mid_stream_ends_with_a_final_error_line(fake: FakeLLM, http: aiohttp.ClientSession) -> None:
    fake.script.stall_after_chunks = 2
    async with running_gateway([_backend(fake, idle_s=0.2)]) as gateway, \
            http.post(f"{gateway}/api/chat", json=CHAT) as response:
        assert response.status == 200
        lines = (await response.read()).splitlines()
    assert len(lines) == 3
    assert "stalled" in orjson.loads(lines[-1])["error"]


async def test_upstream_disconnect_mid_stream_ends_with_a_final_sse_error(
    fake: FakeLLM, gateway: str, http: aiohttp.ClientSession
) -> None:
    fake.script.disconnect_after_chunks = 1
    async with http.post(f"{gateway}/v1/chat/completions", json={**CHAT, "stream": True}) as response:
        events = (await response.read()).split(b"\n\n")
    final = orjson.loads(events[-2].removeprefix(b"data: "))
    assert "broke off the stream" in final["error"]["message"]


async def test_malformed_upstream_line_passes_through_unchanged(
    fake: FakeLLM, gateway: str, http: aiohttp.ClientSession
) -> None:
    fake.script.malformed_after_chunks = 1
    async with http.post(f"{gateway}/api/generate", json={"model": "llama3.1:8b", "prompt": "x"}) as response:
        lines = (await response.read()).splitlines()
    assert lines[1] == b"{not json"
    assert orjson.loads(lines[-1])["done"] is True


@pytest.mark.parametrize(
    ("path", "dialect_check"),
    [
        ("/api/chat", lambda body: "backend 'down'" in body["error"]),
        ("/v1/chat/completions", lambda body: "backend 'down'" in body["error"]["message"]),
        ("/v1/messages", lambda body: body["type"] == "error" and "backend 'down'" in body["error"]["message"]),
        ("/completion", lambda body: body["error"]["code"] == 502 and "backend 'down'" in body["error"]["message"]),
    ],
)
async def test_unreachable_backend_gives_502_at_once_naming_it(
    path: str, dialect_check: object, http: aiohttp.ClientSession
) -> None:
    """A chat for a backend that refuses connections and never answered is never forwarded unaccounted, nor held
    for ``probe_wait_s``: a 502 at once, in the route's format, naming the backend and the reason (a backend that
    answered moments ago is waited for instead: tests/e2e/test_backend_down.py)."""
    async with running_gateway([{"name": "down", "url": "http://127.0.0.1:9"}]) as url:
        body = {**CHAT, "prompt": "x"}
        async with http.post(f"{url}{path}", json=body) as response:
            assert response.status == 502
            payload = await response.json()
            assert callable(dialect_check) and dialect_check(payload)
            said = orjson.dumps(payload).decode()
            assert "backend 'down'" in said and "Connect call failed" in said and "it is down" in said


async def test_unreachable_backend_gives_502_naming_it_on_other_routes(http: aiohttp.ClientSession) -> None:
    async with running_gateway([{"name": "down", "url": "http://127.0.0.1:9"}]) as url, \
            http.post(f"{url}/api/show", json={"model": "m"}) as response:
        assert response.status == 502
        assert "backend 'down'" in (await response.json())["error"]


async def test_head_and_root_pass_through(fake: FakeLLM, gateway: str, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{gateway}/") as response:
        assert await response.text() == "Ollama is running"
    async with http.head(f"{gateway}/") as response:
        assert response.status == 200
    async with http.get(f"{gateway}/api/version") as response:
        assert (await response.json())["version"] == "0.33.0"


@pytest.mark.parametrize(("closes", "status"), [(1, 200), (2, 502)])
async def test_a_connection_closed_before_answering_is_retried_once(
    closes: int, status: int, http: aiohttp.ClientSession
) -> None:
    """A backend that drops a (kept-alive) connection without answering: kvgate sends the request once more; a
    second drop is a 502 naming the backend, never a third try."""
    async with running(FakeLLM(Script(models=("m",), drop_connections=closes))) as fake, \
            running_gateway([{"name": "flaky", "url": fake.url}], admission={"enabled": False}) as url:
        body = {"model": "m", "stream": False, "messages": [{"role": "user", "content": "hi"}]}
        async with http.post(f"{url}/api/chat", json=body) as response:
            assert response.status == status
            if status == 502:
                assert "backend 'flaky'" in (await response.json())["error"]
    seen = [request.body for request in fake.requests_to("/api/chat")]
    assert len(seen) == 2 and seen[0] == seen[1]
