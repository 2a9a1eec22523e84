"""BackendProbes (gateway/backends/probes.py) against fake backends that are real aiohttp apps on loopback: one
prober and one VRAM source per backend, built once and kept; profiles of OpenAI-style servers from presets; VRAM
sources from each form of the ``vram`` setting; Ollama's loaded models matched by name."""

from __future__ import annotations

import contextlib
import importlib.util
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from gateway.backends import Backend
from gateway.backends.client import BackendClient
from gateway.backends.prober import ProfileUnderivable
from gateway.backends.probes import BackendProbes
from gateway.config.settings import load_settings
from gateway.memory.vram import StaticVramSource, VramUnavailable
from gateway.runtimes import runtime_for
from tests.support.fake_backend import FakeLLM, OllamaModels, json_answer, running, serve, text_answer

PRESET = "llama3.1:8b"
GIB = 2**30
LLAMA_MODELS = {"object": "list", "data": [{"id": "fake", "object": "model", "meta": {
    "n_ctx_train": 131072, "n_params": 8_030_261_248, "size": 4_920_734_016, "n_embd": 4096, "n_vocab": 128256}}]}
"""llama-server's /v1/models with the metadata a profile needs (layer counts come from the GGUF or a preset)."""


@dataclass
class Probed:
    probes: BackendProbes
    backends: list[Backend]
    session: aiohttp.ClientSession


@contextlib.asynccontextmanager
async def probing(*backends: dict[str, Any], sources: dict[str, Any] | None = None) -> AsyncIterator[Probed]:
    """BackendProbes over ``backends`` (settings tables), built as gateway/backends/registry.py builds them."""
    settings = load_settings(None, backends=list(backends))
    async with aiohttp.ClientSession() as session:
        built = [Backend(config, BackendClient.for_backend(session, config), runtime=runtime_for(config.kind))
                 for config in settings.backends]
        yield Probed(BackendProbes(session, sources), built, session)


def ollama_at(url: str, name: str = "ollama", **fields: Any) -> dict[str, Any]:
    return {"name": name, "kind": "ollama", "url": url, **fields}


# --- probers: one per backend, kept -----------------------------------------------------------------------------


async def test_an_ollama_prober_is_built_once_per_backend_and_kept() -> None:
    models = OllamaModels({PRESET: ("ggml-vocab-llama-bpe.gguf", "sha256:one")})
    async with running(FakeLLM(answers=models.answers())) as first, \
            running(FakeLLM(answers=models.answers())) as second, \
            probing(ollama_at(first.url, "a"), ollama_at(second.url, "b")) as p:
        a, b = p.backends
        profile = await p.probes.profile(a, PRESET)
        assert await p.probes.profile(a, PRESET) is profile  # the kept prober's cache by digest
        await p.probes.profile(b, PRESET)
    assert len(first.requests_to("/api/show")) == 1
    assert len(second.requests_to("/api/show")) == 1  # backend b has a prober of its own


async def test_a_llama_server_prober_is_built_once_and_keeps_its_recent_reads() -> None:
    async with running(FakeLLM(answers={"/v1/models": json_answer(LLAMA_MODELS)})) as fake, \
            probing({"name": "llama", "kind": "llama-server", "url": fake.url}) as p:
        backend = p.backends[0]
        profile = await p.probes.profile(backend, PRESET)  # the GGUF is not visible here: the preset's shape
        again = await p.probes.profile(backend, PRESET)
    assert again == profile
    assert (profile.weights_bytes, profile.context_tokens, profile.parallel) == (4_920_734_016, 8192, 4)
    assert len(fake.requests_to("/props")) == 1  # a profile read within RECENT_PROBE_S answers the second


async def test_a_llama_server_profile_does_not_depend_on_whether_its_pool_was_probed_first() -> None:
    async with running(FakeLLM(answers={"/v1/models": json_answer(LLAMA_MODELS)})) as fake, \
            probing({"name": "llama", "kind": "llama-server", "url": fake.url}) as p:
        backend = p.backends[0]
        props = await p.probes.llama_props(backend)  # what PoolDirectory asks on the first proxied request
        assert props.n_ctx_slot == 8192
        profile = await p.probes.profile(backend, PRESET)
    assert profile.weights_bytes == 4_920_734_016


