"""An OpenAI-compatible server's own count (gateway/tokens/backend_tokenize.py): vLLM's /tokenize, llama-server's
routes, or neither; probed once per backend, remembered, and given up quietly where there is no such route."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.backends.client import BackendClient
from gateway.tokens.backend_tokenize import BackendTokenizeCounter, TokenizeEndpoints, TokenizeFlavor
from gateway.tokens.byte_estimate import EstimateCounter
from gateway.tokens.chain import CounterChain
from gateway.tokens.count import CounterUnavailable
from tests.support.fake_backend import FakeLLM, json_answer, running, serve, text_answer
from tests.support.fake_vllm import FakeVllm, chat_tokens, running_vllm, text_tokens

CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there, how are you?"}]
TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]


async def test_vllm_counts_chats_and_prompts_exactly_and_is_probed_once() -> None:
    async with running_vllm(FakeVllm()) as vllm, aiohttp.ClientSession() as session:
        endpoints = TokenizeEndpoints(BackendClient(session, vllm.url))
        counter = BackendTokenizeCounter(endpoints, model=vllm.model)
        counts = await asyncio.gather(*(counter.count_chat(CHAT, TOOLS) for _ in range(5)))
        text = await counter.count_text("a prompt of some length", add_special=False)
    assert {c.tokens for c in counts} == {chat_tokens(CHAT, TOOLS)} and counts[0].exact
    assert counts[0].counter == "vllm" and text.tokens == text_tokens("a prompt of some length") and text.exact
    probes = [b for b in vllm.bodies("/tokenize") if "model" not in b]
    assert len(probes) == 1  # five concurrent first counts share one probe
    assert endpoints.flavor is TokenizeFlavor.VLLM and endpoints.max_model_len == 4096
    counted = [b for b in vllm.bodies("/tokenize") if "model" in b]
    assert all(b["model"] == vllm.model for b in counted) and counted[0]["tools"] == TOOLS
    assert counted[-1]["add_special_tokens"] is False


async def test_a_model_the_server_does_not_serve_is_unavailable_not_remembered() -> None:
    async with running_vllm(FakeVllm()) as vllm, aiohttp.ClientSession() as session:
        endpoints = TokenizeEndpoints(BackendClient(session, vllm.url))
        with pytest.raises(CounterUnavailable) as unavailable:
            await BackendTokenizeCounter(endpoints, model="made-up").count_chat(CHAT)
        assert not unavailable.value.quiet and "does not exist" in unavailable.value.reason
        assert endpoints.flavor is TokenizeFlavor.VLLM  # the route is there: the next model is counted
        assert (await BackendTokenizeCounter(endpoints, model=vllm.model).count_chat(CHAT)).exact


async def test_a_llama_server_behind_kind_openai_is_counted_by_its_own_routes() -> None:
    fake = FakeLLM()
    fake.answers["/tokenize"] = json_answer({"tokens": [1, 2, 3]})
    fake.answers["/v1/chat/completions/input_tokens"] = json_answer({"input_tokens": 42})
    async with running(fake), aiohttp.ClientSession() as session:
        endpoints = TokenizeEndpoints(BackendClient(session, fake.url))
        counter = BackendTokenizeCounter(endpoints, model="m")
        chat = await counter.count_chat(CHAT)
        text = await counter.count_text("abc")
    assert (chat.tokens, chat.counter, chat.exact) == (42, "llama-server", True)
    assert (text.tokens, text.counter, text.exact) == (3, "llama-server", True)
    assert endpoints.flavor is TokenizeFlavor.LLAMA_SERVER


def _no_route(status: int) -> dict[tuple[str, str], Any]:
    return {("POST", "/tokenize"): json_answer({"detail": "Not Found"}, status=status)}


@pytest.mark.parametrize(("name", "routes", "flavor"), [
    ("404", _no_route(404), TokenizeFlavor.NONE),
    ("405", _no_route(405), TokenizeFlavor.NONE),
    ("501", _no_route(501), TokenizeFlavor.NONE),
    ("an answer of neither shape", {("POST", "/tokenize"): json_answer({"echo": "/tokenize"})}, TokenizeFlavor.NONE),
    ("a 500: nothing learned", {("POST", "/tokenize"): json_answer({"error": "boom"}, status=500)}, None),
    ("not JSON: nothing learned", {("POST", "/tokenize"): text_answer("<html>")}, None),
], ids=lambda v: v if isinstance(v, str) else "")
async def test_what_a_probe_learns(name: str, routes: dict[tuple[str, str], Any], flavor: TokenizeFlavor | None,
                                   caplog: pytest.LogCaptureFixture) -> None:
    """404, 405, 501 or an answer of neither shape: no such endpoint, remembered, and the chain falls back quietly
    (INFO, not WARNING); any other failure decides nothing and the next count probes again."""
    caplog.set_level(logging.INFO, "gateway.tokens.chain")
    hits: list[int] = []

    async def counted(request: web.Request) -> web.StreamResponse:
        hits.append(1)
        answer: web.StreamResponse = await routes[("POST", "/tokenize")](request)
        return answer

    async with serve({("POST", "/tokenize"): counted}) as url, aiohttp.ClientSession() as session:
        endpoints = TokenizeEndpoints(BackendClient(session, url))
        chain = CounterChain("m", [BackendTokenizeCounter(endpoints, model="m"), EstimateCounter()])
        for _ in range(3):
            assert (await chain.count_chat(CHAT)).counter == "estimate"
    assert endpoints.flavor is flavor
    assert len(hits) == (1 if flavor is not None else 3)
    levels = {r.levelno for r in caplog.records if r.name == "gateway.tokens.chain"}
    assert levels == ({logging.INFO} if flavor is not None else {logging.WARNING}), name


async def test_a_backend_that_is_down_is_probed_again_later() -> None:
    async with aiohttp.ClientSession() as session:
        endpoints = TokenizeEndpoints(BackendClient(session, "http://127.0.0.1:9"))
        with pytest.raises(CounterUnavailable):
            await BackendTokenizeCounter(endpoints, model="m").count_chat(CHAT)
        assert endpoints.flavor is None


async def test_the_backend_key_travels_and_never_shows_in_a_repr() -> None:
    seen: list[str] = []

    async def tokenize(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("Authorization", ""))
        return web.json_response({"count": 3, "max_model_len": 8, "tokens": [1, 2, 3]})

    async with serve({("POST", "/tokenize"): tokenize}) as url, aiohttp.ClientSession() as session:
        counter = BackendTokenizeCounter(TokenizeEndpoints(BackendClient(session, url, api_key="sk-secret")),
                                         model="m")
        assert (await counter.count_text("x")).tokens == 3
    assert seen == ["Bearer sk-secret"] * 2 and "sk-secret" not in repr(counter)


async def test_a_configured_context_past_vllms_max_model_len_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.tokens.backend_tokenize")
    async with running_vllm(FakeVllm(max_model_len=4096)) as vllm, aiohttp.ClientSession() as session:
        endpoints = TokenizeEndpoints(BackendClient(session, vllm.url, label="backend 'vllm'"), context_tokens=8192)
        await BackendTokenizeCounter(endpoints, model=vllm.model).count_text("x")
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert said == ["backend 'vllm' has context_tokens = 8192, but the server's max_model_len is 4096: kvgate admits "
                    "prompts the server refuses; set context_tokens = 4096"]
