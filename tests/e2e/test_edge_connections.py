"""Issue 23, point 2: every client's share of the connections bounded (gateway/edge/serving.py, gateway/edge/limits.py).

- Slow bodies (a byte now and then) hold every connection slot: at ``server.max_connections`` the slowest body is
  closed to make room, so legitimate requests are answered, on a route kvgate reads whole and on one streamed
  through (/api/blobs); past ``server.body_grace_s`` a body slower than ``server.min_body_bytes_per_s`` gets 408
  (read whole) or its connection closed (streamed through).
- One client address holds at most ``server.max_connections_per_peer`` connections: beyond it, 429 in the route's
  dialect and the connection closed.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp

from gateway.edge.limits import body_too_slow, slowest
from tests.support.fake_backend import FakeLLM, running
from tests.support.gateway_server import running_gateway
from tests.support.poll import until

CAP = 20
SLOW = 2 * CAP
"""Slow-body clients: twice the connection cap (before the fix, the first CAP hold every slot)."""
LEGIT = 10
CHAT = {"model": "llama3.1:8b", "messages": [{"role": "user", "content": "hi"}], "stream": False}
BLOB = "/api/blobs/sha256:" + "0" * 64
BODY_HEAD = {  # path -> request head of a slow body (it declares 1,000 bytes and sends one every TRICKLE_S)
    "/api/chat": b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n",
    BLOB: f"POST {BLOB} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n".encode(),
}
TRICKLE_S = 0.5


class SlowBody:
    """A client sending a body a byte every ``TRICKLE_S``; notes when kvgate answered or closed."""

    def __init__(self, port: int, path: str) -> None:
        self.port, self.path = port, path
        self.answer = b""
        self.ended_after_s: float | None = None
        self.connected = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            self.connected.set()
            return
        start = time.monotonic()
        writer.write(BODY_HEAD[self.path])
        self.connected.set()
        reading = asyncio.create_task(reader.read(65536))
        try:
            while not stop.is_set():
                done, _ = await asyncio.wait({reading}, timeout=TRICKLE_S)
                if done:
                    self.answer = reading.result()
                    self.ended_after_s = time.monotonic() - start
                    return
                writer.write(b" ")
        except (ConnectionError, OSError):
            self.ended_after_s = time.monotonic() - start
        finally:
            reading.cancel()
            writer.close()


@asynccontextmanager
async def slow_bodies(port: int, path: str, n: int) -> AsyncIterator[list[SlowBody]]:
    stop = asyncio.Event()
    clients = [SlowBody(port, path) for _ in range(n)]
    tasks = []
    for client in clients:  # one after another: the first CAP take the slots, the rest find the cap
        tasks.append(asyncio.create_task(client.run(stop)))
        await client.connected.wait()
        await asyncio.sleep(0.005)  # a gap, so kvgate accepts them in this order (it shows no count to wait on)
    try:
        yield clients
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=10)


async def _legit(http: aiohttp.ClientSession, url: str, path: str) -> int:
    try:
        if path == BLOB:
            async with http.post(f"{url}{BLOB}", data=b"x" * 1000) as response:
                await response.read()
                return response.status
        async with http.post(f"{url}/api/chat", json=CHAT) as response:
            await response.read()
            return response.status
    except aiohttp.ClientError:
        return 0


async def test_slow_bodies_at_the_cap_leave_legitimate_requests_answered() -> None:
    """CAP slow bodies would hold every slot for the whole grace period (5 s here): each new connection closes
    the slowest body instead, on a route read whole and on one streamed through."""
    rows = []
    async with running(FakeLLM()) as fake, running_gateway(
        [{"name": "ollama", "kind": "ollama", "url": fake.url}],
        server={"max_connections": CAP, "max_connections_per_peer": 1000, "body_grace_s": 5.0,
                "min_body_bytes_per_s": 100, "body_timeout_s": 30, "header_timeout_s": 5},
    ) as url:
        port = int(url.rsplit(":", 1)[1])
        for path in ("/api/chat", BLOB):
            async with slow_bodies(port, path, SLOW) as clients:
                await asyncio.sleep(0.3)  # kvgate reads their headers and starts their bodies (no count to wait on)
                started = time.monotonic()
                connector = aiohttp.TCPConnector(force_close=True, limit=0)
                async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=10)) as http:
                    statuses = [await _legit(http, url, path) for _ in range(LEGIT)]
                took_s = time.monotonic() - started
                cut = sum(c.ended_after_s is not None for c in clients)
                rows.append((path, statuses.count(200) + statuses.count(201), took_s, cut))
                assert all(status in (200, 201) for status in statuses), (path, statuses)
    print(f"\n{SLOW} slow bodies (1 byte / {TRICKLE_S:g} s), max_connections {CAP}, {LEGIT} legitimate requests:")
    for path, answered, took_s, cut in rows:
        print(f"  {path[:20]:20}  answered {answered}/{LEGIT} in {took_s:.2f} s; slow connections closed {cut}")


async def test_a_body_slower_than_the_minimum_rate_is_cut_after_the_grace_period() -> None:
    async with running(FakeLLM()) as fake, running_gateway(
        [{"name": "ollama", "kind": "ollama", "url": fake.url}],
        server={"body_grace_s": 0.5, "min_body_bytes_per_s": 100, "body_timeout_s": 30, "header_timeout_s": 5},
    ) as url:
        port = int(url.rsplit(":", 1)[1])
        async with slow_bodies(port, "/api/chat", 1) as (read_whole,), slow_bodies(port, BLOB, 1) as (streamed,):

            def both_ended() -> bool:
                return read_whole.ended_after_s is not None and streamed.ended_after_s is not None

            await until(both_ended, timeout_s=5, interval_s=0.05)
        print(f"\na body at 2 B/s (minimum 100 B/s after 0.5 s): read whole answered after {read_whole.ended_after_s}"
              f" s with {read_whole.answer[:12]!r}; streamed through closed after {streamed.ended_after_s} s")
        assert read_whole.ended_after_s is not None and read_whole.ended_after_s < 4
        assert read_whole.answer.startswith(b"HTTP/1.1 408"), read_whole.answer[:200]
        message = json.loads(read_whole.answer.partition(b"\r\n\r\n")[2])["error"]
        assert "server.min_body_bytes_per_s" in message and "100" in message
        assert streamed.ended_after_s is not None and streamed.ended_after_s < 4
        assert not streamed.answer.startswith(b"HTTP/1.1 2")
        async with aiohttp.ClientSession() as http, http.get(f"{url}/kvgate/metrics") as response:
            metrics = await response.text()
        assert 'kvgate_client_closes_total{reason="slow_body"} 2.0' in metrics


async def test_connections_past_the_per_peer_limit_get_429_in_the_routes_dialect() -> None:
    async with running(FakeLLM()) as fake, running_gateway(
        [{"name": "ollama", "kind": "ollama", "url": fake.url}], server={"max_connections_per_peer": 3},
    ) as url:
        port = int(url.rsplit(":", 1)[1])
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        await asyncio.sleep(0.05)  # kvgate accepts and counts them (it shows no count to wait on)
        try:
            connector = aiohttp.TCPConnector(force_close=True)
            async with aiohttp.ClientSession(connector=connector) as http:
                async with http.get(f"{url}/api/tags") as response:
                    ollama = response.status, await response.json(), response.headers.get("Retry-After")
                async with http.get(f"{url}/v1/models") as response:
                    openai = response.status, await response.json()
            print(f"\n3 connections held, a 4th from the same address: /api/tags {ollama[0]}, /v1/models {openai[0]}")
            assert ollama[0] == 429 and openai[0] == 429
            assert "server.max_connections_per_peer" in ollama[1]["error"] and "is 3;" in ollama[1]["error"]
            assert openai[1]["error"]["code"] == "rate_limited" and ollama[2] is not None
        finally:
            for _, writer in held:
                writer.close()

        async def room_again() -> bool:  # the held ones closed
            async with aiohttp.ClientSession() as http, http.get(f"{url}/api/tags") as response:
                return response.status == 200

        await until(room_again)


def test_pure_decisions() -> None:
    assert not body_too_slow(received_bytes=10, elapsed_s=0.4, min_bytes_per_s=100, grace_s=0.5)  # in its grace
    assert body_too_slow(received_bytes=10, elapsed_s=1.0, min_bytes_per_s=100, grace_s=0.5)
    assert not body_too_slow(received_bytes=200, elapsed_s=1.0, min_bytes_per_s=100, grace_s=0.5)
    assert not body_too_slow(received_bytes=0, elapsed_s=100.0, min_bytes_per_s=0, grace_s=0.5)  # no minimum
    assert slowest([("a", 100, 1.0), ("b", 10, 1.0), ("c", 10, 2.0)]) == "c"
    assert slowest([]) is None