async def test_without_a_preset_or_gguf_a_llama_server_profile_is_underivable() -> None:
    async with running(FakeLLM(answers={"/v1/models": json_answer(LLAMA_MODELS)})) as fake, \
            probing({"name": "llama", "kind": "llama-server", "url": fake.url}) as p:
        with pytest.raises(ProfileUnderivable, match="give the backend a GGUF path or a preset"):
            await p.probes.profile(p.backends[0], "not-a-preset")


# --- profiles of OpenAI-style servers --------------------------------------------------------------------------


@pytest.mark.parametrize("model", [PRESET, "Llama-3.1-8B", "llama3.1:8b-q8_0"])
async def test_an_openai_backend_profile_comes_from_a_preset(model: str) -> None:
    async with probing({"name": "vllm", "kind": "openai", "url": "http://127.0.0.1:9"}) as p:
        profile = await p.probes.profile(p.backends[0], model)
    assert profile.shape.n_layers == 32 and profile.weights_bytes > 4 * GIB


@pytest.mark.parametrize("model", ["my-finetune", "/nowhere/model.gguf"])
async def test_an_openai_backend_profile_of_an_unknown_model_names_it(model: str) -> None:
    async with probing({"name": "vllm", "kind": "openai", "url": "http://127.0.0.1:9"}) as p:
        with pytest.raises(LookupError) as unknown:
            await p.probes.profile(p.backends[0], model)
    message = str(unknown.value)
    assert repr(model) in message and "backend 'vllm'" in message and "not a preset or a GGUF path" in message


# --- VRAM sources -------------------------------------------------------------------------------------------------


EXPORTER_METRICS = (
    '# TYPE nvidia_smi_memory_total_bytes gauge\n'
    'nvidia_smi_memory_total_bytes{uuid="GPU-1"} 25769803776\n'
    'nvidia_smi_memory_used_bytes{uuid="GPU-1"} 1073741824\n'
    'nvidia_smi_memory_free_bytes{uuid="GPU-1"} 24696061952\n'
)


@pytest.mark.parametrize(("vram", "source_name", "total_bytes"), [
    (None, None, None),
    ("24GiB", "static", 24 * GIB),
    ("exporter", "exporter", 24 * GIB),
], ids=["unset", "a static size", "an exporter URL"])
async def test_the_vram_setting_picks_the_source_and_it_is_kept(
    vram: str | None, source_name: str | None, total_bytes: int | None
) -> None:
    routes = {("GET", "/metrics"): text_answer(EXPORTER_METRICS)}
    async with serve(routes) as exporter:
        setting = f"{exporter}/metrics" if vram == "exporter" else vram
        async with probing(ollama_at("http://127.0.0.1:9", vram=setting, vram_refresh_s=60)) as p:
            backend = p.backends[0]
            source = p.probes.vram_source(backend)
            assert p.probes.vram_source(backend) is source
            reading = await p.probes.vram(backend)
            again = await p.probes.vram(backend)
    if source_name is None:
        assert (source, reading) == (None, None)
        return
    assert source is not None and source.name == source_name
    assert reading is not None and reading.total_bytes == total_bytes
    assert again is reading  # cached for vram_refresh_s


async def test_an_exporter_that_can_not_be_read_is_vram_unavailable() -> None:
    async with probing(ollama_at("http://127.0.0.1:9", vram="http://127.0.0.1:9/metrics")) as p:
        with pytest.raises(VramUnavailable, match=re.escape("exporter http://127.0.0.1:9/metrics")):
            await p.probes.vram(p.backends[0])


async def test_an_injected_source_wins_over_the_setting() -> None:
    injected = StaticVramSource(8 * GIB)
    async with probing(ollama_at("http://127.0.0.1:9", vram="24GiB"), sources={"ollama": injected}) as p:
        assert p.probes.vram_source(p.backends[0]) is injected
        reading = await p.probes.vram(p.backends[0])
    assert reading is not None and reading.total_bytes == 8 * GIB


