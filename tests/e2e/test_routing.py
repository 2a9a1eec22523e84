"""Routing by memory end to end: two and three simulated llama-server hosts serving the same model.

- A burst spreads over the hosts and none of it waits in kvgate's queue while another host has room.
- A conversation stays on its host (its prompt cache) while that host has room, and moves when it is full.
- A host killed mid-run loses only the requests it was streaming; those admitted there but not answered yet, and
  every new one, are served by the others, and the dead host is taken out.

The matrix of where requests went is printed (pytest -s).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from kvsim.config import SimConfig
from kvsim.runner import start_sim
from tests.support.gateway_server import running_gateway
from tests.support.poll import until

HOST = SimConfig(mode="llama-server", ctx_size=8192, time_scale=1.0, prompt_tokens_per_s=20_000.0,
                 gen_tokens_per_s=100.0, min_response_tokens=30, max_response_tokens=30)
"""4 slots sharing 8,192 cells; an answer takes about 0.3 s."""
WORDS = " ".join(f"w{i}" for i in range(300))


@pytest.fixture(scope="module", autouse=True)
def _warm_simulator() -> None:
    """The first simulator of a process builds its model's vocabulary (about 2 s); not inside a timed test."""

    async def start_and_stop() -> None:
        runner, _ = await start_sim(HOST)
        await runner.cleanup()

    asyncio.run(start_and_stop())


def _chat(index: int, *, max_tokens: int = 2000, stream: bool = False,
          history: list[dict[str, str]] | None = None) -> dict[str, Any]:
    messages = history or [{"role": "system", "content": f"conversation {index}"},
                           {"role": "user", "content": f"{WORDS} question {index}"}]
    return {"model": "llama3.1:8b", "max_tokens": max_tokens, "stream": stream, "messages": messages}


@asynccontextmanager
async def _hosts(count: int) -> AsyncIterator[list[tuple[web.AppRunner, str]]]:
    async with AsyncExitStack() as stack:
        hosts = []
        for _ in range(count):
            runner, url = await start_sim(HOST)
            stack.push_async_callback(runner.cleanup)
            hosts.append((runner, url))
        yield hosts


def _backends(hosts: list[tuple[web.AppRunner, str]]) -> list[dict[str, Any]]:
    return [{"name": f"gpu{i}", "kind": "llama-server", "url": url} for i, (_, url) in enumerate(hosts)]


async def _post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    async with http.post(f"{url}/v1/chat/completions", json=body) as response:
        return response.status, dict(response.headers), await response.read()


def _print_matrix(title: str, rows: list[tuple[int, dict[str, str]]]) -> None:
    print(f"\n{title}\n{'req':<4} {'status':<7} {'backend':<8} {'queue wait':<11} route")
    for index, (status, headers) in enumerate(rows):
        print(f"{index:<4} {status:<7} {headers.get('X-Kvgate-Backend', '-'):<8} "
              f"{headers.get('X-Kvgate-Queue-Wait', '0'):<11} {headers.get('X-Kvgate-Route', '-')}")


async def _burst(hosts: int, requests: int) -> tuple[list[tuple[int, dict[str, str], bytes]], float]:
    async with _hosts(hosts) as running, running_gateway(_backends(running)) as url, \
            aiohttp.ClientSession() as http:
        started = time.perf_counter()
        results = await asyncio.gather(*(_post(http, url, _chat(i)) for i in range(requests)))
        return list(results), time.perf_counter() - started


async def test_a_burst_spreads_over_two_hosts_and_none_waits() -> None:
    # each request reserves ~2,400 of a host's 8,192 cells: 3 fit a host at once, so 6 on one host would queue 3
    results, elapsed_s = await _burst(2, 6)
    _print_matrix(f"6 requests, 2 hosts ({elapsed_s:.2f} s)", [(s, h) for s, h, _ in results])
    assert [status for status, _, _ in results] == [200] * 6
    assert Counter(h["X-Kvgate-Backend"] for _, h, _ in results) == {"gpu0": 3, "gpu1": 3}
    assert all(_waited_s(headers) < 0.05 for _, headers, _ in results)
    assert all(headers["X-Kvgate-Route"].startswith("resident") for _, headers, _ in results)


