"""Profile probers against fake backends that are real aiohttp apps on loopback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.backends.prober import LlamaServerProber, OllamaProber, ProbeError, detect_backend
from gateway.memory.kv import kv_bytes_per_token
from tests.memory.loopback import serve
from tests.memory.ollama_fake import FakeOllama
from tests.support.tinymodel import write_tiny_model

DATA = Path(__file__).parent / "data"


async def test_ollama_profile_is_cached_by_digest() -> None:
    fake = FakeOllama({"llama3.1:8b": ("ggml-vocab-llama-bpe.gguf", "sha256:one")})
    async with serve(fake.app()) as base, aiohttp.ClientSession() as session:
        prober = OllamaProber(session, base)
        first = await prober.profile("llama3.1:8b")
        again = await prober.profile("llama3.1:8b")
        assert again is first
        assert fake.show_bodies == [{"model": "llama3.1:8b", "verbose": False}]
        fake.models["llama3.1:8b"] = ("ggml-vocab-llama-bpe.gguf", "sha256:two")  # re-pulled: new digest
        changed = await prober.profile("llama3.1:8b")
    assert changed is not first
    assert len(fake.show_bodies) == 2
    assert kv_bytes_per_token(first.shape) == 131072
    assert first.cache_key == "ollama:sha256:one"


async def test_ollama_asks_verbose_only_for_null_per_layer_arrays() -> None:
    fake = FakeOllama({"gemma4:26b": ("ggml-vocab-gemma-4.gguf", "sha256:g4")})
    async with serve(fake.app()) as base, aiohttp.ClientSession() as session:
        profile = await OllamaProber(session, base).profile("gemma4:26b")
    assert [b["verbose"] for b in fake.show_bodies] == [False, True]
    assert profile.shape.n_head_kv[5] == 2


async def test_ollama_latest_tag_and_unknown_model() -> None:
    fake = FakeOllama({"qwen2:latest": ("ggml-vocab-qwen2.gguf", "sha256:q")})
    async with serve(fake.app()) as base, aiohttp.ClientSession() as session:
        prober = OllamaProber(session, base)
        assert (await prober.profile("qwen2")).name == "qwen2:latest"
        with pytest.raises(ProbeError, match="no model 'mistral'; it has: qwen2:latest"):
            await prober.profile("mistral")
        assert await detect_backend(session, base) == "ollama"


async def test_ollama_loaded_models() -> None:
    fake = FakeOllama({})
    fake.ps_models = [{"name": "m:1", "model": "m:1", "size": 10, "size_vram": 10, "digest": "d",
                       "context_length": 4096}]
    async with serve(fake.app()) as base, aiohttp.ClientSession() as session:
        (loaded,) = await OllamaProber(session, base).loaded()
    assert (loaded.name, loaded.context_tokens) == ("m:1", 4096)


def _llama_server_app(props: dict[str, Any]) -> web.Application:
    models = json.loads((DATA / "llama_server_models.json").read_text())
    slots = json.loads((DATA / "llama_server_slots.json").read_text())
    app = web.Application()
    for path, body in (("/props", props), ("/v1/models", models), ("/slots", slots)):
        app.router.add_get(path, _responder(body))
    return app


def _responder(body: Any) -> Any:
    async def handler(_: web.Request) -> web.Response:
        return web.json_response(body)

    return handler


async def test_llama_server_profile_from_its_gguf() -> None:
    props = json.loads((DATA / "llama_server_props.json").read_text())
    model = write_tiny_model()
    props["model_path"] = str(model)
    async with serve(_llama_server_app(props)) as base, aiohttp.ClientSession() as session:
        assert await detect_backend(session, base) == "llama-server"
        prober = LlamaServerProber(session, base, configured_unified=False, configured_parallel=2,
                                   configured_ctx_size=4096)
        profile = await prober.profile()
        misconfigured = await LlamaServerProber(
            session, base, configured_unified=True, configured_parallel=2, configured_ctx_size=4096
        ).profile()
        slots = await prober.slots()
    assert kv_bytes_per_token(profile.shape) == 256
    assert (profile.context_tokens, profile.parallel, profile.warnings) == (2048, 2, ())
    assert any("matches a split pool" in w for w in misconfigured.warnings)
    assert len(slots) == 2


async def test_llama_server_without_a_visible_model_file() -> None:
    props = json.loads((DATA / "llama_server_props.json").read_text())
    props["model_path"] = "/nowhere/model.gguf"
    async with serve(_llama_server_app(props)) as base, aiohttp.ClientSession() as session:
        with pytest.raises(ProbeError, match="give the backend a GGUF path or a preset"):
            await LlamaServerProber(session, base).profile()


async def test_unreachable_backend_is_a_probe_error() -> None:
    async with aiohttp.ClientSession() as session:
        with pytest.raises(ProbeError, match="failed"):
            await OllamaProber(session, "http://127.0.0.1:9", timeout_s=2).profile("x")
        with pytest.raises(ProbeError, match="answers neither"):
            await detect_backend(session, "http://127.0.0.1:9", timeout_s=2)
