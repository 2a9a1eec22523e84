"""The llama-server mode's batches, embeddings and reranking, as the real server does them (shapes checked against it
with a tiny model: tests/e2e/test_batches_llama_server.py)."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from kvsim.config import SimConfig
from kvsim.llama_server.llama_embeddings import EMBEDDINGS_OFF, RERANKING_OFF
from tests.kvsim.helpers import fast, get, post, post_raw, sim_session

ONE_TOKEN = fast(mode="llama-server", server_model="phi3:mini", ctx_size=4096, min_response_tokens=3,
                 max_response_tokens=3, time_scale=50.0)
EMBEDDING = fast(mode="llama-server", server_model="phi3:mini", ctx_size=2048, embeddings=True, reranking=True,
                 time_scale=20.0, prompt_tokens_per_s=2000.0)
CONTEXT_EXCEEDED = {"error": {"code": 500, "message": "Context size has been exceeded.", "type": "server_error"}}


async def test_a_native_batch_answers_an_array_with_one_result_per_prompt() -> None:
    async with sim_session(ONE_TOKEN) as (_, s):
        status, body = await post(s, "/completion", {"prompt": ["hello", [1, 2, 3], ["a", 5]], "n_predict": 2})
        assert status == 200 and [r["index"] for r in body] == [0, 1, 2]
        assert [r["tokens_evaluated"] for r in body][1] == 3 and all(r["stop"] for r in body)
        status, single = await post(s, "/completion", {"prompt": ["hello"], "n_predict": 2})
        assert status == 200 and isinstance(single, dict)  # one result: the object itself


async def test_an_openai_batch_answers_one_choice_per_prompt() -> None:
    async with sim_session(ONE_TOKEN) as (_, s):
        status, body = await post(s, "/v1/completions", {"prompt": ["a", "b", "c"], "max_tokens": 2})
        assert status == 200 and [c["index"] for c in body["choices"]] == [0, 1, 2]
        assert body["object"] == "text_completion" and body["usage"]["completion_tokens"] == 2  # the first's


async def test_batch_streams_interleave_the_tasks_and_end_once() -> None:
    async with sim_session(ONE_TOKEN) as (_, s):
        status, raw, _ = await post_raw(s, "/v1/completions", orjson.dumps(
            {"prompt": ["a", "b"], "max_tokens": 3, "stream": True}))
        events = [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e]
        assert status == 200 and events[0] == b"null" and events[-1] == b"[DONE]" and events.count(b"[DONE]") == 1
        indices = {orjson.loads(e)["choices"][0]["index"] for e in events[1:-1]}
        assert indices == {0, 1}
        status, raw, _ = await post_raw(s, "/completion", orjson.dumps({"prompt": ["a", "b"], "stream": True}))
        finals = [orjson.loads(e[6:]) for e in raw.split(b"\n\n") if e.startswith(b"data: {")]
        assert sorted(f["index"] for f in finals if f["stop"]) == [0, 1] and b"[DONE]" not in raw


@pytest.mark.parametrize(("prompt", "message"), [
    ([], '"prompt" must not be empty'),
    ([["a"]], '"prompt" elements must be a string, a list of tokens'),
    ([True], '"prompt" elements must be'),
    ([1, [2]], '"prompt" elements must be'),
])
async def test_batches_the_real_server_refuses(prompt: object, message: str) -> None:
    async with sim_session(ONE_TOKEN) as (_, s):
        status, body = await post(s, "/completion", {"prompt": prompt})
        assert status == 400 and message in body["error"]["message"]


async def test_a_batch_overruns_a_unified_pool_alone() -> None:
    """Four prompts of ~1,000 tokens, answers that never stop: alone each fits the 4,096-cell pool, together they
    fail every task with "Context size has been exceeded." (the batch's one reply)."""
    config = fast(mode="llama-server", server_model="phi3:mini", ctx_size=4096, min_response_tokens=5000,
                  max_response_tokens=5000, time_scale=50.0, gen_tokens_per_s=2000.0, prompt_tokens_per_s=20000.0)
    prompts = [[100 + i] * 1000 for i in range(4)]
    async with sim_session(config) as (_, s):
        assert await post(s, "/completion", {"prompt": prompts, "n_predict": 2000}) == (500, CONTEXT_EXCEEDED)
        status, one = await post(s, "/completion", {"prompt": prompts[:1], "n_predict": 2000})
        assert status == 200 and one["tokens_predicted"] == 2000


async def test_a_batch_past_the_slots_waits_in_the_deferred_queue() -> None:
    async with sim_session(ONE_TOKEN) as (_, s):
        status, body = await post(s, "/completion", {"prompt": [f"p{i}" for i in range(9)], "n_predict": 2})
        assert status == 200 and len(body) == 9
        assert len({r["id_slot"] for r in body}) == 4  # 4 slots served 9 tasks


@pytest.mark.parametrize("path", ["/embedding", "/embeddings", "/v1/embeddings"])
async def test_embeddings_need_the_flag(path: str) -> None:
    async with sim_session(ONE_TOKEN) as (_, s):
        assert await post(s, path, {"input": "x"}) == (
            501, {"error": {"code": 501, "message": EMBEDDINGS_OFF, "type": "not_supported_error"}})


@pytest.mark.parametrize("path", ["/rerank", "/reranking", "/v1/rerank", "/v1/reranking"])
async def test_reranking_needs_its_flag(path: str) -> None:
    async with sim_session(fast(mode="llama-server", embeddings=True)) as (_, s):
        assert await post(s, path, {"query": "q", "documents": ["a"]}) == (
            501, {"error": {"code": 501, "message": RERANKING_OFF, "type": "not_supported_error"}})


async def test_embedding_reply_shapes() -> None:
    async with sim_session(EMBEDDING) as (_, s):
        status, native = await post(s, "/embedding", {"content": ["hello", "x y"]})
        assert status == 200 and [e["index"] for e in native] == [0, 1] and len(native[0]["embedding"]) == 1
        status, oai = await post(s, "/v1/embeddings", {"input": ["hello", "x y"], "model": "zzz"})
        assert (status, oai["object"], oai["model"], [d["index"] for d in oai["data"]]) == (200, "list", "zzz", [0, 1])
        assert oai["usage"]["prompt_tokens"] == oai["usage"]["total_tokens"] > 2
        assert len(oai["data"][0]["embedding"]) == 3072  # phi3's embedding length
        content = (await post(s, "/v1/embeddings", {"content": "x"}))[1]
        assert isinstance(content, list)  # "content" is not OpenAI's: the native reply
        for body, message in (({}, '"input" or "content" must be provided'), ({"input": []}, '"input" must not be '
                              "empty"), ({"content": [[]]}, "Input content cannot be empty")):
            status, error = await post(s, "/embedding", body)
            assert status == 400 and error["error"]["message"] == message


async def test_rerank_reply_shapes() -> None:
    async with sim_session(EMBEDDING) as (_, s):
        status, jina = await post(s, "/rerank", {"query": "q", "documents": ["a", "b c", "d"], "top_n": 2})
        scores = [r["relevance_score"] for r in jina["results"]]
        assert status == 200 and len(scores) == 2 and scores == sorted(scores, reverse=True)
        assert jina["usage"]["prompt_tokens"] > 0 and jina["object"] == "list"
        status, tei = await post(s, "/v1/rerank", {"query": "q", "texts": ["a", "b"], "return_text": True})
        assert status == 200 and {r["text"] for r in tei} == {"a", "b"} and "score" in tei[0]
        for body, message in (({"documents": ["a"]}, '"query" must be provided'),
                              ({"query": "q", "documents": []}, '"documents" must be a non-empty string array')):
            status, error = await post(s, "/rerank", body)
            assert status == 400 and error["error"]["message"] == message
        assert (await post(s, "/embedding", {"content": "x"}))[0] == 200  # --reranking serves embeddings too


async def test_embeddings_take_slots_and_cells_while_they_run() -> None:
    """A burst of long inputs on the unified pool: each input holds its prompt's cells while it is processed, so
    together they overrun it, exactly as chats do; one at a time they fit."""
    inputs = [[200 + i] * 1800 for i in range(4)]
    async with sim_session(EMBEDDING) as (_, s):
        results = await asyncio.gather(*(post(s, "/v1/embeddings", {"input": [x]}) for x in inputs))
        assert (500, CONTEXT_EXCEEDED) in results
        alone = await post(s, "/v1/embeddings", {"input": inputs[:1]})
        assert alone[0] == 200
        stats = (await get(s, "/sim/stats"))[1]
        assert stats["context_exceeded"] >= 2


async def test_the_flags_reach_the_cli() -> None:
    import argparse

    from kvsim.runner import add_sim_arguments, sim_config_from_args

    parser = argparse.ArgumentParser()
    add_sim_arguments(parser)
    config = sim_config_from_args(parser.parse_args(["--mode", "llama-server", "--embeddings", "--reranking"]))
    assert (config.embeddings, config.reranking) == (True, True)
    assert (SimConfig().embeddings, SimConfig().reranking) == (False, False)
