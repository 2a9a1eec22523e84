"""Ollama's native API on the simulator: shapes, defaults and error strings, byte for byte (ollama.md 2, 3, 6)."""

from __future__ import annotations

import orjson
import pytest

from kvsim.catalog import CATALOG
from kvsim.templates import Message, render
from kvsim.vocab import tokenizer_for
from tests.kvsim.helpers import chat_body, fast, get, post, post_raw, sim_session

HELLO_TOKENS = len(
    tokenizer_for(CATALOG["llama3.1:8b"]).encode(render("llama3", [Message("user", "Hello world, how are you?")]))
)


async def test_root_version_and_head() -> None:
    async with sim_session(fast()) as (_, s):
        async with s.get("/") as resp:
            assert (resp.status, await resp.text()) == (200, "Ollama is running")
        async with s.head("/api/version") as resp:
            assert resp.status == 200
        assert await get(s, "/api/version") == (200, {"version": "0.30.0"})
    async with sim_session(fast(era="e2")) as (_, s):
        assert await get(s, "/api/version") == (200, {"version": "0.20.0"})


async def test_chat_streams_ndjson_by_default() -> None:
    async with sim_session(fast()) as (_, s):
        body = chat_body()
        del body["stream"]
        async with s.post("/api/chat", json=body) as resp:
            assert resp.status == 200 and resp.content_type == "application/x-ndjson"
            lines = [orjson.loads(line) for line in (await resp.read()).splitlines()]
    *chunks, final = lines
    assert all(list(c) == ["model", "created_at", "message", "done"] and c["done"] is False for c in chunks)
    assert chunks[0]["message"]["role"] == "assistant" and chunks[0]["created_at"].endswith("Z")
    assert (
        final["done"] is True
        and final["done_reason"] == "stop"
        and final["message"] == {"role": "assistant", "content": ""}
    )
    assert final["prompt_eval_count"] == HELLO_TOKENS == 17
    assert final["eval_count"] == len(chunks)
    for key in ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration"):
        assert isinstance(final[key], int) and final[key] > 0


async def test_non_streaming_chat_is_the_concatenation_and_deterministic() -> None:
    async with sim_session(fast()) as (_, s):
        status, whole = await post(s, "/api/chat", chat_body())
        async with s.post("/api/chat", json=chat_body(stream=True)) as resp:
            lines = [orjson.loads(line) for line in (await resp.read()).splitlines()]
    assert status == 200 and whole["done"] is True
    assert whole["message"]["content"] == "".join(c["message"]["content"] for c in lines)
    assert whole["eval_count"] == lines[-1]["eval_count"]


async def test_generate_returns_context_unless_raw() -> None:
    async with sim_session(fast()) as (_, s):
        status, done = await post(s, "/api/generate", {"model": "llama3.1:8b", "prompt": "Why?", "stream": False})
        assert status == 200 and done["done_reason"] in ("stop", "length")
        assert len(done["context"]) == done["prompt_eval_count"] + done["eval_count"]
        status, raw = await post(
            s, "/api/generate", {"model": "llama3.1:8b", "prompt": "Why?", "raw": True, "stream": False}
        )
        assert status == 200 and "context" not in raw and raw["prompt_eval_count"] == 3  # BOS + "Why" + "?"


