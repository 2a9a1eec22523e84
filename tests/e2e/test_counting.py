"""Every proxied request is counted: X-Kvgate-Prompt-Tokens / X-Kvgate-Counter, and POST /kvgate/count.

Against a real llama-server (tiny model, real Llama 3 tokenizer, Llama 3.1 template): the llama-server backend counts
through the server itself, an OpenAI-kind backend with the model's GGUF file counts with the converted tokenizer;
both equal the server's own usage.prompt_tokens. A backend nothing is known about gets a flagged estimate.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import openai
import pytest

from tests.support.fake_backend import FakeLLM, running
from tests.support.gateway_server import running_gateway
from tests.support.llama_server import RunningLlamaServer, run_llama_server
from tests.support.poll import until
from tests.support.tinymodel import write_tiny_model

TEMPLATE = Path(__file__).parents[1] / "tokens" / "data" / "llama-3.1-instruct.jinja"
CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Schreib mir ein Gedicht über Kühe 🐄 and `print(1)`."},
    {"role": "assistant", "content": "Muh."},
    {"role": "user", "content": "Again, longer."},
]


@pytest.fixture(scope="module")
def model_path() -> Path:
    return write_tiny_model(n_ctx_train=4096)


@pytest.fixture(scope="module")
def server(llama_server_bin: Path, model_path: Path) -> Iterator[RunningLlamaServer]:
    args = ("-c", "4096", "-np", "1", "--chat-template-file", str(TEMPLATE), "-t", "2")
    with run_llama_server(model_path, *args, log_verbosity=1, binary=llama_server_bin) as running:
        yield running


@pytest.fixture
async def gateway(server: RunningLlamaServer, model_path: Path) -> AsyncIterator[str]:
    backends = [
        {"name": "cpp", "kind": "llama-server", "url": server.url},
        {"name": "cpp-as-openai", "kind": "openai", "url": server.url},
    ]
    models = {"tiny.gguf": {"gguf_path": str(model_path), "chat_template": "llama3.1"}}
    async with running_gateway(backends, models=models) as url:
        yield url


@pytest.mark.llama_server
@pytest.mark.parametrize(("backend", "model", "counter"), [("cpp", "tiny", "llama-server"),
                                                           ("cpp-as-openai", "tiny.gguf", "gguf")])
async def test_count_header_equals_the_servers_usage(gateway: str, backend: str, model: str, counter: str) -> None:
    client = openai.AsyncOpenAI(base_url=f"{gateway}/v1", api_key="x", max_retries=0,
                                default_headers={"X-Kvgate-Test": backend})
    async with aiohttp.ClientSession() as http, http.post(f"{gateway}/kvgate/count", json={"model": model,
                                                                                          "messages": CHAT}) as r:
        counted = await r.json()
    raw = await client.chat.completions.with_raw_response.create(
        model=model, messages=CHAT, max_tokens=1, extra_body={"tool_choice": "none"}  # type: ignore[arg-type]
    )
    completion = raw.parse()
    await client.close()
    assert completion.usage is not None
    assert raw.headers["X-Kvgate-Backend"] in ("cpp", "cpp-as-openai")
    assert int(raw.headers["X-Kvgate-Prompt-Tokens"]) == completion.usage.prompt_tokens
    assert raw.headers["X-Kvgate-Counter"].split(";")[1].strip() == "exact"
    assert counted["prompt_tokens"] == completion.usage.prompt_tokens and counted["exact"] is True


async def test_unknown_backend_model_gets_a_flagged_estimate() -> None:
    async with running(FakeLLM()) as fake, running_gateway([{"name": "o", "url": fake.url}]) as url, \
            aiohttp.ClientSession() as http:
        async with http.post(f"{url}/api/chat", json={"model": "llama3.1:8b", "stream": False,
                                                      "messages": [{"role": "user", "content": "x" * 300}]}) as r:
            assert r.status == 200
            assert r.headers["X-Kvgate-Counter"] == "estimate; estimate"
            assert int(r.headers["X-Kvgate-Prompt-Tokens"]) >= 100
        async with http.post(f"{url}/kvgate/count?route=/api/generate",
                             json={"model": "llama3.1:8b", "prompt": "hello"}) as r:
            body = await r.json()
            assert body["exact"] is False and body["route"] == "/api/generate" and body["prompt_tokens"] > 0
        async with http.post(f"{url}/kvgate/count?route=/api/tags", json={}) as r:
            assert r.status == 400 and "allowed: /api/chat" in (await r.json())["error"]["message"]


async def test_invalid_utf8_is_counted_by_bytes_not_a_crash() -> None:
    async with running(FakeLLM()) as fake, running_gateway([{"name": "o", "url": fake.url}]) as url, \
            aiohttp.ClientSession() as http:
        raw = b'{"model": "llama3.1:8b", "prompt": "ok \\udc80 broken surrogate", "stream": false}'
        async with http.post(f"{url}/api/generate", data=raw) as r:
            assert r.status == 200
            assert int(r.headers["X-Kvgate-Prompt-Tokens"]) > 0


async def test_raw_invalid_utf8_bytes_pass_through_unchanged() -> None:
    async with running(FakeLLM()) as fake, running_gateway([{"name": "o", "url": fake.url}]) as url, \
            aiohttp.ClientSession() as http:
        # the loaded context and an output limit: nothing to rewrite, so the client's bytes go out as they came
        raw = (b'{"model": "llama3.1:8b", "stream": false, "options": {"num_ctx": 8192, "num_predict": 16}, '
               b'"messages": [{"role": "user", "content": "caf\xe9 \xff"}]}')
        async with http.post(f"{url}/api/chat", data=raw) as r:
            assert r.status == 200
            assert int(r.headers["X-Kvgate-Prompt-Tokens"]) > 0
            assert "X-Kvgate-Rewrite" not in r.headers
        assert fake.seen[-1].body == raw
        # with no limit, kvgate sends the one it reserved; the odd bytes still go out as they came
        raw = b'{"model": "llama3.1:8b", "stream": false, "messages": [{"role": "user", "content": "caf\xe9 \xff"}]}'
        async with http.post(f"{url}/api/chat", data=raw) as r:
            assert r.status == 200
            assert "options.num_predict=" in r.headers["X-Kvgate-Rewrite"]
        assert b"caf\xe9 \xff" in fake.seen[-1].body


@pytest.mark.llama_server
async def test_streaming_through_kvgate_to_a_real_llama_server(gateway: str) -> None:
    client = openai.AsyncOpenAI(base_url=f"{gateway}/v1", api_key="x", max_retries=0)
    stream = await client.chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=20, stream=True,  # type: ignore[call-overload]
        stream_options={"include_usage": True}, extra_body={"tool_choice": "none", "ignore_eos": True},
    )
    chunks = [chunk async for chunk in stream]
    await client.close()
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 20
    assert sum(1 for chunk in chunks if chunk.choices and chunk.choices[0].delta.content) >= 10


async def test_no_request_waits_for_a_tokenizer_build(tmp_path: Path) -> None:
    from kvsim.config import SimConfig
    from kvsim.runner import start_sim

    runner, sim = await start_sim(SimConfig(models=("llama3.1:8b",), load_s=0.05, time_scale=50.0,
                                            min_response_tokens=2, max_response_tokens=3))
    chat = {"model": "llama3.1:8b", "stream": False, "messages": [{"role": "user", "content": "Hello there!"}]}
    try:
        async with running_gateway([{"name": "sim", "url": sim, "context_tokens": 4096}],
                                   counting={"cache_dir": str(tmp_path), "count_budget_s": 0.05}) as url, \
                aiohttp.ClientSession() as http:
            async with http.post(f"{url}/api/chat", json=chat) as response:
                assert response.status == 200
                assert response.headers["X-Kvgate-Counter"] == "estimate; estimate"
            counters = []

            async def counted_by_gguf() -> bool:  # the Llama 3 tokenizer is fetched from /api/show and built meanwhile
                async with http.post(f"{url}/api/chat", json=chat) as response:
                    counters.append(response.headers["X-Kvgate-Counter"].split(";")[0])
                return counters[-1] == "gguf"

            await until(counted_by_gguf, timeout_s=20, interval_s=0.1)
            assert await asyncio.to_thread(lambda: list(tmp_path.iterdir()))  # the tokenizer is cached on disk
    finally:
        await runner.cleanup()
