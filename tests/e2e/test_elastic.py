"""Elastic reservations (issue 25) end to end, on the simulated llama-server's unified pool: a cold model reserves
the whole limit; a warm one reserves its usual answer and grows as it streams; short answers then run side by side
where fixed reservations ran one at a time; long answers that would overrun the pool are ended cleanly by kvgate
(``finish_reason: length``, a ``kvgate`` field), never by the server failing every request at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from kvsim.config import SimConfig
from tests.kvsim.helpers import running_sim
from tests.support.gateway_server import running_gateway

PROMPT = "tell me about the weather in the hills " * 60  # ~500 tokens with the chat template
UNIFIED = SimConfig(mode="llama-server", ctx_size=2048, n_parallel=-1, load_s=0.0, time_scale=20.0,
                    min_response_tokens=20, max_response_tokens=120, gen_tokens_per_s=400.0,
                    prompt_tokens_per_s=20000.0)
WARM = 24  # more than admission.elastic.min_samples (20)


@pytest.fixture
async def sim() -> AsyncIterator[str]:
    async with running_sim(UNIFIED) as url:
        yield url


async def _stream(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    """One streamed chat: status, headers, when its first and last bytes came, its events, and its final chunk."""
    started = time.monotonic()
    first: float | None = None
    events: list[dict[str, Any]] = []
    async with http.post(f"{url}/v1/chat/completions", json={"stream": True, **body}) as response:
        raw = b""
        async for chunk in response.content.iter_any():
            first = first or time.monotonic()
            raw += chunk
        status, headers = response.status, dict(response.headers)
    for line in raw.split(b"\n\n"):
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            events.append(orjson.loads(line[6:]))
    return {"status": status, "headers": headers, "first": first or started, "end": time.monotonic(),
            "events": events, "done": raw.rstrip().endswith(b"data: [DONE]"), "raw": raw}


def _chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], **extra}


async def _warm(http: aiohttp.ClientSession, url: str, count: int = WARM) -> None:
    for index in range(count):
        reply = await _stream(http, url, _chat(f"{index} {PROMPT}"))
        assert reply["status"] == 200, reply["raw"][:300]


def _overlap(replies: list[dict[str, Any]]) -> int:
    """The most replies streaming at one instant (from their first byte to their last)."""
    edges = sorted([(r["first"], 1) for r in replies] + [(r["end"], -1) for r in replies])
    peak = now = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


async def _sim_stats(http: aiohttp.ClientSession, sim: str) -> dict[str, Any]:
    async with http.get(f"{sim}/sim/stats") as response:
        stats: dict[str, Any] = await response.json()
    return stats


async def _status_pool(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(f"{url}/kvgate/status") as response:
        pools: list[dict[str, Any]] = (await response.json())["pools"]
    return pools[0]


async def test_a_cold_model_reserves_the_whole_limit_and_a_warm_one_its_usual_answer(sim: str) -> None:
    backends = [{"name": "cpp", "kind": "llama-server", "url": sim}]
    async with running_gateway(backends, admission={"elastic": {"not_streamed": True}}) as url, \
            aiohttp.ClientSession() as http:
        cold = await _stream(http, url, _chat(PROMPT))
        await _warm(http, url)
        warm = await _stream(http, url, _chat(PROMPT))
        plain = await _stream(http, url, _chat(PROMPT, stream=False))  # followed through /slots
    rows = []
    for name, reply in (("cold", cold), ("warm", warm), ("not streamed", plain)):
        headers = reply["headers"]
        rows.append((name, int(headers["X-Kvgate-Prompt-Tokens"]), int(headers["X-Kvgate-Reserved-Tokens"]),
                     headers.get("X-Kvgate-Rewrite", "")))
        print(f"{name:13} prompt {rows[-1][1]:5} reserved {rows[-1][2]:5} {rows[-1][3]}")
    (_, cold_prompt, cold_reserved, cold_rewrite), (_, warm_prompt, warm_reserved, warm_rewrite) = rows[:2]
    limit = int(cold_rewrite.split("max_tokens=")[1].split(" ")[0])
    assert cold_reserved == cold_prompt + limit  # cold: today's rule
    assert warm_rewrite == cold_rewrite  # the backend is told the same limit: answers are not cut shorter
    assert warm_prompt + 20 <= warm_reserved <= warm_prompt + 128  # p95 of 20..120 tokens, at least the floor
    assert rows[2][2] == warm_reserved  # not streamed: llama-server's /slots say how far it is
    assert all(event.get("kvgate") is None for event in warm["events"])


async def test_short_answers_run_side_by_side_where_fixed_reservations_ran_one_at_a_time(sim: str) -> None:
    backends = [{"name": "cpp", "kind": "llama-server", "url": sim}]
    overlaps: dict[str, int] = {}
    for elastic in (False, True):
        async with running_gateway(backends, admission={"elastic": {"enabled": elastic}}) as url, \
                aiohttp.ClientSession() as http:
            await _warm(http, url)
            replies = await asyncio.gather(*(_stream(http, url, _chat(f"x{i} {PROMPT}")) for i in range(8)))
            stats = await _sim_stats(http, sim)
            pool = await _status_pool(http, url)
        assert all(r["status"] == 200 and r["done"] for r in replies), [r["raw"][:200] for r in replies]
        overlaps["elastic" if elastic else "fixed"] = _overlap(replies)
        assert stats["context_exceeded"] == 0
        assert pool["reserved_tokens"] == 0 and pool["active_sequences"] == 0
    print(f"most replies streaming at once: {overlaps}")
    assert overlaps["fixed"] == 1
    assert overlaps["elastic"] >= 2


async def test_long_answers_that_would_overrun_the_pool_are_ended_cleanly_never_failed(sim: str) -> None:
    """Answers that run to their limit (ignore_eos): two admitted on their usual answer grow past what the pool
    holds for both; kvgate ends one with a normal final event, and the server fails none."""
    backends = [{"name": "cpp", "kind": "llama-server", "url": sim}]
    async with running_gateway(backends) as url, aiohttp.ClientSession() as http:
        await _warm(http, url)
        replies = await asyncio.gather(*(
            _stream(http, url, _chat(f"long {i} {PROMPT}", ignore_eos=True, max_tokens=1400)) for i in range(3)))
        stats = await _sim_stats(http, sim)
        pool = await _status_pool(http, url)
    ended = [r for r in replies if any("kvgate" in event for event in r["events"])]
    for reply in replies:
        final = reply["events"][-1]
        print(f"status {reply['status']} events {len(reply['events']):5} finish "
              f"{final['choices'][0].get('finish_reason')!s:7} kvgate: {str(final.get('kvgate'))[:90]}")
    assert all(r["status"] == 200 and r["done"] for r in replies)
    assert stats["context_exceeded"] == 0 and stats["failed"] == 0
    assert ended, "the pool can't hold three answers of 1,900 tokens: kvgate ends one"
    for reply in ended:
        final = reply["events"][-1]
        assert final["choices"][0]["finish_reason"] == "length"
        assert "kvgate ended this reply" in final["kvgate"]
    assert pool["reserved_tokens"] == 0 and pool["active_sequences"] == 0
    assert pool["ended_by_kvgate_total"] == len(ended)


async def test_the_openai_sdk_reads_an_answer_kvgate_ended_as_one_cut_at_its_limit(sim: str) -> None:
    """The official SDK, unmodified: the ended reply is a normal stream whose last choice says "length"; the reason
    rides in the chunk's extra field."""
    backends = [{"name": "cpp", "kind": "llama-server", "url": sim}]
    async with running_gateway(backends) as url, aiohttp.ClientSession() as http:
        await _warm(http, url)
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)

        async def one(index: int) -> tuple[str | None, Any, int]:
            stream = await client.chat.completions.create(
                model="anything", messages=[{"role": "user", "content": f"sdk {index} {PROMPT}"}], stream=True,
                max_tokens=1400, extra_body={"ignore_eos": True})
            finish, extra, pieces = None, None, 0
            async for chunk in stream:
                pieces += 1
                if chunk.choices and chunk.choices[0].finish_reason is not None:
                    finish, extra = chunk.choices[0].finish_reason, (chunk.model_extra or {}).get("kvgate")
            return finish, extra, pieces

        results = await asyncio.gather(*(one(i) for i in range(3)))
        await client.close()
        stats = await _sim_stats(http, sim)
    for finish, extra, pieces in results:
        print(f"finish {finish} after {pieces} chunks; kvgate: {str(extra)[:80]}")
    assert all(finish == "length" for finish, _, _ in results)
    assert any(extra and "kvgate ended this reply" in extra for _, extra, _ in results)
    assert stats["context_exceeded"] == 0


