"""Profile probers against fake backends that are real aiohttp apps on loopback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.backends.client import BackendClient
from gateway.backends.prober import LlamaServerProber, OllamaProber, ProbeError, detect_backend
from gateway.memory.kv import kv_bytes_per_token
from tests.support.fake_backend import FakeLLM, Handler, OllamaModels, json_answer, running, serve
from tests.support.tinymodel import write_tiny_model

DATA = Path(__file__).parent / "data"


def _ollama(models: OllamaModels) -> FakeLLM:
    return FakeLLM(answers=models.answers())


async def test_ollama_profile_is_cached_by_digest() -> None:
    models = OllamaModels({"llama3.1:8b": ("ggml-vocab-llama-bpe.gguf", "sha256:one")})
    async with running(_ollama(models)) as fake, aiohttp.ClientSession() as session:
        prober = OllamaProber(BackendClient(session, fake.url))
        first = await prober.profile("llama3.1:8b")
        again = await prober.profile("llama3.1:8b")
        assert again is first
        assert fake.json_bodies("/api/show") == [{"model": "llama3.1:8b", "verbose": False}]
        models.models["llama3.1:8b"] = ("ggml-vocab-llama-bpe.gguf", "sha256:two")  # re-pulled: new digest
        changed = await prober.profile("llama3.1:8b")
    assert changed is not first
    assert len(fake.json_bodies("/api/show")) == 2
    assert kv_bytes_per_token(first.shape) == 131072
    assert first.cache_key == "ollama:sha256:one"


async def test_ollama_asks_verbose_only_for_null_per_layer_arrays() -> None:
    models = OllamaModels({"gemma4:26b": ("ggml-vocab-gemma-4.gguf", "sha256:g4")})
    async with running(_ollama(models)) as fake, aiohttp.ClientSession() as session:
        profile = await OllamaProber(BackendClient(session, fake.url)).profile("gemma4:26b")
    assert [b["verbose"] for b in fake.json_bodies("/api/show")] == [False, True]
    assert profile.shape.n_head_kv[5] == 2


async def test_ollama_latest_tag_and_unknown_model() -> None:
    models = OllamaModels({"qwen2:latest": ("ggml-vocab-qwen2.gguf", "sha256:q")})
    async with running(_ollama(models)) as fake, aiohttp.ClientSession() as session:
        base = fake.url
        prober = OllamaProber(BackendClient(session, base))
        assert (await prober.profile("qwen2")).name == "qwen2:latest"
        with pytest.raises(ProbeError, match="no model 'mistral'; it has: qwen2:latest"):
            await prober.profile("mistral")
        assert await detect_backend(BackendClient(session, base)) == "ollama"


async def test_ollama_loaded_models() -> None:
    models = OllamaModels({}, ps_models=[{"name": "m:1", "model": "m:1", "size": 10, "size_vram": 10, "digest": "d",
                                          "context_length": 4096}])
    async with running(_ollama(models)) as fake, aiohttp.ClientSession() as session:
        (loaded,) = await OllamaProber(BackendClient(session, fake.url)).loaded()
    assert (loaded.name, loaded.context_tokens) == ("m:1", 4096)


def _llama_server_routes(props: dict[str, Any]) -> dict[tuple[str, str], Handler]:
    models = json.loads((DATA / "llama_server_models.json").read_text())
    slots = json.loads((DATA / "llama_server_slots.json").read_text())
    return {("GET", path): json_answer(body) for path, body in
            (("/props", props), ("/v1/models", models), ("/slots", slots))}


async def test_llama_server_profile_from_its_gguf() -> None:
    props = json.loads((DATA / "llama_server_props.json").read_text())
    model = write_tiny_model()
    props["model_path"] = str(model)
    async with serve(_llama_server_routes(props)) as base, aiohttp.ClientSession() as session:
        assert await detect_backend(BackendClient(session, base)) == "llama-server"
        prober = LlamaServerProber(BackendClient(session, base), configured_unified=False, configured_parallel=2,
                                   configured_ctx_size=4096)
        profile = await prober.profile()
        misconfigured = await LlamaServerProber(
            BackendClient(session, base), configured_unified=True, configured_parallel=2, configured_ctx_size=4096
        ).profile()
        slots = await prober.slots()
    assert kv_bytes_per_token(profile.shape) == 256
    assert (profile.context_tokens, profile.parallel, profile.warnings) == (2048, 2, ())
    assert any("matches a split pool" in w for w in misconfigured.warnings)
    assert len(slots) == 2


async def test_llama_server_without_a_visible_model_file() -> None:
    props = json.loads((DATA / "llama_server_props.json").read_text())
    props["model_path"] = "/nowhere/model.gguf"
    async with serve(_llama_server_routes(props)) as base, aiohttp.ClientSession() as session:
        with pytest.raises(ProbeError, match="give the backend a GGUF path or a preset"):
            await LlamaServerProber(BackendClient(session, base)).profile()


async def test_unreachable_backend_is_a_probe_error() -> None:
    async with aiohttp.ClientSession() as session:
        with pytest.raises(ProbeError, match="failed"):
            await OllamaProber(BackendClient(session, "http://127.0.0.1:9"), timeout_s=0.5).profile("x")
        with pytest.raises(ProbeError, match="answers neither"):
            await detect_backend(BackendClient(session, "http://127.0.0.1:9"), timeout_s=0.5)