async def test_a_burst_spreads_over_three_hosts() -> None:
    results, elapsed_s = await _burst(3, 9)
    _print_matrix(f"9 requests, 3 hosts ({elapsed_s:.2f} s)", [(s, h) for s, h, _ in results])
    assert [status for status, _, _ in results] == [200] * 9
    assert Counter(h["X-Kvgate-Backend"] for _, h, _ in results) == {"gpu0": 3, "gpu1": 3, "gpu2": 3}
    assert all(_waited_s(headers) < 0.05 for _, headers, _ in results)


@pytest.mark.parametrize("model", [None, "made-up"], ids=["no model", "a made-up model"])
async def test_requests_naming_no_listed_model_spread_over_llama_servers_too(model: str | None) -> None:
    """llama-server runs its one model whatever a request names: a burst without ``model`` (or with a name no
    server lists) spreads over the servers listing the same models, as a named one does."""
    async with _hosts(2) as running, running_gateway(_backends(running)) as url, aiohttp.ClientSession() as http:
        bodies = [{k: v for k, v in _chat(i).items() if k != "model"} | ({"model": model} if model else {})
                  for i in range(6)]
        results = await asyncio.gather(*(_post(http, url, body) for body in bodies))
    _print_matrix(f"6 requests, model {model!r}, 2 hosts", [(s, h) for s, h, _ in results])
    assert [status for status, _, _ in results] == [200] * 6
    assert Counter(h["X-Kvgate-Backend"] for _, h, _ in results) == {"gpu0": 3, "gpu1": 3}
    assert all(_waited_s(headers) < 0.05 for _, headers, _ in results)


def _gateway_holds(
    http: aiohttp.ClientSession, url: str, *, active: int = 0, queued: int = 0
) -> Callable[[], Awaitable[bool]]:
    """A predicate for ``until``: kvgate's pools, all hosts together, run ``active`` sequences and queue ``queued``."""

    async def pools_hold() -> bool:
        async with http.get(f"{url}/kvgate/status") as reply:
            pools = (await reply.json())["pools"]
        return (sum(p["active_sequences"] for p in pools), sum(p["queued"] for p in pools)) == (active, queued)

    pools_hold.__qualname__ = f"kvgate's pools hold {active} active, {queued} queued"
    return pools_hold


def _waited_s(headers: dict[str, str]) -> float:
    return float(headers.get("X-Kvgate-Queue-Wait", "0"))


async def test_a_conversation_stays_on_its_host_while_it_fits_then_moves() -> None:
    """With ``routing.sticky_slack_s = 0`` a conversation moves as soon as its host would make it wait at all (the
    default, 1 s, keeps it where a short wait costs less than re-reading its history elsewhere)."""
    async with _hosts(2) as running, running_gateway(_backends(running), routing={"sticky_slack_s": 0}) as url, \
            aiohttp.ClientSession() as http:
        opening = _chat(0)["messages"]

        def turn(text: str, max_tokens: int = 200) -> dict[str, Any]:
            history = [*opening, {"role": "assistant", "content": "ok"}, {"role": "user", "content": text}]
            return _chat(0, max_tokens=max_tokens, history=history)

        rows = []
        status, first, _ = await _post(http, url, _chat(0, max_tokens=200))
        rows.append((status, first))
        for text in ("turn 1", "turn 2"):  # the other host has as much room: the conversation stays
            status, headers, _ = await _post(http, url, turn(text))
            rows.append((status, headers))
            assert headers["X-Kvgate-Backend"] == "gpu0" and headers["X-Kvgate-Route"].startswith("sticky")
        # five long requests of other conversations: 3 fill gpu0, 2 leave room on gpu1
        fillers = asyncio.gather(*(_post(http, url, _chat(10 + i, max_tokens=2000)) for i in range(5)))
        await until(_gateway_holds(http, url, active=5))
        status, moved, _ = await _post(http, url, turn("turn 3", max_tokens=2000))
        rows.append((status, moved))
        filled = await fillers
        status, back, _ = await _post(http, url, turn("turn 4"))
        rows.append((status, back))
        rows.extend((s, h) for s, h, _ in filled)
        _print_matrix("a conversation (rows 0-4) and 5 others (rows 5-9)", rows)
        assert Counter(h["X-Kvgate-Backend"] for _, h, _ in filled) == {"gpu0": 3, "gpu1": 2}
        assert moved["X-Kvgate-Backend"] == "gpu1" and not moved["X-Kvgate-Route"].startswith("sticky")
        assert _waited_s(moved) < 0.05
        assert back["X-Kvgate-Backend"] == "gpu1" and back["X-Kvgate-Route"].startswith("sticky")  # it moved


