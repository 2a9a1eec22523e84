"""End to end: the official ``ollama`` and ``openai`` packages, unmodified, talk to a fake server through kvgate."""

from __future__ import annotations

from collections.abc import AsyncIterator

import ollama
import openai
import pytest

from tests.support.fake_backend import MODELS, FakeLLM, running
from tests.support.gateway_server import running_gateway


@pytest.fixture
async def gateway_url() -> AsyncIterator[str]:
    async with running(FakeLLM()) as fake, running_gateway([{"name": "fake", "url": fake.url}]) as url:
        yield url


async def test_ollama_chat_streaming_and_not(gateway_url: str) -> None:
    async with ollama.AsyncClient(host=gateway_url) as client:
        await _ollama_chat(client)


async def _ollama_chat(client: ollama.AsyncClient) -> None:
    reply = await client.chat(model="llama3.1:8b", messages=[{"role": "user", "content": "hi"}])
    assert reply.message.content == "tok0 tok1 tok2 "
    assert reply.prompt_eval_count == 7
    parts = [part async for part in await client.chat(
        model="llama3.1:8b", messages=[{"role": "user", "content": "hi"}], stream=True)]
    assert "".join(p.message.content or "" for p in parts) == "tok0 tok1 tok2 "
    assert parts[-1].done is True


async def test_ollama_generate_embed_and_listing(gateway_url: str) -> None:
    async with ollama.AsyncClient(host=gateway_url) as client:
        await _ollama_generate_embed_list(client)


async def _ollama_generate_embed_list(client: ollama.AsyncClient) -> None:
    generated = await client.generate(model="qwen2.5:7b", prompt="hello")
    assert generated.response == "tok0 tok1 tok2 "
    parts = await client.generate(model="qwen2.5:7b", prompt="x", stream=True)
    streamed = [part.response or "" async for part in parts]
    assert "".join(streamed) == "tok0 tok1 tok2 "
    embedded = await client.embed(model="qwen2.5:7b", input="hello")
    assert list(embedded.embeddings[0]) == [0.1, 0.2, 0.3]
    legacy = await client.embeddings(model="qwen2.5:7b", prompt="hello")
    assert list(legacy.embedding) == [0.1, 0.2, 0.3]
    listed = await client.list()
    assert [m.model for m in listed.models] == list(MODELS)


async def test_openai_chat_streaming_and_not(gateway_url: str) -> None:
    client = openai.AsyncOpenAI(base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0)
    completion = await client.chat.completions.create(
        model="llama3.1:8b", messages=[{"role": "user", "content": "hi"}])
    assert completion.choices[0].message.content == "tok0 tok1 tok2 "
    assert completion.usage is not None and completion.usage.prompt_tokens == 7
    stream = await client.chat.completions.create(
        model="llama3.1:8b", messages=[{"role": "user", "content": "hi"}], stream=True)
    text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
    assert text == "tok0 tok1 tok2 "
    await client.close()


async def test_openai_completions_embeddings_and_models(gateway_url: str) -> None:
    client = openai.AsyncOpenAI(base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0)
    completion = await client.completions.create(model="qwen2.5:7b", prompt="once")
    assert completion.choices[0].text == "tok0 tok1 tok2 "
    embedding = await client.embeddings.create(model="qwen2.5:7b", input="hello")
    assert embedding.data[0].embedding == [0.1, 0.2, 0.3]
    listed = await client.models.list()
    assert [m.id for m in listed.data] == list(MODELS)
    await client.close()