@pytest.mark.parametrize(
    ("path", "body", "status", "expected"),
    [
        ("/api/chat", {"model": "nope", "messages": []}, 404, b'{"error":"model \'nope\' not found"}'),
        ("/api/chat", {"messages": []}, 400, b'{"error":"model is required"}'),
        ("/api/generate", {"prompt": "x"}, 404, b'{"error":"model \'\' not found"}'),
        ("/api/generate", {"model": "nope", "prompt": "x"}, 404, b'{"error":"model \'nope\' not found"}'),
        ("/api/show", {}, 400, b'{"error":"model is required"}'),
        ("/api/show", {"model": "nope"}, 404, b'{"error":"model \'nope\' not found"}'),
        ("/api/embed", {"model": "nope", "input": "x"}, 404, b'{"error":"model \'nope\' not found"}'),
        (
            "/api/generate",
            {"model": "llama3.1:8b", "prompt": "x", "raw": True, "system": "s"},
            400,
            b'{"error":"raw mode does not support template, system, or context"}',
        ),
        (
            "/api/chat",
            {"model": "llama3.1:8b", "messages": [{"role": "user", "content": "x"}], "keep_alive": "-1"},
            400,
            b'{"error":"time: missing unit in duration \\"-1\\""}',
        ),
        (
            "/api/chat",
            {"model": "llama3.1:8b", "messages": [{"role": "user", "content": "x"}], "keep_alive": True},
            400,
            b'{"error":"Unsupported type: \'bool\'"}',
        ),
        (
            "/api/chat",
            {"model": "llama3.1:8b", "messages": [{"role": "user", "content": "x"}], "options": {"num_ctx": "big"}},
            500,
            b'{"error":"option \\"num_ctx\\" must be of type integer"}',
        ),
        (
            "/api/chat",
            {"model": "llama3.1:8b", "messages": [], "top_logprobs": 21},
            400,
            b'{"error":"top_logprobs must be between 0 and 20"}',
        ),
        (
            "/api/chat",
            {"model": "llama3.1:8b", "messages": [{"role": "user", "content": "x"}], "think": True},
            400,
            b'{"error":"\\"llama3.1:8b\\" does not support thinking"}',
        ),
        (
            "/api/chat",
            {"model": "nomic-embed-text", "messages": [{"role": "user", "content": "x"}]},
            400,
            b'{"error":"\\"nomic-embed-text\\" does not support chat"}',
        ),
        (
            "/api/generate",
            {"model": "nomic-embed-text", "prompt": "x"},
            400,
            b'{"error":"\\"nomic-embed-text\\" does not support generate"}',
        ),
        (
            "/api/generate",
            {"model": "llama3.1:8b", "prompt": "x", "suffix": "y"},
            400,
            b'{"error":"registry.ollama.ai/library/llama3.1:8b does not support insert"}',
        ),
        ("/api/embed", {"model": "nomic-embed-text", "input": [1]}, 400, b'{"error":"invalid input type"}'),
        (
            "/api/chat",
            {"model": 5},
            400,
            b'{"error":"json: cannot unmarshal number into Go struct field ChatRequest.model of type string"}',
        ),
    ],
)
async def test_error_bodies_are_byte_exact(path: str, body: object, status: int, expected: bytes) -> None:
    async with sim_session(fast()) as (_, s):
        got_status, got, content_type = await post_raw(s, path, orjson.dumps(body))
    assert (got_status, got, content_type) == (status, expected, "application/json")


async def test_missing_and_malformed_bodies() -> None:
    async with sim_session(fast()) as (_, s):
        assert await post_raw(s, "/api/chat", b"") == (400, b'{"error":"missing request body"}', "application/json")
        status, body, _ = await post_raw(s, "/api/generate", b"{not json")
        assert (status, body) == (
            400,
            b'{"error":"invalid character \'n\' looking for beginning of object key string"}',
        )


async def test_unload_and_load_requests() -> None:
    async with sim_session(fast()) as (_, s):
        status, raw, _ = await post_raw(s, "/api/generate", b'{"model":"llama3.1:8b"}')
        loaded = orjson.loads(raw)
        assert status == 200 and list(loaded)[:5] == ["model", "created_at", "response", "done", "done_reason"]
        assert (loaded["response"], loaded["done"], loaded["done_reason"]) == ("", True, "load")
        assert [m["name"] for m in (await get(s, "/api/ps"))[1]["models"]] == ["llama3.1:8b"]
        status, raw, _ = await post_raw(s, "/api/generate", b'{"model":"llama3.1:8b","keep_alive":0}')
        unloaded = orjson.loads(raw)
        assert list(unloaded) == ["model", "created_at", "response", "done", "done_reason"]
        assert (unloaded["model"], unloaded["done_reason"]) == ("llama3.1:8b", "unload")
        assert (await get(s, "/api/ps"))[1] == {"models": []}
        status, chat = await post(s, "/api/chat", {"model": "llama3.1:8b", "messages": [], "keep_alive": 0})
        assert status == 200 and chat["message"] == {"role": "assistant", "content": ""}
        assert chat["done_reason"] == "unload"
        status, chat = await post(s, "/api/chat", {"model": "llama3.1:8b", "messages": []})
        assert (status, chat["done_reason"]) == (200, "load")


