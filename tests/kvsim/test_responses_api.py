"""Ollama's /v1/responses on the simulator (ollama.md sections 1, 2.4, 4.6, 6; openai/responses.go)."""

from __future__ import annotations

from typing import Any

import orjson

from kvsim.catalog import CATALOG
from kvsim.templates import Message, render
from kvsim.vocab import tokenizer_for
from tests.kvsim.helpers import GIB, fast, get, post, post_raw, sim_session
from tests.kvsim.test_ollama_api import HELLO_TOKENS

HELLO = {"model": "llama3.1:8b", "input": "Hello world, how are you?"}
PHI3 = "registry.ollama.ai/library/phi3:mini"
TOP_KEYS = [
    "id",
    "object",
    "created_at",
    "completed_at",
    "status",
    "incomplete_details",
    "model",
    "previous_response_id",
    "instructions",
    "output",
    "error",
    "tools",
    "tool_choice",
    "truncation",
    "parallel_tool_calls",
    "text",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "top_logprobs",
    "temperature",
    "reasoning",
    "usage",
    "max_output_tokens",
    "max_tool_calls",
    "store",
    "background",
    "service_tier",
    "metadata",
    "safety_identifier",
    "prompt_cache_key",
]


def sse_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """``event: name`` / ``data: {...}`` blocks as (name, data)."""
    out = []
    for block in raw.decode().split("\n\n"):
        if block:
            name, data = block.split("\n")
            out.append((name.removeprefix("event: "), orjson.loads(data.removeprefix("data: "))))
    return out


def tokens_of(*messages: Message) -> int:
    return len(tokenizer_for(CATALOG["llama3.1:8b"]).encode(render("llama3", list(messages))))


async def test_a_response_object_with_usage() -> None:
    async with sim_session(fast()) as (_, s), s.post("/v1/responses", json=HELLO) as resp:
        assert (resp.status, resp.content_type) == (200, "application/json")
        raw = await resp.read()
    assert raw.endswith(b"}\n")  # json.Encoder output
    body = orjson.loads(raw)
    assert list(body) == TOP_KEYS
    assert body["id"].startswith("resp_") and body["object"] == "response" and body["status"] == "completed"
    assert body["completed_at"] >= body["created_at"] > 0
    assert (body["top_p"], body["temperature"], body["tool_choice"], body["truncation"]) == (1, 1, "auto", "disabled")
    assert raw.count(b'"top_p":1,') == 1  # a Go float64 1.0
    (item,) = body["output"]
    assert item["id"].startswith("msg_") and (item["type"], item["role"], item["status"]) == (
        "message",
        "assistant",
        "completed",
    )
    (part,) = item["content"]
    assert part["type"] == "output_text" and part["text"] and (part["annotations"], part["logprobs"]) == ([], [])
    usage = body["usage"]
    assert usage["input_tokens"] == HELLO_TOKENS and usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert (usage["input_tokens_details"], usage["output_tokens_details"]) == (
        {"cached_tokens": 0},
        {"reasoning_tokens": 0},
    )


async def test_max_output_tokens_is_num_predict() -> None:
    async with sim_session(fast()) as (_, s):
        status, body = await post(s, "/v1/responses", {**HELLO, "max_output_tokens": 3})
    assert status == 200 and body["usage"]["output_tokens"] == 3 and body["max_output_tokens"] == 3
    assert body["status"] == "completed" and body["incomplete_details"] is None  # Ollama does not say it was cut


async def test_instructions_and_input_items_become_the_chat() -> None:
    hello = Message("user", "Hello world, how are you?")
    async with sim_session(fast()) as (_, s):
        status, body = await post(s, "/v1/responses", {**HELLO, "instructions": "Be brief."})
        assert status == 200 and body["instructions"] == "Be brief."
        assert body["usage"]["input_tokens"] == tokens_of(Message("system", "Be brief."), hello)
        parts = [{"type": "input_text", "text": "Hello world, "}, {"type": "input_text", "text": "how are you?"}]
        for given in (
            [{"role": "user", "content": "Hello world, how are you?"}],
            [{"type": "message", "role": "user", "content": parts}],
        ):
            status, body = await post(s, "/v1/responses", {**HELLO, "input": given})
            assert (status, body["usage"]["input_tokens"]) == (200, HELLO_TOKENS)
        history = [
            {"role": "user", "content": "Hello world, how are you?"},
            {"type": "reasoning", "summary": []},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Fine."}]},
            {"role": "user", "content": "Good."},
        ]
        status, body = await post(s, "/v1/responses", {**HELLO, "input": history})
        expected = tokens_of(hello, Message("assistant", "Fine."), Message("user", "Good."))
        assert (status, body["usage"]["input_tokens"]) == (200, expected)


