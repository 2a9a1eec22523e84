"""Admission end to end: the failures of facts/llama-server.md section 7 and facts/ollama.md section 4, prevented.

- A real llama-server with its default unified KV pool (-c 4096, -np omitted: 4 slots sharing 4,096 cells): four
  concurrent long chats straight at it fail with 500 "Context size has been exceeded."; through kvgate all four
  complete, queued one after the other.
- The simulated Ollama: a client's different num_ctx no longer reloads the model, a prompt longer than the context
  is cut head-and-tail and said so (or, with on_too_long = "reject", refused in Ollama's format) instead of silently
  truncated, and requests beyond num_parallel queue visibly.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kvsim.config import SimConfig
from kvsim.runner import start_sim
from tests.kvsim.helpers import running_sim
from tests.support.gateway_server import running_gateway
from tests.support.llama_server import RunningLlamaServer, run_llama_server
from tests.support.tinymodel import write_tiny_model

CONTEXT_EXCEEDED = "Context size has been exceeded."


def _long_chat(index: int) -> dict[str, Any]:
    words = " ".join(f"word{(index * 7 + i) % 997}" for i in range(700))
    return {"model": "tiny", "max_tokens": 1500, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"Summarise: {words}"}]}


@pytest.fixture(scope="module")
def unified_server(llama_server_bin: Path) -> Iterator[RunningLlamaServer]:
    model = write_tiny_model(n_ctx_train=8192)
    with run_llama_server(model, "-c", "4096", "-t", "2", log_verbosity=1, binary=llama_server_bin) as server:
        yield server


async def _post_all(url: str, bodies: list[dict[str, Any]]) -> list[tuple[int, str, dict[str, str]]]:
    async with aiohttp.ClientSession() as http:
        async def one(body: dict[str, Any]) -> tuple[int, str, dict[str, str]]:
            async with http.post(f"{url}/v1/chat/completions", json=body) as response:
                return response.status, await response.text(), dict(response.headers)
        return await asyncio.gather(*(one(body) for body in bodies))


@pytest.mark.llama_server
async def test_unified_pool_overrun_fails_everyone_directly_but_not_through_kvgate(
    unified_server: RunningLlamaServer,
) -> None:
    bodies = [_long_chat(i) for i in range(4)]
    direct = await _post_all(unified_server.url, bodies)
    failed = [text for status, text, _ in direct if status == 500 and CONTEXT_EXCEEDED in text]
    assert len(failed) >= 2, [status for status, _, _ in direct]

    async with running_gateway([{"name": "cpp", "kind": "llama-server", "url": unified_server.url}]) as url:
        gated = await _post_all(url, bodies)
    assert [status for status, _, _ in gated] == [200] * 4, [text[:200] for _, text, _ in gated]
    reserved = [int(headers["X-Kvgate-Reserved-Tokens"]) for _, _, headers in gated]
    assert all(2 * r > 4096 for r in reserved), reserved  # no two fit the pool together, so they ran one by one
    waits = sorted(float(headers["X-Kvgate-Queue-Wait"]) for _, _, headers in gated)
    assert waits[0] < 0.5 and waits[-1] > 1.0


@pytest.fixture
async def sim() -> AsyncIterator[str]:
    config = SimConfig(models=("llama3.1:8b",), num_parallel=1, load_s=0.2, time_scale=20.0,
                       min_response_tokens=4, max_response_tokens=8, gen_tokens_per_s=200.0)
    async with running_sim(config) as url:
        yield url


async def _stats(http: aiohttp.ClientSession, sim_url: str) -> dict[str, Any]:
    async with http.get(f"{sim_url}/sim/stats") as response:
        stats: dict[str, Any] = await response.json()
        return stats


def _ollama_chat(content: str, num_ctx: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "llama3.1:8b", "stream": False,
                            "messages": [{"role": "user", "content": content}]}
    if num_ctx is not None:
        body["options"] = {"num_ctx": num_ctx}
    return body


async def test_ollama_num_ctx_is_pinned_and_long_prompts_refused_not_truncated(sim: str) -> None:
    backend = {"name": "sim", "kind": "ollama", "url": sim, "context_tokens": 8192, "parallel": 1}
    async with running_gateway([backend]) as url, aiohttp.ClientSession() as http:
        for num_ctx in (8192, 16384, 2048, None):
            async with http.post(f"{url}/api/chat", json=_ollama_chat("hello there", num_ctx)) as response:
                assert response.status == 200
                if num_ctx not in (8192,):
                    assert "options.num_ctx=8192" in response.headers["X-Kvgate-Rewrite"]
        assert (await _stats(http, sim))["reloads"] == 0
        async with http.get(f"{sim}/api/ps") as response:
            assert (await response.json())["models"][0]["context_length"] == 8192

        novel = " ".join(f"w{i}" for i in range(9000))
        async with http.post(f"{url}/api/chat", json=_ollama_chat(novel, 8192)) as response:
            assert response.status == 200  # one message past the context: its head and tail kept, and said so
            assert response.headers["X-Kvgate-Trimmed"].startswith("cut message 1 of 1 (user): kept the first ")
            assert (await response.json())["prompt_eval_count"] <= 8192
        assert (await _stats(http, sim))["truncated_prompts"] == 0  # never cut silently by Ollama
    async with running_gateway([backend], admission={"on_too_long": "reject"}) as url, \
            aiohttp.ClientSession() as http, http.post(f"{url}/api/chat", json=_ollama_chat(novel, 8192)) as response:
        assert response.status == 400
        error = (await response.json())["error"]
    assert "8,192 tokens per sequence" in error and "shorten it" in error


async def test_requests_beyond_num_parallel_queue_in_kvgate() -> None:
    config = SimConfig(models=("llama3.1:8b",), num_parallel=1, load_s=0.1, min_response_tokens=6,
                       max_response_tokens=6, gen_tokens_per_s=60.0)
    runner, sim = await start_sim(config)
    backend = {"name": "sim", "kind": "ollama", "url": sim, "context_tokens": 4096, "parallel": 1}
    async with running_gateway([backend]) as url:
        async with aiohttp.ClientSession() as http, http.post(f"{url}/api/chat",
                                                              json=_ollama_chat("warm up", None)) as response:
            assert response.status == 200
        results = await _post_all_ollama(url, [_ollama_chat(f"question {i}", None) for i in range(4)])
    await runner.cleanup()
    assert [status for status, _ in results] == [200] * 4
    waits = sorted(wait for _, wait in results)  # each takes ~0.1 s; one runs at a time
    assert waits[0] < 0.05 and waits[-1] > 0.2, waits


async def _post_all_ollama(url: str, bodies: list[dict[str, Any]]) -> list[tuple[int, float]]:
    async with aiohttp.ClientSession() as http:
        async def one(body: dict[str, Any]) -> tuple[int, float]:
            async with http.post(f"{url}/api/chat", json=body) as response:
                await response.read()
                return response.status, float(response.headers["X-Kvgate-Queue-Wait"])
        return await asyncio.gather(*(one(body) for body in bodies))


def _long_history(turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are a patient assistant."}]
    for turn in range(turns):
        text = " ".join(f"t{turn}w{i}" for i in range(120))
        messages += [{"role": "user", "content": text}, {"role": "assistant", "content": text}]
    return [*messages, {"role": "user", "content": "What did we discuss last?"}]


@pytest.mark.parametrize("on_too_long", ["trim", "reject"])
async def test_a_chat_longer_than_the_context_is_trimmed_visibly_or_refused(sim: str, on_too_long: str) -> None:
    backend = {"name": "sim", "kind": "ollama", "url": sim, "context_tokens": 4096, "parallel": 1}
    body = {"model": "llama3.1:8b", "stream": False, "messages": _long_history(30), "options": {"num_predict": 64}}
    async with running_gateway([backend], admission={"on_too_long": on_too_long}) as url, \
            aiohttp.ClientSession() as http, http.post(f"{url}/api/chat", json=body) as response:
        payload = await response.json()
        headers = response.headers
    if on_too_long == "reject":
        assert response.status == 400 and "4,096 tokens per sequence" in payload["error"]
        return
    assert response.status == 200, payload
    assert headers["X-Kvgate-Trimmed"].startswith("dropped the ")
    assert int(headers["X-Kvgate-Prompt-Tokens"]) < 4096 - 64
    # the backend saw the whole trimmed prompt: nothing cut silently on top of the announced trim
    assert payload["prompt_eval_count"] <= int(headers["X-Kvgate-Prompt-Tokens"])
    assert payload["prompt_eval_count"] > 3000


async def test_simulated_unified_pool_at_scale_fails_directly_not_through_kvgate() -> None:
    config = SimConfig(mode="llama-server", ctx_size=8192, time_scale=20.0, gen_tokens_per_s=200.0)
    words = " ".join(f"w{i}" for i in range(1500))
    body = {"model": "llama3.1:8b", "max_tokens": 1500, "messages": [{"role": "user", "content": words}]}
    runner, sim = await start_sim(config)
    try:
        direct = await _post_all(sim, [body] * 6)
    finally:
        await runner.cleanup()
    assert sum(1 for status, text, _ in direct if status == 500 and CONTEXT_EXCEEDED in text) >= 2
    runner, sim = await start_sim(config)
    try:
        async with running_gateway([{"name": "ls", "kind": "llama-server", "url": sim}]) as url:
            gated = await _post_all(url, [body] * 6)
    finally:
        await runner.cleanup()
    assert [status for status, _, _ in gated] == [200] * 6
