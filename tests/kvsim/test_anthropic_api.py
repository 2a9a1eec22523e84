"""Ollama's /v1/messages (Anthropic Messages) on the simulator (ollama.md sections 1, 2.4, 4.6, 6;
anthropic/anthropic.go, middleware/anthropic.go)."""

from __future__ import annotations

from typing import Any

from kvsim.templates import Message
from tests.kvsim.helpers import GIB, fast, get, post, post_raw, sim_session
from tests.kvsim.test_ollama_api import HELLO_TOKENS
from tests.kvsim.test_responses_api import PHI3, sse_events, tokens_of

HELLO = {
    "model": "llama3.1:8b",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "Hello world, how are you?"}],
}


async def test_a_message_with_usage() -> None:
    async with sim_session(fast()) as (_, s), s.post("/v1/messages", json=HELLO) as resp:
        assert (resp.status, resp.content_type) == (200, "application/json")
        raw = await resp.read()
        body = await resp.json()
    assert raw.endswith(b"}\n")
    assert list(body) == ["id", "type", "role", "model", "content", "stop_reason", "usage"]
    assert body["id"].startswith("msg_") and len(body["id"]) == 4 + 24
    assert (body["type"], body["role"], body["model"], body["stop_reason"]) == (
        "message",
        "assistant",
        "llama3.1:8b",
        "end_turn",
    )
    (block,) = body["content"]
    assert list(block) == ["type", "text"] and block["type"] == "text" and block["text"]
    assert body["usage"]["input_tokens"] == HELLO_TOKENS and body["usage"]["output_tokens"] > 0


async def test_max_tokens_is_num_predict() -> None:
    async with sim_session(fast()) as (_, s):
        status, body = await post(s, "/v1/messages", {**HELLO, "max_tokens": 3})
    assert (status, body["stop_reason"], body["usage"]["output_tokens"]) == (200, "max_tokens", 3)


async def test_system_and_blocks_become_the_chat() -> None:
    hello = Message("user", "Hello world, how are you?")
    async with sim_session(fast()) as (_, s):
        for system in ("Be brief.", [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]):
            status, body = await post(s, "/v1/messages", {**HELLO, "system": system})
            assert (status, body["usage"]["input_tokens"]) == (200, tokens_of(Message("system", "Be brief."), hello))
        blocks = [{"type": "text", "text": "Hello world, "}, {"type": "text", "text": "how are you?"}]
        status, body = await post(s, "/v1/messages", {**HELLO, "messages": [{"role": "user", "content": blocks}]})
        assert (status, body["usage"]["input_tokens"]) == (200, HELLO_TOKENS)
        thinking = {**HELLO, "thinking": {"type": "enabled", "budget_tokens": 1024}}
        assert (await post(s, "/v1/messages", thinking))[0] == 200  # relaxed, not "does not support thinking"


async def test_streaming_events() -> None:
    body = {**HELLO, "stream": True, "system": "Be brief."}
    async with sim_session(fast()) as (_, s), s.post("/v1/messages", json=body) as resp:
        assert (resp.status, resp.content_type) == (200, "text/event-stream")
        events = sse_events(await resp.read())
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[2:-3]) == {"content_block_delta"}
    assert all(data["type"] == name for name, data in events)
    start = events[0][1]["message"]
    assert list(start) == ["id", "type", "role", "model", "content", "usage"]
    # the estimate (bytes / 4 of system, role and text) while the real count is unknown
    assert start["usage"] == {"input_tokens": (9 + 4 + 25) // 4, "output_tokens": 0}
    assert events[1][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert all(d["index"] == 0 and d["delta"]["type"] == "text_delta" for n, d in events if n == "content_block_delta")
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "end_turn"}
    assert delta["usage"]["input_tokens"] == tokens_of(
        Message("system", "Be brief."), Message("user", "Hello world, how are you?")
    )


async def test_anthropic_errors() -> None:
    async with sim_session(fast(models=("llama3.1:8b", "phi3:mini", "nomic-embed-text"))) as (_, s):
        status, body = await post(s, "/v1/messages", {**HELLO, "model": "nope"})
        assert status == 404 and body["type"] == "error" and body["request_id"].startswith("req_")
        assert body["error"] == {"type": "not_found_error", "message": "model 'nope' not found"}
        no_limit = {k: v for k, v in HELLO.items() if k != "max_tokens"}
        image = {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}
        tools = [{"name": "f", "input_schema": {"type": "object"}}]
        cases: list[tuple[dict[str, Any], str]] = [
            ({**HELLO, "model": ""}, "model is required"),
            (no_limit, "max_tokens is required and must be positive"),
            ({**HELLO, "max_tokens": -1}, "max_tokens is required and must be positive"),
            ({**HELLO, "messages": []}, "messages is required"),
            (
                {**HELLO, "max_tokens": "64"},
                "json: cannot unmarshal string into Go struct field MessagesRequest.max_tokens of type int",
            ),
            (
                {**HELLO, "messages": [{"role": "user", "content": [image]}]},
                "invalid image source type: url. Only base64 images are supported.",
            ),
            (
                {**HELLO, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "f"}]}]},
                "tool_use block missing required 'id' field",
            ),
            ({**HELLO, "model": "nomic-embed-text"}, '"nomic-embed-text" does not support chat'),
            ({**HELLO, "model": "phi3:mini", "tools": tools}, f"{PHI3} does not support tools"),
        ]
        for sent, message in cases:
            status, body = await post(s, "/v1/messages", sent)
            assert (status, body["error"]) == (400, {"type": "invalid_request_error", "message": message}), sent
        status, raw, _ = await post_raw(s, "/v1/messages", b"")
        assert status == 400 and raw.startswith(
            b'{"type":"error","error":{"type":"invalid_request_error","message":"EOF"}'
        )


async def test_long_prompt_is_truncated_silently_at_the_default_context() -> None:
    async with sim_session(fast(context_length=2048)) as (_, s):
        long = {**HELLO, "messages": [{"role": "user", "content": "word " * 5000}], "options": {"num_ctx": 8192}}
        status, body = await post(s, "/v1/messages", long)
        assert (status, body["stop_reason"], body["usage"]["input_tokens"]) == (200, "end_turn", 1027)
        assert (await get(s, "/sim/stats"))[1]["truncated_prompts"] == 1
        (entry,) = (await get(s, "/api/ps"))[1]["models"]
        assert entry["context_length"] == 2048


async def test_an_error_after_streaming_began_ends_the_stream_without_message_stop() -> None:
    slow = fast(gen_tokens_per_s=1.0, min_response_tokens=400, max_response_tokens=400)
    body = {**HELLO, "stream": True, "max_tokens": 1000}
    async with sim_session(slow) as (_, s), s.post("/v1/messages", json=body) as resp:
        await resp.content.readuntil(b"\n\n")
        free = (await get(s, "/sim/gpu"))[1]["devices"][0]["free_bytes"]
        await post(s, "/sim/processes", {"bytes": free + GIB})
        tail = await resp.read()
    names = [name for name, _ in sse_events(tail)]
    assert resp.status == 200 and names[-1] == "content_block_delta"  # no message_stop, no error event