async def test_streaming_events() -> None:
    async with sim_session(fast()) as (_, s), s.post("/v1/responses", json={**HELLO, "stream": True}) as resp:
        assert (resp.status, resp.content_type) == (200, "text/event-stream")
        events = sse_events(await resp.read())
    names = [name for name, _ in events]
    assert names[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert names[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert set(names[4:-4]) == {"response.output_text.delta"}
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    assert all(d["type"] == name and list(d) == sorted(d) for name, d in events)  # Go maps: keys sorted
    created = events[0][1]["response"]
    assert (created["status"], created["output"], created["usage"]) == ("in_progress", [], None)
    text = "".join(d["delta"] for name, d in events if name == "response.output_text.delta")
    assert events[-4][1]["text"] == text
    final = events[-1][1]["response"]
    assert final["status"] == "completed" and final["output"][0]["content"][0]["text"] == text
    assert final["usage"]["input_tokens"] == HELLO_TOKENS and final["usage"]["output_tokens"] > 0
    assert final["id"] == created["id"] and events[2][1]["item"]["id"] == final["output"][0]["id"]


def _with_part(part: dict[str, Any]) -> dict[str, Any]:
    return {**HELLO, "input": [{"role": "user", "content": [part]}]}


async def test_openai_errors() -> None:
    async with sim_session(fast(models=("llama3.1:8b", "phi3:mini", "nomic-embed-text"))) as (_, s):
        status, body = await post(s, "/v1/responses", {**HELLO, "model": "nope"})
        assert (status, body) == (
            404,
            {"error": {"message": "model 'nope' not found", "type": "not_found_error", "param": None, "code": None}},
        )
        tools = [{"type": "function", "name": "f", "parameters": {}}]
        cases: list[tuple[dict[str, Any], str]] = [
            ({**HELLO, "model": ""}, "model is required"),
            (
                {**HELLO, "stream": "yes"},
                "json: cannot unmarshal string into Go struct field ResponsesRequest.stream of type bool",
            ),
            ({**HELLO, "input": [{"content": "x"}]}, "input[0]: input item missing required 'type' field"),
            ({**HELLO, "input": [{"type": "shout"}]}, 'input[0]: unknown input item type: "shout"'),
            (_with_part({"type": "input_file", "file_id": "f"}), "file inputs are not currently supported"),
            (
                _with_part({"type": "input_image", "image_url": "https://x/y.png"}),
                "image URLs are not currently supported, please use base64 encoded data instead",
            ),
            ({**HELLO, "reasoning": {"effort": "high"}}, '"llama3.1:8b" does not support thinking'),
            (
                {**HELLO, "reasoning": {"effort": "huge"}},
                'invalid reasoning value: "huge" (must be "minimal", '
                '"low", "medium", "high", "xhigh", "ultra", "max", or "none")',
            ),
            ({**HELLO, "model": "nomic-embed-text"}, '"nomic-embed-text" does not support chat'),
            ({**HELLO, "model": "phi3:mini", "tools": tools}, f"{PHI3} does not support tools"),
        ]
        for sent, message in cases:
            status, body = await post(s, "/v1/responses", sent)
            assert (status, body["error"]["message"], body["error"]["type"]) == (
                400,
                message,
                "invalid_request_error",
            ), sent
        assert (await post_raw(s, "/v1/responses", b""))[:2] == (
            400,
            b'{"error":{"message":"EOF","type":"invalid_request_error","param":null,"code":null}}\n',
        )
        status, body = await post(s, "/v1/responses", [1])
        assert body["error"]["message"] == (
            "json: cannot unmarshal array into Go value of type openai.ResponsesRequest"
        )


async def test_long_input_is_truncated_silently_at_the_default_context() -> None:
    async with sim_session(fast(context_length=2048)) as (_, s):
        long = {**HELLO, "input": "word " * 5000, "options": {"num_ctx": 8192}, "num_ctx": 8192}
        status, body = await post(s, "/v1/responses", long)
        assert (status, body["status"], body["usage"]["input_tokens"]) == (200, "completed", 1027)
        assert (await get(s, "/sim/stats"))[1]["truncated_prompts"] == 1
        (entry,) = (await get(s, "/api/ps"))[1]["models"]
        assert entry["context_length"] == 2048  # no num_ctx on /v1


async def test_no_input_only_loads_the_model() -> None:
    async with sim_session(fast()) as (_, s):
        status, body = await post(s, "/v1/responses", {"model": "llama3.1:8b"})
        assert status == 200 and body["output"][0]["content"][0]["text"] == ""
        assert body["usage"]["total_tokens"] == 0
        assert len((await get(s, "/api/ps"))[1]["models"]) == 1


async def test_an_error_after_streaming_began_ends_the_stream_without_completed() -> None:
    slow = fast(gen_tokens_per_s=1.0, min_response_tokens=400, max_response_tokens=400)
    async with sim_session(slow) as (_, s), s.post("/v1/responses", json={**HELLO, "stream": True}) as resp:
        await resp.content.readuntil(b"\n\n")
        free = (await get(s, "/sim/gpu"))[1]["devices"][0]["free_bytes"]
        await post(s, "/sim/processes", {"bytes": free + GIB})
        tail = await resp.read()
    names = [name for name, _ in sse_events(tail)]
    assert resp.status == 200 and names[-1] == "response.output_text.delta"  # no completed, no error event
