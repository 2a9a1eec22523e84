"""Issue 22 point 5, end to end: every sequence counted. Multi-prompt batches, embeddings and reranks through kvgate in
front of the simulated llama-server (one task per prompt, each with its own slot and cells, as the real one), and
``n`` on Ollama (which runs one sequence whatever it says)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from kvsim.config import SimConfig
from kvsim.runner import start_sim
from tests.kvsim.helpers import running_sim
from tests.support.gateway_server import running_gateway

UNIFIED = SimConfig(mode="llama-server", server_model="phi3:mini", ctx_size=4096, time_scale=10.0,
                    prompt_tokens_per_s=20000.0, gen_tokens_per_s=2000.0, min_response_tokens=5000,
                    max_response_tokens=5000, embeddings=True, reranking=True)
CONTEXT_EXCEEDED = "Context size has been exceeded."
TENANTS = {"ci": {"api_keys": ["ci-key"], "max_active": 2, "max_prompt_tokens": 500, "max_output_tokens": 8}}


@contextlib.asynccontextmanager
async def llama_sim(config: SimConfig = UNIFIED) -> AsyncIterator[str]:
    async with running_sim(config) as url:
        yield url


@contextlib.asynccontextmanager
async def direct_and_gated(**overrides: Any) -> AsyncIterator[tuple[str, str]]:
    async with llama_sim() as direct, llama_sim() as behind, running_gateway(
            [{"name": "cpp", "kind": "llama-server", "url": behind}], **overrides) as gated:
        yield direct, gated


async def post(url: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=headers or {}) as response:
        raw = await response.read()
        return response.status, dict(response.headers), orjson.loads(raw) if raw.startswith((b"{", b"[")) else raw


def ids(length: int, seed: int) -> list[int]:
    return [100 + (seed * 7 + i) % 500 for i in range(length)]


async def test_a_batch_that_overruns_the_pool_alone_completes_through_kvgate() -> None:
    """Four prompts of 700 tokens with n_predict 400, one request: alone it fails every task straight at the server
    (4 x 1,100 > 4,096 cells); through kvgate the output is lowered so the four fit the pool together, and said."""
    body = {"prompt": [ids(700, i) for i in range(4)], "n_predict": 400}
    async with direct_and_gated() as (direct, gated):
        status, _, payload = await post(direct + "/completion", body)
        assert status == 500 and payload["error"]["message"] == CONTEXT_EXCEEDED
        status, headers, payload = await post(gated + "/completion", body)
    assert status == 200 and [r["index"] for r in payload] == [0, 1, 2, 3]
    assert headers["X-Kvgate-Rewrite"] == "n_predict=324 (was 400)"
    assert int(headers["X-Kvgate-Reserved-Tokens"]) == 4 * (700 + 324) <= 4096
    assert all(r["tokens_predicted"] == 324 for r in payload)


async def test_a_burst_of_batches_is_served_one_pool_at_a_time() -> None:
    """Eight requests of three prompts: each fits the pool alone (3 x 1,100 cells), but the server runs four of
    their tasks at once (4 x 1,100 > 4,096). Straight at it they fail; through kvgate each holds its three sequences
    and all complete."""
    bodies = [{"prompt": [ids(400, 3 * r + i) for i in range(3)], "n_predict": 700} for r in range(8)]
    async with direct_and_gated() as (direct, gated):
        straight = await asyncio.gather(*(post(direct + "/completion", b) for b in bodies))
        through = await asyncio.gather(*(post(gated + "/v1/completions", {**b, "max_tokens": 700}) for b in bodies))
    print(f"\nburst of 8 batches of 3: straight {[s for s, _, _ in straight]}, "
          f"through kvgate {[s for s, _, _ in through]}")
    assert sum(status == 500 for status, _, _ in straight) >= 4
    assert [status for status, _, _ in through] == [200] * 8
    for _, headers, payload in through:
        assert [c["index"] for c in payload["choices"]] == [0, 1, 2]
        assert int(headers["X-Kvgate-Reserved-Tokens"]) == 3 * (400 + 700)


async def test_a_prompt_too_long_for_the_context_is_refused_naming_it() -> None:
    async with direct_and_gated() as (_, gated):
        status, _, payload = await post(gated + "/completion", {"prompt": ["hi", ids(5000, 1)], "n_predict": 8})
    assert status == 400 and payload["error"]["type"] == "invalid_request_error"
    assert payload["error"]["message"].startswith("prompt[1] of the batch of 2 is 5,000 tokens; model ")
    assert "context of 4,096 tokens per sequence" in payload["error"]["message"]


async def test_a_batch_past_the_slots_holds_the_four_that_run_at_once() -> None:
    prompts = [ids(100 * (i + 1), i) for i in range(9)]  # 100 ... 900 tokens
    async with direct_and_gated() as (direct, gated):
        status, headers, payload = await post(gated + "/completion", {"prompt": prompts, "n_predict": 50})
        straight, _, _ = await post(direct + "/completion", {"prompt": prompts, "n_predict": 50})
    assert (status, straight, len(payload)) == (200, 200, 9)
    assert int(headers["X-Kvgate-Reserved-Tokens"]) == (900 + 800 + 700 + 600) + 4 * 50


async def test_tenant_caps_apply_to_every_prompt() -> None:
    key = {"X-Api-Key": "ci-key"}
    async with direct_and_gated(tenants=TENANTS) as (_, gated):
        status, _, payload = await post(gated + "/completion", {"prompt": ["a", "b", "c"], "n_predict": 4}, key)
        assert status == 400 and "tenant 'ci' may run at most 2 sequences at once" in payload["error"]["message"]
        status, _, payload = await post(gated + "/completion", {"prompt": ["a", ids(600, 2)]}, key)
        assert status == 400 and payload["error"]["message"].startswith(
            "prompt[1] of the batch of 2 is 600 tokens; tenant 'ci' allows 500")
        status, headers, payload = await post(gated + "/completion", {"prompt": ["a", "b"], "n_predict": 500}, key)
        assert status == 200 and all(r["tokens_predicted"] <= 8 for r in payload)
        assert "n_predict=8 (was 500)" in headers["X-Kvgate-Rewrite"]


async def test_embeddings_and_reranks_are_admitted_per_input() -> None:
    """A burst of long embeddings overruns the unified pool straight at the server; through kvgate each input holds
    its slot and its tokens, so all complete. A rerank holds one sequence per document."""
    inputs = [{"input": [ids(1800, i)]} for i in range(4)]
    async with direct_and_gated() as (direct, gated):
        straight = await asyncio.gather(*(post(direct + "/v1/embeddings", b) for b in inputs))
        through = await asyncio.gather(*(post(gated + "/v1/embeddings", b) for b in inputs))
        status, headers, many = await post(gated + "/embedding", {"content": [ids(10, 1), ids(20, 2), "hello"]})
        rerank_status, rerank_headers, ranked = await post(
            gated + "/v1/rerank", {"query": "which", "documents": ["one", "two words", "three more words"]})
    assert any(s == 500 for s, _, _ in straight)
    assert [s for s, _, _ in through] == [200] * 4
    assert all(int(h["X-Kvgate-Reserved-Tokens"]) == 1800 for _, h, _ in through)
    assert status == 200 and len(many) == 3 and int(headers["X-Kvgate-Prompt-Tokens"]) > 30
    assert int(headers["X-Kvgate-Reserved-Tokens"]) == int(headers["X-Kvgate-Prompt-Tokens"])  # no output
    assert "X-Kvgate-Rewrite" not in headers  # nothing to limit: nothing written into the body
    assert rerank_status == 200 and len(ranked["results"]) == 3
    assert int(rerank_headers["X-Kvgate-Reserved-Tokens"]) >= ranked["usage"]["prompt_tokens"]


async def test_n_on_ollama_reserves_one_sequence_and_is_forwarded() -> None:
    """Ollama runs one sequence whatever ``n`` says and answers one choice: kvgate reserves one and passes ``n`` on,
    where it used to refuse 400 too_many_sequences on a model with one slot."""
    config = SimConfig(models=("phi3:mini",), context_length=2048, load_s=0.05, time_scale=50.0,
                       min_response_tokens=4, max_response_tokens=8)
    runner, sim = await start_sim(config)
    chat = {"model": "phi3:mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
    try:
        async with running_gateway([{"name": "ollama", "kind": "ollama", "url": sim}]) as url:
            await post(url + "/v1/chat/completions", chat)  # the tokenizer is ready after the first count
            one = await post(url + "/v1/chat/completions", chat)
            two = await post(url + "/v1/chat/completions", {**chat, "n": 2})
            straight = await post(sim + "/v1/chat/completions", {**chat, "n": 2})
    finally:
        await runner.cleanup()
    assert (one[0], two[0], straight[0]) == (200, 200, 200)
    assert len(two[2]["choices"]) == len(straight[2]["choices"]) == 1
    assert two[1]["X-Kvgate-Reserved-Tokens"] == one[1]["X-Kvgate-Reserved-Tokens"] == str(
        int(one[1]["X-Kvgate-Prompt-Tokens"]) + 16)
    assert "n=" not in two[1].get("X-Kvgate-Rewrite", "")
