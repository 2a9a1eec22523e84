"""The llama-server mode against llama-server.md sections 1-3 and 7 (the behaviour checked on a real one)."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest

from kvsim.gpu.vgpu import GIB
from kvsim.llama_server.llama_engine import StartupFailed
from kvsim.runner import start_sim
from tests.kvsim.helpers import fast, get, post, post_raw, sim_session

SPLIT = fast(mode="llama-server", ctx_size=4096, n_parallel=2)  # -c 4096 -np 2: two 2048-cell slots
UNIFIED = fast(mode="llama-server", ctx_size=4096, time_scale=50.0, prompt_tokens_per_s=2000.0)  # -np auto
CONTEXT_EXCEEDED = {"error": {"code": 500, "message": "Context size has been exceeded.", "type": "server_error"}}


def chat(words: int, **extra: object) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": "word " * words}], **extra}


async def test_health_props_slots_models() -> None:
    async with sim_session(SPLIT) as (_, s):
        assert await get(s, "/health") == (200, {"status": "ok"})
        status, props = await get(s, "/props")
        assert status == 200 and props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 2048
        status, slots = await get(s, "/slots")
        assert [(x["id"], x["n_ctx"], x["is_processing"]) for x in slots] == [(0, 2048, False), (1, 2048, False)]
        status, models = await get(s, "/v1/models")
        assert models["data"][0]["meta"]["n_ctx_train"] == 131072 and models["data"][0]["owned_by"] == "llamacpp"
        gpu = (await get(s, "/sim/gpu"))[1]
        assert gpu["processes"][0]["name"] == "llama-server llama3.1:8b"
    async with sim_session(UNIFIED) as (_, s):
        props = (await get(s, "/props"))[1]
        assert (props["total_slots"], props["default_generation_settings"]["n_ctx"]) == (4, 4096)  # whole pool


async def test_tokenize_matches_the_real_server() -> None:
    async with sim_session(SPLIT) as (_, s):
        tokens = (await post(s, "/tokenize", {"content": "Hello world, how are you?"}))[1]
        assert tokens == {"tokens": [9906, 1917, 11, 1268, 527, 499, 30]}  # llama-server.md section 7
        with_bos = (await post(s, "/tokenize", {"content": "Hello", "add_special": True}))[1]["tokens"]
        assert with_bos[0] == 128000
        pieces = (await post(s, "/tokenize", {"content": "Hello world", "with_pieces": True}))[1]["tokens"]
        assert pieces == [{"id": 9906, "piece": "Hello"}, {"id": 1917, "piece": " world"}]
        assert (await post(s, "/detokenize", {"tokens": [9906, 1917]}))[1] == {"content": "Hello world"}
        counted = (await post(s, "/v1/chat/completions/input_tokens", chat(10)))[1]
        assert counted["object"] == "response.input_tokens" and counted["input_tokens"] > 10


async def test_prompt_over_the_slot_is_400_with_the_exact_body() -> None:
    async with sim_session(SPLIT) as (_, s):
        status, raw, _ = await post_raw(s, "/completion", orjson.dumps({"prompt": [1000] * 2122}))
        assert (status, raw) == (
            400,
            b'{"error":{"code":400,"message":"request (2122 tokens) exceeds the available '
            b'context size (2048 tokens), try increasing it","type":"exceed_context_size_'
            b'error","n_prompt_tokens":2122,"n_ctx":2048}}',
        )
        status, body = await post(s, "/v1/chat/completions", chat(2100, stream=True))
        assert status == 400 and body["error"]["type"] == "exceed_context_size_error"  # streams too: no headers yet
        assert (await post(s, "/v1/chat/completions", {}))[1] == {
            "error": {"code": 400, "message": "'messages' is required", "type": "invalid_request_error"}
        }


async def test_unified_pool_oversubscribed_fails_every_request() -> None:
    async with sim_session(UNIFIED) as (_, s):
        body = chat(1380, max_tokens=1500)
        results = await asyncio.gather(*(post(s, "/v1/chat/completions", body) for _ in range(4)))
        assert results == [(500, CONTEXT_EXCEEDED)] * 4
        alone = fast(mode="llama-server", ctx_size=4096, min_response_tokens=1500, max_response_tokens=1500)
    async with sim_session(alone) as (_, s):
        status, done = await post(s, "/v1/chat/completions", body)  # each one alone fits the pool
        assert status == 200 and done["usage"]["completion_tokens"] == 1500
        assert done["usage"]["prompt_tokens_details"] == {"cached_tokens": 0} and "timings" in done


async def test_streams_end_with_an_sse_error_event_and_no_done() -> None:
    cfg = fast(mode="llama-server", ctx_size=4096, time_scale=50.0, min_response_tokens=1500, max_response_tokens=1500)
    async with sim_session(cfg) as (url, _s):

        async def stream() -> str:
            async with (
                aiohttp.ClientSession(url) as own,
                own.post("/v1/chat/completions", json=chat(500, stream=True)) as resp,
            ):
                assert resp.status == 200
                return (await resp.read()).decode()

        texts = await asyncio.gather(*(stream() for _ in range(3)))
    for text in texts:
        events = [e for e in text.split("\n\n") if e]
        assert orjson.loads(events[-1].removeprefix("data: ")) == CONTEXT_EXCEEDED
        assert "[DONE]" not in text


async def test_stream_shapes_and_usage() -> None:
    async with sim_session(SPLIT) as (_, s):
        body = chat(20, stream=True, stream_options={"include_usage": True})
        async with s.post("/v1/chat/completions", json=body) as resp:
            events = (await resp.read()).decode().split("\n\n")
        assert events[-2:] == ["data: [DONE]", ""]
        chunks = [orjson.loads(e.removeprefix("data: ")) for e in events[:-2]]
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
        assert chunks[-2]["choices"][0]["finish_reason"] == "stop" and "timings" in chunks[-2]
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == len(chunks) - 3


async def test_a_full_slot_stops_with_length() -> None:
    cfg = fast(mode="llama-server", ctx_size=4096, n_parallel=2, min_response_tokens=200, max_response_tokens=200)
    async with sim_session(cfg) as (_, s):
        status, done = await post(s, "/completion", {"prompt": [1000] * 2000})
        assert status == 200 and (done["stop_type"], done["truncated"]) == ("limit", True)
        assert done["tokens_predicted"] == 2048 - 1 - 2000


async def test_requests_beyond_the_slots_are_deferred() -> None:
    cfg = fast(mode="llama-server", ctx_size=8192, n_parallel=2, gen_tokens_per_s=2.0)
    async with sim_session(cfg) as (_, s):
        results = await asyncio.gather(*(post(s, "/completion", {"prompt": "hi", "n_predict": 4}) for _ in range(6)))
        assert [status for status, _ in results] == [200] * 6
        assert (await get(s, "/sim/stats"))[1]["max_waiting"] >= 3


async def test_unknown_path_is_llama_servers_404() -> None:
    async with sim_session(SPLIT) as (_, s):
        assert await get(s, "/nope") == (
            404,
            {"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}},
        )


async def test_a_model_that_does_not_fit_fails_at_start() -> None:
    with pytest.raises(StartupFailed, match=r"llama3\.1:8b with -c 131072"):
        await start_sim(fast(mode="llama-server", ctx_size=131072, gpu_bytes=(12 * GIB,)))


async def test_n_predict_wins_over_max_tokens_and_ignore_eos_runs_until_the_slot_fills() -> None:
    cfg = fast(mode="llama-server", ctx_size=1024, n_parallel=2)  # two 512-cell slots
    async with sim_session(cfg) as (_, s):
        status, done = await post(s, "/v1/chat/completions", chat(20, max_tokens=4, n_predict=40, ignore_eos=True))
        assert status == 200 and done["usage"]["completion_tokens"] == 40
        status, done = await post(s, "/v1/chat/completions", chat(20, max_completion_tokens=6, max_tokens=3))
        assert status == 200 and done["usage"]["completion_tokens"] <= 6
        status, done = await post(s, "/completion", {"prompt": [1000] * 100, "ignore_eos": True})
        assert (status, done["stop_type"], done["tokens_predicted"]) == (200, "limit", 512 - 1 - 100)
        status, body = await post(s, "/completion", {"prompt": "hi", "max_tokens": -2})
        assert status == 400 and "max_tokens" in body["error"]["message"]


async def test_openai_completions_responses_and_anthropic_messages() -> None:
    cfg = fast(mode="llama-server", ctx_size=2048, n_parallel=1)
    async with sim_session(cfg) as (_, s):
        status, done = await post(s, "/v1/completions", {"prompt": "Once", "max_tokens": 5, "ignore_eos": True})
        assert status == 200 and done["object"] == "text_completion" and done["usage"]["completion_tokens"] == 5
        assert (await post(s, "/v1/completions", {}))[1]["error"]["message"] == '"prompt" is required'
        body = {
            "input": [{"role": "user", "content": "hi there"}],
            "instructions": "Be brief.",
            "max_output_tokens": 7,
            "ignore_eos": True,
        }
        status, done = await post(s, "/v1/responses", body)
        assert status == 200 and done["object"] == "response" and done["usage"]["output_tokens"] == 7
        assert (await post(s, "/v1/responses/input_tokens", body))[1]["input_tokens"] == done["usage"]["input_tokens"]
        anthropic = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 3}
        status, done = await post(s, "/v1/messages", anthropic)
        assert status == 200 and done["type"] == "message" and done["usage"]["output_tokens"] <= 3
        counted = (await post(s, "/v1/messages/count_tokens", anthropic))[1]
        assert counted == {"input_tokens": done["usage"]["input_tokens"]}
        dropped = {**anthropic, "max_tokens": 5, "n_predict": 50, "ignore_eos": True}  # not carried over
        assert (await post(s, "/v1/messages", dropped))[1]["usage"]["output_tokens"] <= 5
        status, body = await post(s, "/infill", {"input_prefix": "def f(", "input_suffix": "):"})
        assert status == 501 and body["error"]["message"].startswith("Infill is not supported by this model")


async def test_stream_shapes_of_the_other_routes() -> None:
    cfg = fast(mode="llama-server", ctx_size=2048, n_parallel=1)
    async with sim_session(cfg) as (_, s):

        async def events(path: str, body: dict[str, object]) -> list[str]:
            async with s.post(path, json={**body, "stream": True}) as resp:
                return [e for e in (await resp.read()).decode().split("\n\n") if e]

        resp_events = await events("/v1/responses", {"input": "hi", "max_output_tokens": 3, "ignore_eos": True})
        assert resp_events[0].startswith("event: response.created") and "response.completed" in resp_events[-1]
        msg_events = await events("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert msg_events[0].startswith("event: message_start") and msg_events[-1].startswith("event: message_stop")
        cmpl_events = await events("/v1/completions", {"prompt": "hi", "max_tokens": 3, "ignore_eos": True})
        assert cmpl_events[-1] == "data: [DONE]" and len(cmpl_events) == 5
        native = await events("/completion", {"prompt": "hi", "n_predict": 3, "ignore_eos": True})
        assert orjson.loads(native[-1].removeprefix("data: "))["stop"] is True and len(native) == 4


async def test_anthropic_streams_end_with_an_error_event() -> None:
    cfg = fast(mode="llama-server", ctx_size=1024, time_scale=50.0, min_response_tokens=900, max_response_tokens=900)
    async with sim_session(cfg) as (url, _s):

        async def stream() -> str:
            body = {"messages": [{"role": "user", "content": "word " * 200}], "max_tokens": 900, "stream": True}
            async with aiohttp.ClientSession(url) as own, own.post("/v1/messages", json=body) as resp:
                return (await resp.read()).decode()

        texts = await asyncio.gather(*(stream() for _ in range(3)))
    assert any("event: error\ndata: " in text and "Context size has been exceeded." in text for text in texts)