HAS_PYNVML = importlib.util.find_spec("pynvml") is not None


@pytest.mark.skipif(not HAS_PYNVML, reason="pynvml (nvidia-ml-py) is not installed")
async def test_the_nvml_setting_builds_an_nvml_source_without_touching_the_driver() -> None:
    async with probing(ollama_at("http://127.0.0.1:9", vram="nvml")) as p:
        source = p.probes.vram_source(p.backends[0])
        assert source is not None and source.name == "nvml"
        assert p.probes.vram_source(p.backends[0]) is source


@pytest.mark.skipif(HAS_PYNVML, reason="pynvml is installed: the missing-library path can't be reached")
async def test_the_nvml_setting_without_pynvml_is_vram_unavailable() -> None:
    async with probing(ollama_at("http://127.0.0.1:9", vram="nvml")) as p:
        with pytest.raises(VramUnavailable, match="pynvml"):
            p.probes.vram_source(p.backends[0])


# --- Ollama's loaded models -------------------------------------------------------------------------------------

PS = {"models": [
    {"name": "mistral:latest", "model": "mistral:latest", "size": 5 * GIB, "size_vram": 5 * GIB,
     "context_length": 4096},
    {"name": PRESET, "model": PRESET, "size": 6 * GIB, "size_vram": 6 * GIB, "context_length": 16384},
]}


@pytest.mark.parametrize(("asked", "loaded_name", "context_tokens"), [
    ("mistral", "mistral:latest", 4096),
    ("mistral:latest", "mistral:latest", 4096),
    (PRESET, PRESET, 16384),
    ("llama3.1", None, None),  # llama3.1:latest is not llama3.1:8b
    ("qwen2.5:7b", None, None),
])
async def test_a_loaded_model_is_matched_by_name_and_its_latest_twin(
    asked: str, loaded_name: str | None, context_tokens: int | None
) -> None:
    async with running(FakeLLM(answers={"/api/ps": json_answer(PS)})) as fake, probing(ollama_at(fake.url)) as p:
        backend = p.backends[0]
        loaded = await p.probes.loaded_model(backend, asked)
        context = await p.probes.loaded_context(backend, asked)
    assert (loaded.name if loaded else None, context) == (loaded_name, context_tokens)
    if loaded is not None:
        assert loaded.size_bytes == loaded.size_vram_bytes > GIB
    assert len(fake.requests_to("/api/ps")) == 2  # loaded_context reads /api/ps anew


# --- loads: how long they took, for routing ---------------------------------------------------------------------


@pytest.mark.parametrize(("reported_ns", "delay_s", "low_s", "high_s"), [
    (50_000_000, 0.3, 0.05, 0.05),  # Ollama's own load_duration, shorter than the request
    (None, 0.3, 0.3, 2.0),  # an answer without one: the request's own time
    (30_000_000_000, 0.0, 0.0, 1.0),  # a simulator running faster than real time: at most the request's time
], ids=["reported", "not reported", "faster than real time"])
async def test_a_load_kvgate_asks_for_is_timed_by_the_backend_at_most_as_long_as_the_request(
    reported_ns: int | None, delay_s: float, low_s: float, high_s: float,
) -> None:
    answer = {"model": PRESET, "done": True, "done_reason": "load", "response": ""}
    if reported_ns is not None:
        answer["load_duration"] = reported_ns
    fake = FakeLLM(answers={"/api/generate": json_answer(answer)})
    fake.script.first_byte_delay_s = delay_s
    async with running(fake) as served, probing(ollama_at(served.url)) as p:
        await p.probes.load_model(p.backends[0], PRESET, 8192)
        learned = p.probes.load_times.expected_s("ollama", PRESET)
    print(f"\nload_duration {reported_ns} ns, request {delay_s} s -> {learned}")
    assert learned is not None and learned[1] == "here"
    assert low_s <= learned[0] <= high_s
