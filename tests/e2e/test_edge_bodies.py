"""Issue 23, point 2: a body's bytes are taken from the held-body budget as they arrive, never its declared
``Content-Length`` up front; when every holder is waiting for room, the one holding the most loses (no deadlock)."""

from __future__ import annotations

import asyncio
import io
import json

import aiohttp
import pytest

from gateway.edge.body.budget import BodyBudget
from gateway.errors import ServerBusy
from tests.support.fake_backend import FakeLLM, running
from tests.support.gateway_server import running_gateway

MiB = 1024 * 1024
JSON = {"Content-Type": "application/json"}
CHAT = {"model": "llama3.1:8b", "messages": [{"role": "user", "content": "hi"}], "stream": False}


async def _declare_and_stall(port: int, declared_bytes: int) -> asyncio.StreamWriter:
    """A connection that declares ``declared_bytes`` of body and sends one byte of it."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n{" % declared_bytes)
    await writer.drain()
    return writer


async def test_declared_but_unsent_bodies_do_not_take_the_budget_from_other_clients() -> None:
    """Four connections declare max_body_bytes - 1 (four of them fill max_held_body_bytes) and send one byte;
    other clients' chats are still answered."""
    async with running(FakeLLM()) as fake, running_gateway(
        [{"name": "ollama", "kind": "ollama", "url": fake.url}],
        server={"max_body_bytes": MiB, "max_held_body_bytes": 4 * MiB, "held_body_wait_s": 0.3,
                "body_timeout_s": 10},
    ) as url:
        port = int(url.rsplit(":", 1)[1])
        stalled = [await _declare_and_stall(port, MiB - 1) for _ in range(4)]
        await asyncio.sleep(0.2)  # their headers are parsed and their handlers run (kvgate shows no count of them)
        try:
            async with aiohttp.ClientSession() as http:
                statuses = []
                for _ in range(3):
                    async with http.post(f"{url}/api/chat", json=CHAT) as response:
                        statuses.append(response.status)
                        await response.read()
            print(f"\n4 connections declaring {MiB - 1:,} bytes and sending 1: other chats answered {statuses}")
            assert statuses == [200, 200, 200]
        finally:
            for writer in stalled:
                writer.close()


async def test_when_every_holder_waits_for_room_the_largest_loses_at_once() -> None:
    """Two bodies arriving at once, each part-held, each needing more than is free: without a rule both wait
    ``wait_s`` and both fail; here the one holding more is refused at once and the other completes."""
    budget = BodyBudget(100, wait_s=30.0)
    big, small = budget.lease(), budget.lease()
    await big.take(60)
    await small.take(30)
    big_more = asyncio.ensure_future(big.take(20))  # 110 > 100: waits
    await asyncio.sleep(0.01)  # a moment in which it stays waiting
    assert not big_more.done()
    small_more = asyncio.ensure_future(small.take(20))  # every holder now waits: the largest (big) loses
    with pytest.raises(ServerBusy) as busy:
        await asyncio.wait_for(big_more, timeout=2)
    assert "server.max_held_body_bytes" in busy.value.message
    await asyncio.wait_for(small_more, timeout=2)
    assert (big.held_bytes, small.held_bytes, budget.held_bytes) == (0, 50, 50)
    small.release()
    assert budget.held_bytes == 0


async def test_a_holder_that_is_not_waiting_keeps_its_bytes() -> None:
    """A request whose body is complete (it holds its bytes until its reply ends) is not a waiter: a newcomer
    waits for it, up to wait_s, and is refused, rather than wounding it."""
    budget = BodyBudget(100, wait_s=0.1)
    done = budget.lease()
    await done.take(90)
    newcomer = budget.lease()
    await newcomer.take(5)
    with pytest.raises(ServerBusy):
        await newcomer.take(20)
    assert (done.held_bytes, newcomer.held_bytes, budget.held_bytes) == (90, 0, 90)



async def test_kvgate_count_bodies_are_held_under_the_same_budget() -> None:
    """/kvgate/count reads a body like a proxied route: its bytes are held under server.max_held_body_bytes with
    every other body, and capped by server.max_body_bytes. Before: read whole outside the budget, so count requests
    could hold any number of 32 MiB bodies while chats were told the budget had room."""
    async with running(FakeLLM()) as fake, running_gateway(
        [{"name": "ollama", "kind": "ollama", "url": fake.url}],
        server={"max_body_bytes": MiB, "max_held_body_bytes": 2 * MiB, "held_body_wait_s": 0.3,
                "body_timeout_s": 10},
    ) as url:
        port = int(url.rsplit(":", 1)[1])
        stalled = []
        for _ in range(2):  # two count bodies, 0.95 MiB each arrived, the rest not yet: 1.9 of 2 MiB held
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /kvgate/count?route=/api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (MiB - 1))
            writer.write(b'{"model": "llama3.1:8b", "messages": [{"role": "user", "content": "'
                         + b"x" * (MiB * 95 // 100))
            await writer.drain()
            stalled.append(writer)
        await asyncio.sleep(0.3)  # their bytes have arrived and are held (kvgate shows no count of them)
        try:
            big_chat = {**CHAT, "messages": [{"role": "user", "content": "y" * (MiB // 2)}]}
            async with aiohttp.ClientSession() as http:
                async with http.post(f"{url}/api/chat", data=io.BytesIO(json.dumps(big_chat).encode()),
                                     headers=JSON) as response:
                    chat_status = response.status
                    await response.read()
                over_body = {**CHAT, "messages": [{"role": "user", "content": "z" * (2 * MiB)}]}
                async with http.post(f"{url}/kvgate/count?route=/api/chat", headers=JSON,
                                     data=io.BytesIO(json.dumps(over_body).encode())) as r:
                    over_status, over = r.status, await r.json()
            print(f"\n2 count bodies holding 1.9 of 2 MiB: a 0.5 MiB chat answered {chat_status}; "
                  f"a 2 MiB count {over_status}")
            assert chat_status == 503
            assert over_status == 413 and "server.max_body_bytes" in str(over)
        finally:
            for writer in stalled:
                writer.close()
