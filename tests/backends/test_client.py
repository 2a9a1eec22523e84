"""BackendClient against a real aiohttp server on loopback: auth and Host on every call, JSON answers, the one
table of transport errors (status, refused, timeouts, drops) and model-name matching."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from pydantic import SecretStr

from gateway.backends.client import (
    BackendBadReply,
    BackendCallError,
    BackendCallTimeout,
    BackendClient,
    BackendDropped,
    BackendStatusError,
    BackendUnreachable,
    call_error,
)
from gateway.config.settings import BackendSettings, TimeoutSettings
from gateway.errors import BackendTimeout, BackendUnavailable

KEY = "sk-backend-key"


class Upstream:
    """A loopback server whose routes say what they saw; ``hold`` keeps /slow from answering until it is set."""

    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []
        self.bodies: list[bytes] = []
        self.hold = asyncio.Event()
        self.drops = 0
        self.peers: list[tuple[str, int]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/json", self.json)
        app.router.add_get("/text", self.answer(lambda: web.Response(text="<html>not json</html>")))
        app.router.add_get("/list", self.answer(lambda: web.json_response([1, 2])))
        app.router.add_get("/missing", self.answer(lambda: web.json_response({"error": "no such model"}, status=404)))
        app.router.add_get("/broken", self.answer(lambda: web.Response(text="llama runner crashed", status=500)))
        app.router.add_get("/slow", self.slow)
        app.router.add_post("/drop", self.drop)
        return app

    def answer(self, response: Callable[[], web.Response]) -> Any:
        async def handler(request: web.Request) -> web.Response:
            self.headers.append(dict(request.headers))
            return response()

        return handler

    async def json(self, request: web.Request) -> web.Response:
        self.headers.append(dict(request.headers))
        assert request.transport is not None
        self.peers.append(request.transport.get_extra_info("peername"))
        self.bodies.append(await request.read())
        return web.json_response({"ok": True, "method": request.method})

    async def slow(self, request: web.Request) -> web.Response:
        await self.hold.wait()
        return web.json_response({"late": True})

    async def drop(self, request: web.Request) -> web.StreamResponse:
        """Closes the connection without answering while ``drops`` is above zero."""
        self.bodies.append(await request.read())
        if self.drops > 0:
            self.drops -= 1
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        return web.json_response({"ok": True})


@contextlib.asynccontextmanager
async def serving(upstream: Upstream) -> AsyncIterator[str]:
    runner = web.AppRunner(upstream.app(), shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        upstream.hold.set()
        await runner.cleanup()


@contextlib.asynccontextmanager
async def client_for(
    upstream: Upstream, *, api_key: str | None = KEY, timeouts: TimeoutSettings | None = None
) -> AsyncIterator[BackendClient]:
    async with serving(upstream) as url, aiohttp.ClientSession() as session:
        settings = BackendSettings(name="gpu0", url=url, api_key=SecretStr(api_key) if api_key else None,
                                   timeouts=timeouts or TimeoutSettings())
        yield BackendClient.for_backend(session, settings)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


async def test_every_call_carries_the_key_and_the_host() -> None:
    upstream = Upstream()
    async with client_for(upstream) as client:
        assert await client.get_json("/json") == {"ok": True, "method": "GET"}
        assert await client.post_json("/json", {"n": 1}) == {"ok": True, "method": "POST"}
        assert await client.request_json("PUT", "/json", {"n": 2}) == {"ok": True, "method": "PUT"}
        response = await client.open("POST", "/json?x=1", {"Authorization": "Bearer client-key", "X-Other": "y"},
                                     b'{"n":3}')
        try:
            assert response.status == 200
        finally:
            response.close()
        host = client.host_header
    assert len(upstream.headers) == 4
    assert all(seen["Authorization"] == f"Bearer {KEY}" for seen in upstream.headers)  # the client's key replaced
    assert all(seen["Host"] == host for seen in upstream.headers)
    assert host.startswith("127.0.0.1:")
    assert upstream.headers[3]["X-Other"] == "y"
    assert [orjson.loads(body) for body in upstream.bodies if body] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert KEY not in repr(client)


async def test_a_json_call_closes_its_connection_and_the_proxy_keeps_its_own() -> None:
    """llama-server gives every open connection a thread until it has been idle 5 s: a JSON call (a count, a probe)
    does not leave its connection open, while the proxy's connections are pooled and reused."""
    upstream = Upstream()
    async with client_for(upstream) as client:
        for _ in range(3):
            await client.post_json("/json", {"n": 1})
        for _ in range(3):
            response = await client.open("POST", "/json", {}, b"{}")
            await response.read()
            response.release()
    assert [seen["Connection"] for seen in upstream.headers[:3]] == ["close"] * 3
    assert all("Connection" not in seen or seen["Connection"] == "keep-alive" for seen in upstream.headers[3:])
    assert len(set(upstream.peers[:3])) == 3  # a new connection each time
    assert len(set(upstream.peers[3:])) == 1  # one pooled connection, reused


async def test_without_a_key_no_authorization_is_added() -> None:
    upstream = Upstream()
    async with client_for(upstream, api_key=None) as client:
        await client.get_json("/json")
    assert "Authorization" not in upstream.headers[0]