async def test_a_killed_host_loses_only_what_it_was_streaming() -> None:
    async with _hosts(2) as running, running_gateway(_backends(running), routing={"down_s": 30.0}) as url, \
            aiohttp.ClientSession() as http:
        dead_runner, _ = running[0]
        streamed: list[tuple[int, dict[str, str], bytes]] = []
        begun: list[int] = []

        async def stream(index: int) -> None:
            async with http.post(f"{url}/v1/chat/completions", json=_chat(index, stream=True)) as response:
                first = await response.content.readany()
                begun.append(index)
                body = first + await response.read()
                streamed.append((response.status, dict(response.headers), body))

        def six_streams_begun() -> bool:
            return len(begun) == 6

        # 8 requests: 3 streaming on each host, 1 queued on each (their pools hold 3 at a time)
        tasks = [asyncio.create_task(stream(i)) for i in range(6)]
        await until(six_streams_begun)
        queued = [asyncio.create_task(_post(http, url, _chat(100 + i))) for i in range(2)]
        await until(_gateway_holds(http, url, active=6, queued=2))
        await _kill(dead_runner)
        await asyncio.gather(*tasks)
        after = await asyncio.gather(*queued, *(_post(http, url, _chat(200 + i, max_tokens=200)) for i in range(3)))
        rows = [(s, h) for s, h, _ in streamed] + [(s, h) for s, h, _ in after]
        _print_matrix("gpu0 killed mid-run: 6 streams, then 2 queued and 3 new requests", rows)
        lost = [(h, body) for s, h, body in streamed if h["X-Kvgate-Backend"] == "gpu0"]
        kept = [(s, body) for s, h, body in streamed if h["X-Kvgate-Backend"] == "gpu1"]
        assert len(lost) == 3 and all(b"[DONE]" not in body for _, body in lost)
        assert all(status == 200 and b"[DONE]" in body for status, body in kept)
        assert [status for status, _, _ in after] == [200] * 5
        assert all(headers["X-Kvgate-Backend"] == "gpu1" for _, headers, _ in after)
        async with http.get(f"{url}/kvgate/metrics") as response:
            metrics = await response.text()
        assert 'kvgate_backend_out{backend="gpu0"} 1.0' in metrics
        assert 'kvgate_backend_out{backend="gpu1"} 0.0' in metrics
        async with http.get(f"{url}/kvgate/status") as response:
            routing = {b["name"]: b["routing"] for b in (await response.json())["backends"]}
        print(f"status page routing: {routing}")
        # out for down_s (30 s), doubled when a second request failed there too, up to max_down_s (120 s)
        assert 0 < routing["gpu0"]["out_for_s"] <= 120.0 and routing["gpu0"]["outages"] >= 1
        assert routing["gpu0"]["out_reason"]
        assert routing["gpu1"] == {"out_for_s": None, "out_reason": None, "outages": 0, "retries": 0}


async def _kill(runner: web.AppRunner) -> None:
    """Stop listening and break every open connection, as a crashed host would."""
    for site in list(runner.sites):
        await site.stop()
    server = runner.server
    assert server is not None
    for handler in server.connections:
        if handler.transport is not None:
            handler.transport.abort()
