"""The official ``ollama`` and ``openai`` Python clients, unmodified, against the simulator."""

from __future__ import annotations

import ollama
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.kvsim.helpers import fast, running_sim
from tests.kvsim.test_ollama_api import HELLO_TOKENS

HELLO = [{"role": "user", "content": "Hello world, how are you?"}]
HELLO_OAI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello world, how are you?"}]


async def test_ollama_client_native_api() -> None:
    async with running_sim(fast()) as url, ollama.AsyncClient(host=url) as client:
        await _native_calls(client)


async def _native_calls(client: ollama.AsyncClient) -> None:
    reply = await client.chat(model="llama3.1:8b", messages=HELLO, options={"num_ctx": 8192})
    assert reply.done and reply.prompt_eval_count == HELLO_TOKENS and reply.message.content
    stream = await client.chat(model="llama3.1:8b", messages=HELLO, stream=True, options={"num_ctx": 8192})
    pieces = [part async for part in stream]
    assert "".join(p.message.content or "" for p in pieces) == reply.message.content
    gen = await client.generate(model="qwen2.5:7b", prompt="Why is the sky blue?", options={"num_ctx": 4096})
    assert gen.done and gen.eval_count and gen.context
    emb = await client.embed(model="nomic-embed-text", input=["one", "two"])
    assert len(emb.embeddings) == 2 and len(emb.embeddings[0]) == 768
    running = await client.ps()
    by_name = {m.model: m for m in running.models}
    assert by_name["llama3.1:8b"].context_length == 8192 and by_name["qwen2.5:7b"].context_length == 4096
    assert by_name["llama3.1:8b"].size_vram == by_name["llama3.1:8b"].size
    assert by_name["llama3.1:8b"].expires_at is not None
    show = await client.show("llama3.1:8b")
    assert show.modelinfo is not None and show.modelinfo["llama.context_length"] == 131072
    assert show.capabilities == ["completion", "tools"]
    listed = await client.list()
    assert [m.model for m in listed.models] == ["llama3.1:8b", "qwen2.5:7b", "nomic-embed-text:latest"]
    with pytest.raises(ollama.ResponseError) as err:
        await client.chat(model="nope", messages=HELLO)
    assert (err.value.status_code, err.value.error) == (404, "model 'nope' not found")


async def test_openai_client_v1_api() -> None:
    async with running_sim(fast()) as url:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="ollama", max_retries=0)
        done = await client.chat.completions.create(model="llama3.1:8b", messages=HELLO_OAI)
        assert done.choices[0].message.content and done.usage is not None
        assert done.usage.prompt_tokens == HELLO_TOKENS
        stream = await client.chat.completions.create(
            model="llama3.1:8b",
            messages=HELLO_OAI,
            stream=True,
            stream_options={"include_usage": True},
        )
        text: list[str] = []
        usage = None
        async for chunk in stream:
            if chunk.choices:
                text.append(chunk.choices[0].delta.content or "")
            if chunk.usage is not None:
                usage = chunk.usage
        assert "".join(text) == done.choices[0].message.content
        assert usage is not None and usage.completion_tokens == done.usage.completion_tokens
        completion = await client.completions.create(model="qwen2.5:7b", prompt="Once upon a time", max_tokens=5)
        assert completion.choices[0].finish_reason == "length" and completion.usage is not None
        assert completion.usage.completion_tokens == 5
        models = [m.id async for m in client.models.list()]
        assert "llama3.1:8b" in models
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="nope", messages=HELLO_OAI)
        await client.close()
