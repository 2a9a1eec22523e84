"""Routing by memory between two simulated Ollama GPU hosts (24 GiB each, their GPU exporters as ``vram``) that serve
the same model, issue 16 point 1:

- Neither has the model loaded: host A would have to unload another model to load it, host B has room: the request
  goes to B, and ``X-Kvgate-Route`` says it loads there without eviction. A keeps its model.
- A model kvgate probed on A that Ollama unloaded since counts as resident no longer, once kvgate read /api/ps there
  (any read: here the status page's): the request goes where no eviction is needed.

Sizes on the simulated GPU: llama3.1:8b ~8.8 GiB at its default 32768 context, gemma3:27b ~19 GiB.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from tests.support.gateway_server import running_gateway

MODELS = ("llama3.1:8b", "gemma3:27b")
ASKED, BIG = MODELS


@contextlib.asynccontextmanager
async def _two_hosts() -> AsyncIterator[tuple[str, str]]:
    from kvsim.config import SimConfig
    from kvsim.runner import start_sim

    config = SimConfig(models=MODELS, load_s=0.01, time_scale=50.0)
    first, url_a = await start_sim(config)
    try:
        second, url_b = await start_sim(config)
        try:
            yield url_a, url_b
        finally:
            await second.cleanup()
    finally:
        await first.cleanup()


def _backend(name: str, sim: str) -> dict[str, Any]:
    from kvsim.gpu.exporter import EXPORTER_PATH

    return {"name": name, "url": sim, "vram": sim + EXPORTER_PATH, "vram_refresh_s": 0.01, "parallel": 1}


async def _call(url: str, method: str, path: str, body: Any = None) -> tuple[int, dict[str, str], Any]:
    async with aiohttp.ClientSession() as http, http.request(method, f"{url}{path}", json=body) as response:
        raw = await response.read()
        return response.status, dict(response.headers), orjson.loads(raw) if raw else None


async def _chat(url: str, model: str) -> tuple[int, dict[str, str], Any]:
    return await _call(url, "POST", "/api/chat", {"model": model, "stream": False,
                                                  "messages": [{"role": "user", "content": "hi"}]})


async def _chat_goes_where_it_loads_without_eviction(url: str) -> None:
    """A chat for ASKED goes to b: on a, its load would evict an idle model (the route header says so)."""
    status, headers, body = await _chat(url, ASKED)
    print(f"\n{status} backend={headers.get('X-Kvgate-Backend')} route={headers.get('X-Kvgate-Route')!r}")
    assert status == 200, body
    assert headers["X-Kvgate-Backend"] == "b"
    assert headers["X-Kvgate-Route"].startswith("loads without eviction, first token in ")
    assert "a: load" in headers["X-Kvgate-Route"] and "after evicting 1 idle model(s)" in headers["X-Kvgate-Route"]


async def _load_directly(sim: str, model: str, *, keep_alive: int | None = None) -> None:
    """What another client of the same Ollama does: load (or, with keep_alive 0, unload) a model past kvgate."""
    body: dict[str, Any] = {"model": model, "stream": False}
    if keep_alive is not None:
        body["keep_alive"] = keep_alive
    status, _, answer = await _call(sim, "POST", "/api/generate", body)
    assert status == 200, answer


async def _resident(sim: str) -> set[str]:
    return {m["name"] for m in (await _call(sim, "GET", "/api/ps"))[2]["models"]}


async def _stats(sim: str) -> dict[str, Any]:
    return (await _call(sim, "GET", "/sim/stats"))[2]  # type: ignore[no-any-return]


async def test_a_model_loaded_nowhere_goes_to_the_host_that_loads_it_without_eviction() -> None:
    async with _two_hosts() as (sim_a, sim_b):
        await _load_directly(sim_a, BIG)  # 19 GiB on A: the 8.8 GiB of llama fit only after unloading it
        async with running_gateway([_backend("a", sim_a), _backend("b", sim_b)]) as url:
            await _chat_goes_where_it_loads_without_eviction(url)
        assert await _resident(sim_a) == {BIG} and await _resident(sim_b) == {ASKED}
        stats_a = await _stats(sim_a)
        assert (stats_a["loads"], stats_a["unloads"]) == (1, 0)  # the preview of A loaded and unloaded nothing


async def test_a_model_ollama_unloaded_since_it_was_probed_is_no_longer_resident() -> None:
    async with _two_hosts() as (sim_a, sim_b), \
            running_gateway([_backend("a", sim_a), _backend("b", sim_b)], routing={"sticky": False}) as url:
        status, headers, _ = await _chat(url, ASKED)  # both have room: the first configured
        assert status == 200 and headers["X-Kvgate-Backend"] == "a"
        # another client of A's Ollama unloads llama and loads gemma: llama's pool in kvgate is stale
        await _load_directly(sim_a, ASKED, keep_alive=0)
        await _load_directly(sim_a, BIG)
        assert (await _call(url, "GET", "/kvgate/status"))[0] == 200  # kvgate reads /api/ps of both hosts
        await _chat_goes_where_it_loads_without_eviction(url)
        assert await _resident(sim_a) == {BIG}