async def _plain(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with http.post(f"{url}/v1/chat/completions", json={"stream": False, **body}) as response:
        return response.status, orjson.loads(await response.read())


REAL_SPEED = dataclasses.replace(UNIFIED, time_scale=1.0, gen_tokens_per_s=400.0)
"""A GPU's pace (400 tokens a second a sequence): kvgate reads /slots ten times a second."""


async def test_replies_that_are_not_streamed_grow_as_their_slots_fill() -> None:
    """Long answers not streamed: kvgate reads /slots while they run and grows their holds; the server fails none,
    and one kvgate must end gets a 503 in the client's format before any byte, never a broken answer."""
    async with running_sim(REAL_SPEED) as sim:
        backends = [{"name": "cpp", "kind": "llama-server", "url": sim}]
        async with running_gateway(backends, admission={"elastic": {"min_samples": 5, "not_streamed": True}}) as url, \
                aiohttp.ClientSession() as http:
            await _warm(http, url, 6)
            replies = await asyncio.gather(*(
                _plain(http, url, _chat(f"plain {i} {PROMPT}", ignore_eos=True, max_tokens=700)) for i in range(3)))
            stats = await _sim_stats(http, sim)
            pool = await _status_pool(http, url)
    _check_plain(replies, stats, pool)


def _check_plain(replies: list[tuple[int, dict[str, Any]]], stats: dict[str, Any], pool: dict[str, Any]) -> None:
    for status, body in replies:
        usage = body.get("usage", {})
        print(f"status {status} completion_tokens {usage.get('completion_tokens')} "
              f"error {str(body.get('error', {}).get('message'))[:80]}")
    assert stats["context_exceeded"] == 0 and stats["failed"] == 0
    assert all(status in (200, 503) for status, _ in replies)
    assert sum(status == 200 for status, _ in replies) >= 1  # two of 1,200 tokens never fit 2,048 together
    for status, body in replies:
        if status == 503:
            assert body["error"]["code"] == "reply_ended_by_kvgate"
        else:
            assert body["usage"]["completion_tokens"] == 700
    assert pool["reserved_tokens"] == 0 and pool["active_sequences"] == 0


async def test_replies_that_are_not_streamed_keep_fixed_reservations_by_default(sim: str) -> None:
    backends = [{"name": "cpp", "kind": "llama-server", "url": sim}]
    async with running_gateway(backends) as url, aiohttp.ClientSession() as http:
        await _warm(http, url)
        plain = await _stream(http, url, _chat(PROMPT, stream=False))
        streamed = await _stream(http, url, _chat(PROMPT))
    reserved = int(plain["headers"]["X-Kvgate-Reserved-Tokens"])
    assert reserved == int(plain["headers"]["X-Kvgate-Prompt-Tokens"]) + 1024  # the whole limit: never a 503
    assert int(streamed["headers"]["X-Kvgate-Reserved-Tokens"]) < reserved
