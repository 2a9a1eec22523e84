"""Ollama's /v1 layer on the simulator (ollama.md section 2.4): defaults, chunk shapes, errors."""

from __future__ import annotations

import orjson

from tests.kvsim.helpers import GIB, fast, get, post, post_raw, sim_session
from tests.kvsim.test_ollama_api import HELLO_TOKENS

HELLO = {"model": "llama3.1:8b", "messages": [{"role": "user", "content": "Hello world, how are you?"}]}


async def test_chat_completion_defaults_to_one_json_object() -> None:
    async with sim_session(fast()) as (_, s), s.post("/v1/chat/completions", json=HELLO) as resp:
        assert resp.content_type == "application/json"
        raw = await resp.read()
    assert raw.endswith(b"}\n")  # json.Encoder output
    body = orjson.loads(raw)
    assert list(body) == ["id", "object", "created", "model", "system_fingerprint", "choices", "usage"]
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert body["system_fingerprint"] == "fp_ollama"
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "stop"
    usage = body["usage"]
    assert usage["prompt_tokens"] == HELLO_TOKENS
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


async def test_max_tokens_is_num_predict() -> None:
    async with sim_session(fast()) as (_, s):
        status, body = await post(s, "/v1/chat/completions", {**HELLO, "max_tokens": 3})
    assert status == 200 and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 3


async def test_streaming_chunks_finish_usage_and_done() -> None:
    async with sim_session(fast()) as (_, s):
        body = {**HELLO, "stream": True, "stream_options": {"include_usage": True}}
        async with s.post("/v1/chat/completions", json=body) as resp:
            assert resp.content_type == "text/event-stream"
            events = (await resp.read()).decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    chunks = [orjson.loads(e.removeprefix("data: ")) for e in events[:-2]]
    first, *middle, finish, usage = chunks
    assert first["choices"][0]["delta"]["role"] == "assistant" and first["object"] == "chat.completion.chunk"
    assert all("role" not in c["choices"][0]["delta"] for c in middle)
    assert finish["choices"] == [{"index": 0, "delta": {}, "finish_reason": "stop"}]
    assert usage["choices"] == [] and usage["usage"]["prompt_tokens"] == HELLO_TOKENS
    assert len({c["id"] for c in chunks}) == 1 and len({c["created"] for c in chunks}) == 1


async def test_openai_errors_are_exact() -> None:
    async with sim_session(fast()) as (_, s):
        empty = orjson.dumps({"model": "llama3.1:8b", "messages": []})
        assert await post_raw(s, "/v1/chat/completions", empty) == (
            400,
            b'{"error":{"message":"[] is too short - \'messages\'","type":"invalid_request_error","param":null,'
            b'"code":null}}\n',
            "application/json",
        )
        status, body = await post(s, "/v1/chat/completions", {**HELLO, "model": "nope"})
        assert (status, body["error"]) == (
            404,
            {"message": "model 'nope' not found", "type": "not_found_error", "param": None, "code": None},
        )
        image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}
        status, body = await post(s, "/v1/chat/completions", {**HELLO, "messages": [image]})
        assert (status, body["error"]["message"]) == (
            400,
            "image URLs are not currently supported, please use base64 encoded data instead",
        )
        assert (await post_raw(s, "/v1/chat/completions", b""))[1].startswith(b'{"error":{"message":"EOF"')
        status, body = await post(s, "/v1/chat/completions", {**HELLO, "stream": "yes"})
        assert (status, body["error"]["message"]) == (
            400,
            "json: cannot unmarshal string into Go struct field ChatCompletionRequest.stream of type bool",
        )


async def test_v1_has_no_num_ctx_or_keep_alive() -> None:
    async with sim_session(fast(context_length=8192)) as (_, s):
        await post(s, "/v1/chat/completions", {**HELLO, "options": {"num_ctx": 2048}, "keep_alive": 0, "num_ctx": 2048})
        (entry,) = (await get(s, "/api/ps"))[1]["models"]
        assert entry["context_length"] == 8192 and entry["expires_at"] > "2000"


async def test_models_list_and_retrieve() -> None:
    async with sim_session(fast()) as (_, s):
        status, listing = await get(s, "/v1/models")
        assert status == 200 and listing["object"] == "list"
        assert listing["data"][0] == {
            "id": "llama3.1:8b",
            "object": "model",
            "created": 1735689600,
            "owned_by": "library",
        }
        assert (await get(s, "/v1/models/qwen2.5:7b"))[1]["id"] == "qwen2.5:7b"
        assert (await get(s, "/v1/models/nope"))[0] == 404


async def test_completions_endpoint() -> None:
    async with sim_session(fast()) as (_, s):
        status, body = await post(s, "/v1/completions", {"model": "llama3.1:8b", "prompt": "Once upon"})
    assert status == 200 and body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"][0]["text"] and body["usage"]["prompt_tokens"] > 0


async def test_an_error_after_streaming_began_is_an_empty_chunk_and_no_done() -> None:
    slow = fast(gen_tokens_per_s=1.0, min_response_tokens=400, max_response_tokens=400)
    async with sim_session(slow) as (_, s), s.post("/v1/chat/completions", json={**HELLO, "stream": True}) as resp:
        await resp.content.readuntil(b"\n\n")
        free = (await get(s, "/sim/gpu"))[1]["devices"][0]["free_bytes"]
        await post(s, "/sim/processes", {"bytes": free + GIB})
        tail = (await resp.read()).decode()
    last = orjson.loads(tail.strip().split("\n\n")[-1].removeprefix("data: "))
    assert "[DONE]" not in tail
    assert last["model"] == "" and last["choices"] == [{"index": 0, "delta": {"content": ""}, "finish_reason": None}]