async def test_an_answer_that_is_not_json_or_not_an_object_is_a_bad_reply() -> None:
    async with client_for(Upstream()) as client:
        with pytest.raises(BackendBadReply, match=r"GET /text on backend 'gpu0' .* not JSON") as not_json:
            await client.get_json("/text")
        with pytest.raises(BackendBadReply, match="not an object"):
            await client.get_json("/list")
        assert await client.request_json("GET", "/list") == [1, 2]
    assert not_json.value.status == 502 and isinstance(not_json.value, BackendUnavailable)


@pytest.mark.parametrize(("path", "status", "text"), [("/missing", 404, "no such model"),
                                                      ("/broken", 500, "llama runner crashed")])
async def test_an_error_status_names_the_status_and_quotes_the_answer(path: str, status: int, text: str) -> None:
    async with client_for(Upstream()) as client:
        with pytest.raises(BackendStatusError) as caught:
            await client.get_json(path)
    assert caught.value.backend_status == status
    assert f"answered HTTP {status}" in caught.value.message and text in caught.value.message
    assert "backend 'gpu0'" in caught.value.message


async def test_a_refused_connection_is_unreachable() -> None:
    async with aiohttp.ClientSession() as session:
        client = BackendClient(session, f"http://127.0.0.1:{_closed_port()}", api_key=KEY)
        with pytest.raises(BackendUnreachable, match="is unreachable") as caught:
            await client.get_json("/json")
        with pytest.raises(BackendUnreachable):
            await client.open("GET", "/", {}, None)
    assert caught.value.status == 502 and caught.value.backend_status is None
    assert KEY not in caught.value.message


async def test_no_answer_within_first_byte_s_is_a_timeout() -> None:
    upstream = Upstream()
    async with client_for(upstream, timeouts=TimeoutSettings(first_byte_s=0.1)) as client:
        with pytest.raises(BackendCallTimeout, match=r"sent no response within 0\.1 s \(timeouts\.first_byte_s\)"):
            await client.get_json("/slow")
        with pytest.raises(BackendCallTimeout, match=r"backend 'gpu0' .* within 0\.1 s \(timeouts\.first_byte_s\)"):
            await client.open("GET", "/slow", {}, None)
    async with client_for(Upstream()) as client:  # the first one's cleanup released its hold
        with pytest.raises(BackendCallTimeout, match=r"within 0\.1 s$") as caught:  # a call's own cap
            await client.get_json("/slow", timeout_s=0.1)
    assert caught.value.status == 504 and isinstance(caught.value, BackendTimeout)


@pytest.mark.skipif(sys.platform != "linux", reason="relies on Linux dropping SYNs to a full accept queue")
async def test_no_connection_within_connect_s_is_a_timeout() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        url = "http://{}:{}".format(*listener.getsockname())
        with socket.create_connection(listener.getsockname(), timeout=5):  # fills the queue: later SYNs are dropped
            async with aiohttp.ClientSession() as session:
                client = BackendClient(session, url, timeouts=TimeoutSettings(connect_s=0.1))
                with pytest.raises(BackendCallTimeout, match=r"did not accept a connection within 0\.1 s"):
                    await client.get_json("/json")


@pytest.mark.parametrize(("drops", "answered"), [(1, True), (2, False)])
async def test_a_connection_closed_before_answering_is_sent_once_more(drops: int, answered: bool) -> None:
    upstream = Upstream()
    upstream.drops = drops
    async with client_for(upstream) as client:
        if answered:
            response = await client.open("POST", "/drop", {}, b"body")
            response.close()
            assert response.status == 200
        else:
            with pytest.raises(BackendDropped, match=r"backend 'gpu0' .* failed before answering"):
                await client.open("POST", "/drop", {}, b"body")
    assert upstream.bodies == [b"body", b"body"]  # never a third try


async def test_a_streamed_body_is_not_sent_again() -> None:
    async def body() -> AsyncIterator[bytes]:
        yield b"streamed"

    upstream = Upstream()
    upstream.drops = 1
    async with client_for(upstream) as client:
        with pytest.raises(BackendDropped):
            await client.open("POST", "/drop", {}, body())
    assert upstream.bodies == [b"streamed"]


@pytest.mark.parametrize(("exc", "error", "status"), [
    (aiohttp.ConnectionTimeoutError("connect"), BackendCallTimeout, 504),
    (aiohttp.ServerDisconnectedError(), BackendDropped, 502),
    (aiohttp.ClientPayloadError("cut"), BackendDropped, 502),
    (TimeoutError(), BackendCallTimeout, 504),
    (orjson.JSONDecodeError("bad", "x", 0), BackendBadReply, 502),
    (ValueError("bad"), BackendBadReply, 502),
])
def test_the_error_table(exc: Exception, error: type[BackendCallError], status: int) -> None:
    made = call_error(exc, "GET /x on backend 'b'", connect_s=5, waited="1 s")
    assert type(made) is error and made.status == status and made.message.startswith("GET /x on backend 'b' ")
    assert call_error(made, "elsewhere", connect_s=5, waited="1 s") is made  # translated once
