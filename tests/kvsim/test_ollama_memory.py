"""Loads, reloads, evictions, out-of-memory, keep_alive, waiting and truncation (ollama.md sections 4 and 5)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson

from gateway.memory.kv import ollama_kv_cache_bytes
from kvsim.catalog import CATALOG
from kvsim.gpu.load_cost import compute_bytes
from tests.kvsim.helpers import GIB, chat_body, fast, gateway_shape, get, post, sim_session
from tests.support.poll import until

LLAMA = CATALOG["llama3.1:8b"]
MIB = 2**20


def expected_bytes(num_ctx: int, num_batch: int, num_parallel: int = 1) -> int:
    kv = ollama_kv_cache_bytes(gateway_shape(LLAMA), num_ctx=num_ctx, num_parallel=num_parallel)
    return LLAMA.weights.gpu_bytes + kv + compute_bytes(LLAMA, num_batch)


async def stats(s: aiohttp.ClientSession) -> dict[str, Any]:
    return (await get(s, "/sim/stats"))[1]  # type: ignore[no-any-return]


async def test_load_allocates_weights_kv_and_compute() -> None:
    async with sim_session(fast(num_parallel=2)) as (_, s):
        assert (await post(s, "/api/chat", chat_body(options={"num_ctx": 8192})))[0] == 200
        (entry,) = (await get(s, "/api/ps"))[1]["models"]
        assert entry["size"] == expected_bytes(8192, 1024, num_parallel=2)  # KV = 8192 x 2 slots
        assert entry["context_length"] == 8192  # per sequence
        gpu = (await get(s, "/sim/gpu"))[1]
        assert gpu["devices"][0]["used_bytes"] == entry["size"]
        assert gpu["processes"][0]["name"] == "llama-server llama3.1:8b"


async def test_a_different_num_ctx_reloads_the_same_one_does_not() -> None:
    async with sim_session(fast()) as (_, s):
        for num_ctx in (8192, 8192, 4096, 4096, 16384, 200_000, 131072):
            assert (await post(s, "/api/chat", chat_body(options={"num_ctx": num_ctx})))[0] == 200
        st = await stats(s)
        assert (st["loads"], st["reloads"]) == (4, 3)  # 8192 -> 4096 -> 16384 -> 131072 (200000 is clamped)
        assert (await get(s, "/api/ps"))[1]["models"][0]["context_length"] == 131072
        assert (await post(s, "/api/chat", chat_body(options={"num_ctx": 131072}, shift=False)))[0] == 200
        assert (await stats(s))["reloads"] == 4  # E3: a different shift reloads too
        await post(s, "/v1/chat/completions", {"model": "llama3.1:8b", "messages": [{"role": "user", "content": "x"}]})
        (entry,) = (await get(s, "/api/ps"))[1]["models"]
        assert entry["context_length"] == 32768  # /v1 has no num_ctx: the default (24 GiB tier)
    async with sim_session(fast(era="e2")) as (_, s):
        for num_ctx in (200_000, 131072):
            await post(s, "/api/chat", chat_body(options={"num_ctx": num_ctx}))
        assert (await stats(s))["reloads"] == 1  # E2 compares the values before clamping


async def test_load_that_does_not_fit_is_ollamas_out_of_memory() -> None:
    # LLAMA_ARG_FIT off: with llama.cpp's fit on (the default) this first model is partly offloaded instead
    # (test_ollama_offload.py)
    async with sim_session(fast(gpu_bytes=(12 * GIB,), llama_fit=False)) as (_, s):
        status, body = await post(s, "/api/chat", chat_body(options={"num_ctx": 65536}))
        kv_mib = ollama_kv_cache_bytes(gateway_shape(LLAMA), num_ctx=65536, num_parallel=1) / MIB  # weights fit, KV not
        assert status == 500
        assert body == {
            "error": "llama-server reported out-of-memory during startup: "
            f"ggml_backend_cuda_buffer_type_alloc_buffer: allocating {kv_mib:.2f} MiB on "
            "device 0: cudaMalloc failed: out of memory"
        }
        assert (await get(s, "/api/ps"))[1] == {"models": []}
        assert (await stats(s))["load_failures"] == 1
    async with sim_session(fast(gpu_bytes=(12 * GIB,), era="e2")) as (_, s):
        status, body = await post(s, "/api/chat", chat_body(options={"num_ctx": 65536}))
        assert (status, body) == (
            500,
            {"error": "llama runner process has terminated: cudaMalloc failed: out of memory"},
        )


async def test_automatic_context_retries_one_tier_lower() -> None:
    # LLAMA_ARG_FIT off: with the fit on, the first model loads at 32768 partly offloaded (test_ollama_offload.py)
    async with sim_session(fast(models=("qwen2.5:32b",), llama_fit=False)) as (_, s):
        body = {"model": "qwen2.5:32b", "messages": [{"role": "user", "content": "hi"}], "stream": False}
        assert (await post(s, "/api/chat", body))[0] == 200  # 32768 does not fit 24 GiB beside 18 GiB of weights
        assert (await get(s, "/api/ps"))[1]["models"][0]["context_length"] == 4096
        st = await stats(s)
        assert (st["load_failures"], st["loads"]) == (1, 1)


async def test_max_loaded_models_and_prediction_evict_idle_runners() -> None:
    async with sim_session(fast(max_loaded_models=1)) as (_, s):
        await post(s, "/api/chat", chat_body())
        await post(s, "/api/chat", {**chat_body(), "model": "qwen2.5:7b"})
        assert [m["name"] for m in (await get(s, "/api/ps"))[1]["models"]] == ["qwen2.5:7b"]
        assert (await stats(s))["evictions"] == 1
    async with sim_session(fast(gpu_bytes=(14 * GIB,))) as (_, s):
        await post(s, "/api/chat", {**chat_body(options={"num_ctx": 8192}), "model": "qwen2.5:7b"})
        await post(s, "/api/chat", chat_body(options={"num_ctx": 32768}))  # predicted > 80% of what is free
        assert [m["name"] for m in (await get(s, "/api/ps"))[1]["models"]] == ["llama3.1:8b"]
        assert (await stats(s))["evictions"] == 1


async def test_keep_alive_semantics() -> None:
    async with sim_session(fast()) as (_, s):
        await post(s, "/api/chat", chat_body(keep_alive=0))
        assert (await get(s, "/api/ps"))[1] == {"models": []}  # unloaded right after the request
        await post(s, "/api/chat", chat_body(keep_alive=-1))
        assert (await get(s, "/api/ps"))[1]["models"][0]["expires_at"] > "2300"  # forever (MaxInt64 ns)
        await post(s, "/api/chat", chat_body())  # no keep_alive: the runner keeps its session duration
        assert (await get(s, "/api/ps"))[1]["models"][0]["expires_at"] > "2300"
        await post(s, "/api/chat", chat_body(keep_alive="2s"))

        async def gone() -> bool:
            return bool((await get(s, "/api/ps"))[1] == {"models": []})

        await until(gone)
        assert (await stats(s))["events"][-1]["reason"] == "keep_alive elapsed"


async def test_requests_beyond_num_parallel_wait_without_bound() -> None:
    async with sim_session(fast(num_parallel=1, max_queue=1, gen_tokens_per_s=0.5)) as (_, s):
        await post(s, "/api/generate", {"model": "llama3.1:8b"})  # loaded: requests now bypass the queue
        results = await asyncio.gather(*(post(s, "/api/chat", chat_body(f"question {i}")) for i in range(4)))
        assert [status for status, _ in results] == [200] * 4  # OLLAMA_MAX_QUEUE does not bound them
        assert (await stats(s))["max_waiting"] >= 3


async def test_pending_queue_full_is_503() -> None:
    slow = fast(
        max_queue=1, max_loaded_models=1, gen_tokens_per_s=2.0, min_response_tokens=400, max_response_tokens=400
    )
    async with sim_session(slow) as (_, s):
        async with s.post("/api/chat", json={**chat_body(), "stream": True}) as busy:
            await busy.content.readline()  # llama is now generating for a while
            pending = asyncio.ensure_future(post(s, "/api/chat", {**chat_body(), "model": "qwen2.5:7b"}))

            async def scheduler_holds(queued: int) -> bool:
                now = await stats(s)
                return bool(now["scheduling"] == 1 and now["queued"] == queued)

            # (states, not timings: a busy machine may take longer than the default 5 s to reach them)
            await until(lambda: scheduler_holds(0), timeout_s=30)  # the scheduler holds it until llama is idle
            queued = asyncio.ensure_future(post(s, "/api/embed", {"model": "nomic-embed-text", "input": "x"}))
            await until(lambda: scheduler_holds(1), timeout_s=30)  # the embed waits in the pending queue, now full
            status, body = await post(s, "/api/chat", {**chat_body(), "model": "qwen2.5:7b"})
            assert (status, body) == (
                503,
                {"error": "server busy, please try again.  maximum pending requests exceeded"},
            )
            await busy.read()
        assert (await pending)[0] == 200 and (await queued)[0] == 200


async def test_runtime_oom_ends_streams_with_ollamas_error() -> None:
    slow = fast(gen_tokens_per_s=1.0, min_response_tokens=400, max_response_tokens=400)
    async with sim_session(slow) as (_, s):
        async with s.post("/api/chat", json={**chat_body(), "stream": True}) as resp:
            assert orjson.loads(await resp.content.readline())["done"] is False
            free = (await get(s, "/sim/gpu"))[1]["devices"][0]["free_bytes"]
            status, proc = await post(s, "/sim/processes", {"name": "trainer", "bytes": free + GIB})
            assert status == 201
            lines = (await resp.read()).splitlines()
        assert resp.status == 200
        assert orjson.loads(lines[-1]) == {
            "error": "an error was encountered while running the model: CUDA error: out of memory"
        }
        assert (await stats(s))["runtime_ooms"] == 1

        async def expired() -> bool:
            return bool((await get(s, "/api/ps"))[1] == {"models": []})

        await until(expired)  # every runner is expired after a runtime OOM
        assert (await post(s, "/api/chat", chat_body(options={"num_predict": 2})))[0] == 200
        # the trainer still holds the GPU: the automatic 32768 context no longer fits, and llama.cpp's fit keeps
        # only some layers on the GPU (the first model: ollama.md 4.2 item 5)
        (entry,) = (await get(s, "/api/ps"))[1]["models"]
        assert entry["context_length"] == 32768 and entry["size_vram"] < entry["size"]
        async with s.delete(f"/sim/processes/{proc['pid']}") as resp:
            assert resp.status == 200
        async with s.delete(f"/sim/processes/{proc['pid']}") as resp:
            assert resp.status == 404


async def test_dynamic_kv_grows_and_fails_with_cuda_out_of_memory() -> None:
    cfg = fast(
        dynamic_kv=True, gpu_bytes=(8 * GIB,), gen_tokens_per_s=1.0, min_response_tokens=400, max_response_tokens=400
    )
    async with sim_session(cfg) as (_, s):
        async with s.post("/api/chat", json={**chat_body(), "stream": True}) as resp:
            await resp.content.readline()
            used_1 = (await get(s, "/sim/gpu"))[1]["devices"][0]["used_bytes"]
            used_2 = used_1
            for _ in range(100):  # lines can arrive together: read on until a token's KV shows (400 are coming)
                await resp.content.readline()
                used_2 = (await get(s, "/sim/gpu"))[1]["devices"][0]["used_bytes"]
                if used_2 > used_1:
                    break
            assert used_2 > used_1  # KV grows per token
            free = (await get(s, "/sim/gpu"))[1]["devices"][0]["free_bytes"]
            await post(s, "/sim/processes", {"bytes": free})
            lines = (await resp.read()).splitlines()
        assert orjson.loads(lines[-1]) == {
            "error": "CUDA out of memory. Tried to allocate 0.12 MiB. GPU 0 has a total capacity of 8.00 GiB of "
            "which 0.00 MiB is free."
        }


async def test_prompt_longer_than_num_ctx_is_truncated_silently() -> None:
    async with sim_session(fast()) as (_, s):
        long = "word " * 5000
        status, body = await post(s, "/api/chat", chat_body(long, options={"num_ctx": 2048}))
        assert (status, body["prompt_eval_count"]) == (200, 1027)  # 2048 - (2048 - 5) // 2: about half
        history = [{"role": "user" if i % 2 == 0 else "assistant", "content": "word " * 300} for i in range(12)]
        status, body = await post(s, "/api/chat", {**chat_body(options={"num_ctx": 2048}), "messages": history})
        assert status == 200 and 1500 < body["prompt_eval_count"] <= 2048  # the oldest messages were dropped
        assert (await stats(s))["truncated_prompts"] == 2
        status, body = await post(s, "/api/chat", chat_body(long, options={"num_ctx": 2048}, shift=False))
        assert (status, body) == (
            400,
            {
                "error": "the prompt is longer than the context length currently available "
                "to the model; shorten the prompt, adjust the context length in settings, "
                "or use a model with a longer context length"
            },
        )
        status, body = await post(s, "/api/chat", chat_body(long, options={"num_ctx": 2048}, truncate=False))
        assert status == 400
        assert body["error"] == (
            '{"error":{"code":400,"message":"request (5011 tokens) exceeds the available context size (2048 tokens), '
            'try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5011,"n_ctx":2048}}'
        )
    async with sim_session(fast(era="e2")) as (_, s):
        status, body = await post(s, "/api/chat", chat_body("word " * 5000, options={"num_ctx": 2048}, truncate=False))
        assert (status, body) == (400, {"error": "the input length exceeds the context length"})


async def test_a_load_is_aborted_when_its_client_leaves() -> None:
    async with sim_session(fast(load_s=400.0)) as (url, s):
        timeout = aiohttp.ClientTimeout(total=0.2)
        try:
            async with aiohttp.ClientSession(url) as impatient:
                await impatient.post("/api/chat", json=chat_body(), timeout=timeout)
        except TimeoutError:
            pass

        async def aborted() -> bool:
            return any(e.get("reason", "").startswith("load aborted") for e in (await stats(s))["events"])

        await until(aborted)
        assert (await get(s, "/api/ps"))[1] == {"models": []}


async def test_a_waiting_request_is_dropped_when_its_client_leaves() -> None:
    slow = fast(num_parallel=1, gen_tokens_per_s=1.0, min_response_tokens=400, max_response_tokens=400)
    async with sim_session(slow) as (url, s), s.post("/api/chat", json={**chat_body(), "stream": True}) as busy:
        await busy.content.readline()
        try:
            async with aiohttp.ClientSession(url) as other:
                await other.post("/api/chat", json=chat_body(), timeout=aiohttp.ClientTimeout(total=0.1))
        except TimeoutError:
            pass

        async def dropped() -> bool:
            st = await stats(s)
            return bool(st["waiting"] == 0 and st["loaded"][0]["ref_count"] == 1)

        await until(dropped)
        assert (await stats(s))["max_waiting"] == 1
