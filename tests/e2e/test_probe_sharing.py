"""Concurrent requests for the same probe share one: 64 concurrent requests on a cold kvgate, of each route kind, in
front of a fake llama-server and a fake Ollama, send a small constant number of model-list, props, show and ps
probes, not one (or two) per request (issue 10, with 100 requests: about 185 /props and 100 /v1/models before)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import io
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import gateway
from tests.support.fake_backend import MODELS, FakeLLM, OllamaModels, Script, json_answer, running
from tests.support.gateway_server import running_gateway

REQUESTS = 64
KVGATE_CODE = str(Path(gateway.__file__).parent) + "/"
PROBE_PATHS = ("/props", "/v1/models", "/api/tags", "/api/show", "/api/ps")
CHAT = {"messages": [{"role": "user", "content": "hello there"}]}
OLLAMA_MODEL = "llama3.1:8b"


def probed_fake(models: tuple[str, ...] = MODELS) -> FakeLLM:
    """The scripted fake, with the model metadata kvgate probes for: digests in /api/tags, /api/show built from a
    real GGUF's key/values, and llama-server's /v1/models meta. Every answer takes a moment (the script's delays):
    requests arriving meanwhile must join the probe in flight."""
    ollama = OllamaModels({m: ("ggml-vocab-llama-bpe.gguf", f"sha256:{index:064x}") for index, m in enumerate(models)})
    meta = {"n_ctx_train": 131072, "n_params": 8_030_261_248, "size": 4_920_734_016, "n_embd": 4096, "n_vocab": 128256}
    listing = {"object": "list", "data": [{"id": m, "object": "model", "meta": meta} for m in models]}
    return FakeLLM(Script(models=models, first_byte_delay_s=0.01, probe_delay_s=0.01),
                   answers={**ollama.answers(), "/v1/models": json_answer(listing)})


CASES: dict[str, tuple[str, str, dict[str, Any] | None]] = {
    "chat, Ollama": ("POST", "/api/chat", {**CHAT, "model": OLLAMA_MODEL, "stream": False}),
    "chat, OpenAI on Ollama": ("POST", "/v1/chat/completions", {**CHAT, "model": OLLAMA_MODEL}),
    "chat, llama-server": ("POST", "/v1/chat/completions", {**CHAT, "model": "served.gguf"}),
    "completion, llama-server": ("POST", "/completion", {"prompt": "hello there"}),
    "generate, Ollama": ("POST", "/api/generate", {"model": OLLAMA_MODEL, "prompt": "hello", "stream": False}),
    "fit, Ollama": ("GET", f"/kvgate/fit?model={OLLAMA_MODEL}", None),
    "fit, llama-server": ("GET", f"/kvgate/fit?model={OLLAMA_MODEL}&backend=cpp", None),
    "count, Ollama": ("POST", "/kvgate/count?route=/api/chat", {**CHAT, "model": OLLAMA_MODEL}),
    "count, llama-server": ("POST", "/kvgate/count?route=/completion", {"prompt": "hello there"}),
}

MOST_PROBES = 3
"""Per path and backend, for REQUESTS concurrent cold requests: list once, probe once, and read /props or /api/ps once
more where a load or the counter's template needs it."""


async def _probe_counts(method: str, path: str, body: dict[str, Any] | None) -> tuple[dict[str, int], list[int]]:
    llama = probed_fake(("served.gguf",))
    ollama = probed_fake()
    async with running(llama), running(ollama):
        backends = [{"name": "cpp", "kind": "llama-server", "url": llama.url},
                    {"name": "oll", "kind": "ollama", "url": ollama.url, "vram": "24GiB"}]
        async with running_gateway(backends) as url, aiohttp.ClientSession() as http:
            async def send() -> int:
                async with http.request(method, url + path, json=body) as response:
                    await response.read()
                    return response.status

            statuses = await asyncio.gather(*(send() for _ in range(REQUESTS)))
    counts: dict[str, int] = {}
    for name, fake in (("llama-server", llama), ("ollama", ollama)):
        seen = collections.Counter(request.path_qs.partition("?")[0] for request in fake.seen)
        counts.update({f"{name} {p}": seen[p] for p in PROBE_PATHS if seen[p]})
        if not path.startswith("/kvgate/"):  # every request reached the backend serving its model, none the default
            counts[f"{name} forwarded"] = seen[path]
    return counts, statuses


@pytest.mark.parametrize("case", list(CASES))
async def test_concurrent_cold_requests_share_each_probe(case: str) -> None:
    counts, statuses = await _probe_counts(*CASES[case])
    print(f"\n{case}: {REQUESTS} concurrent cold requests -> probes {counts}, statuses {collections.Counter(statuses)}")
    assert set(statuses) == {200}, collections.Counter(statuses)
    assert all(n <= MOST_PROBES for key, n in counts.items() if not key.endswith(" forwarded")), counts
    if not CASES[case][1].startswith("/kvgate/"):
        target = "ollama" if "Ollama" in case else "llama-server"
        assert counts[f"{target} forwarded"] == REQUESTS, counts


async def test_a_probe_shared_by_waiting_requests_ends_with_kvgate() -> None:
    """A pool probe is shielded from any one request's cancellation, so waiting clients share it; at shutdown it
    must end too. It used to run on past the gateway's cleanup, into a closed session, and leave a half-open
    connection that surfaced as a ResourceWarning in whichever later test ran the garbage collector."""
    fake = FakeLLM(Script(models=("llama3.1:8b",), probe_delay_s=30.0))
    async with running(fake), aiohttp.ClientSession() as http:
        async with running_gateway([{"name": "b", "kind": "ollama", "url": fake.url}]) as url:
            with contextlib.suppress(asyncio.TimeoutError):
                await http.post(url + "/api/chat", json={"model": "llama3.1:8b", "stream": False,
                                                         "messages": [{"role": "user", "content": "hi"}]},
                                timeout=aiohttp.ClientTimeout(total=0.5))
        await asyncio.sleep(0)  # one turn: anything kvgate left running would still be pending now
        left = [task for task in asyncio.all_tasks() if KVGATE_CODE in _stack_of(task)]
        assert left == []


def _stack_of(task: asyncio.Task[object]) -> str:
    out = io.StringIO()
    task.print_stack(file=out)
    return out.getvalue()