async def test_show_tags_and_ps_shapes() -> None:
    async with sim_session(fast()) as (_, s):
        status, show = await post(s, "/api/show", {"name": "llama3.1:8b"})  # "name" is the deprecated alias
        assert status == 200
        assert show["details"] == {
            "parent_model": "",
            "format": "gguf",
            "family": "llama",
            "families": ["llama"],
            "parameter_size": "8.0B",
            "quantization_level": "Q4_K_M",
        }
        assert show["model_info"]["llama.block_count"] == 32 and show["model_info"]["tokenizer.ggml.tokens"] is None
        assert show["capabilities"] == ["completion", "tools"]
        status, verbose = await post(s, "/api/show", {"model": "llama3.1:8b", "verbose": True})
        assert len(verbose["model_info"]["tokenizer.ggml.tokens"]) == 128256
        status, tags = await get(s, "/api/tags")
        names = [m["name"] for m in tags["models"]]
        assert names == ["llama3.1:8b", "qwen2.5:7b", "nomic-embed-text:latest"]
        assert tags["models"][0]["details"]["context_length"] == 131072  # v0.30+ fills it in /api/tags
        await post(s, "/api/chat", chat_body(options={"num_ctx": 8192}))
        (entry,) = (await get(s, "/api/ps"))[1]["models"]
        assert list(entry) == [
            "name",
            "model",
            "size",
            "digest",
            "details",
            "expires_at",
            "size_vram",
            "context_length",
        ]
        assert entry["context_length"] == 8192 and entry["size"] == entry["size_vram"] > 5 * 10**9
    async with sim_session(fast(era="e2")) as (_, s):
        tags = (await get(s, "/api/tags"))[1]
        assert "context_length" not in tags["models"][0]["details"]


async def test_embed() -> None:
    async with sim_session(fast()) as (_, s):
        status, out = await post(s, "/api/embed", {"model": "nomic-embed-text", "input": ["hello", "world"]})
        assert status == 200 and len(out["embeddings"]) == 2 and len(out["embeddings"][0]) == 768
        assert abs(sum(v * v for v in out["embeddings"][0]) - 1) < 1e-3 and out["prompt_eval_count"] > 0
        assert (await post(s, "/api/embed", {"model": "nomic-embed-text", "input": []}))[1]["embeddings"] == []
        status, out = await post(s, "/api/embed", {"model": "llama3.1:8b", "input": "completion models embed too"})
        assert status == 200 and len(out["embeddings"][0]) == 4096
        long = {"model": "nomic-embed-text", "input": "word " * 3000, "truncate": False}
        assert await post(s, "/api/embed", long) == (400, {"error": "the input length exceeds the context length"})
        assert (await post(s, "/api/embed", {**long, "truncate": True}))[0] == 200


async def test_foreign_host_header_is_403_and_unknown_paths_gins_404() -> None:
    async with sim_session(fast()) as (_, s):
        async with s.get("/api/tags", headers={"Host": "ollama.example.com"}) as resp:
            assert (resp.status, await resp.read()) == (403, b"")
        for host in ("localhost:11434", "10.0.0.7", "box.local", "gpu.internal"):
            async with s.get("/api/version", headers={"Host": host}) as resp:
                assert resp.status == 200, host
        async with s.get("/api/nope") as resp:
            assert (resp.status, await resp.text()) == (404, "404 page not found")


async def test_generated_text_depends_only_on_the_seed_and_the_request() -> None:
    texts = []
    for seed in (1, 1, 2):
        async with sim_session(fast(seed=seed)) as (_, s):
            texts.append((await post(s, "/api/chat", chat_body()))[1]["message"]["content"])
    assert texts[0] == texts[1] != texts[2]
    async with sim_session(fast(seed=1)) as (_, s):
        other = (await post(s, "/api/chat", chat_body(options={"seed": 42})))[1]["message"]["content"]
    assert other != texts[0]
