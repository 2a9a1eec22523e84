"""Issue 9's invariant, cell by cell: every KV-allocating request holds a reservation in the pool of the model the
backend really runs, and the backend can't let it grow past that reservation.

- A request with no output limit gets one, and the backend is told (X-Kvgate-Rewrite ``... (was unset)``).
- Made-up model names on llama-server land in the server's one pool: a tenant's ``max_active`` holds across names,
  and thousands of names make one pool, a handful of probes and a small metrics page.
- Ollama: an unknown model is a 404 in the client's format, made before anything reaches the backend.
- A backend that can't be probed: requests wait for one shared probe and are admitted when it answers; never
  forwarded without a reservation.
- ``kind = "openai"`` backends: admitted with ``parallel`` + ``context_tokens``, else said plainly on the status page.
- One context per Ollama model whoever asks: ``/api`` clients with and without ``num_ctx`` and ``/v1`` clients
  alternating load the model once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from gateway.app import POOLS, create_app, start_server
from gateway.config.settings import load_settings
from kvsim.config import SimConfig
from kvsim.runner import start_sim
from tests.kvsim.helpers import running_sim
from tests.support.fake_backend import FakeLLM, Script, running
from tests.support.gateway_server import running_gateway
from tests.support.llama_server import free_port
from tests.support.poll import until

LLAMA_SIM = SimConfig(mode="llama-server", ctx_size=2048, n_parallel=-1, load_s=0.0, time_scale=50.0,
                      min_response_tokens=4, max_response_tokens=8, gen_tokens_per_s=2000.0)


@pytest.fixture
async def llama_sim() -> AsyncIterator[str]:
    async with running_sim(LLAMA_SIM) as url:
        yield url


async def _post(http: aiohttp.ClientSession, url: str, body: dict[str, Any],
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any], dict[str, str]]:
    async with http.post(url, json=body, headers=headers or {}) as response:
        return response.status, orjson.loads(await response.read()), dict(response.headers)


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}, "max_tokens"),
        ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n_predict": -1}, "n_predict"),
        ("/completion", {"prompt": "hi"}, "n_predict"),
        ("/completion", {"prompt": "hi", "max_tokens": 16, "n_predict": 3000}, "n_predict"),
        ("/v1/completions", {"prompt": "hi", "model": "made-up"}, "max_tokens"),
        ("/v1/responses", {"input": "hi"}, "max_output_tokens"),
        ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000}, "max_tokens"),
    ],
)
async def test_the_backend_is_always_told_the_reserved_limit(
    llama_sim: str, path: str, body: dict[str, Any], field: str
) -> None:
    async with running_gateway([{"name": "cpp", "kind": "llama-server", "url": llama_sim}]) as url, \
            aiohttp.ClientSession() as http:
        status, payload, headers = await _post(http, url + path, body)
    assert status == 200, payload
    reserved = int(headers["X-Kvgate-Reserved-Tokens"])
    prompt = int(headers["X-Kvgate-Prompt-Tokens"])
    rewrite = headers["X-Kvgate-Rewrite"]
    print(f"{path:24} {orjson.dumps(body).decode()[:70]:72} -> {rewrite}")
    sent = int(rewrite.split(f"{field}=")[1].split(" ")[0])
    assert prompt + sent == reserved  # the backend may generate exactly what was reserved, no more
    assert reserved <= 2048



async def _queued(http: aiohttp.ClientSession, url: str, expected: int) -> bool:
    """Whether kvgate's status page shows ``expected`` requests waiting, across its pools."""
    async with http.get(f"{url}/kvgate/status") as response:
        pools = (await response.json())["pools"]
    return bool(sum(pool["queued"] for pool in pools) == expected)


async def _notes(http: aiohttp.ClientSession, url: str) -> list[str]:
    async with http.get(f"{url}/kvgate/status") as response:
        notes: list[str] = (await response.json())["backends"][0]["notes"]
    return notes

async def test_made_up_names_share_the_servers_one_pool(llama_sim: str) -> None:
    tenants = {"solo": {"api_keys": ["solo-key"], "max_active": 1}}
    async with running_gateway([{"name": "cpp", "kind": "llama-server", "url": llama_sim}], tenants=tenants) as url, \
            aiohttp.ClientSession() as http:
        chats = [{"model": f"invented-{i}", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
                 for i in range(4)]
        results = await asyncio.gather(*(_post(http, f"{url}/v1/chat/completions", chat, {"X-Api-Key": "solo-key"})
                                         for chat in chats))
        assert [status for status, _, _ in results] == [200] * 4
        waits = sorted(float(headers["X-Kvgate-Queue-Wait"]) for _, _, headers in results)
        assert waits[-1] > 0  # max_active = 1 held across the four names: they ran one after another
        names = [{"model": f"name-{i}", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}
                 for i in range(300)]
        for start in range(0, len(names), 50):
            await asyncio.gather(*(_post(http, f"{url}/v1/chat/completions", chat) for chat in names[start:start + 50]))
        async with http.get(f"{url}/kvgate/status") as response:
            status_json = await response.json()
        async with http.get(f"{url}/kvgate/metrics") as response:
            metrics = await response.text()
    pools = status_json["pools"]
    print(f"304 requests under 304 model names: {len(pools)} pool(s), metrics page {len(metrics):,} bytes")
    assert len(pools) == 1 and pools[0]["backend"] == "cpp"
    assert "invented-" not in metrics and "name-1" not in metrics
    assert len(metrics) < 64 * 1024


async def test_an_unknown_ollama_model_is_a_404_in_the_clients_format() -> None:
    async with running(FakeLLM()) as fake, running_gateway([{"name": "o", "url": fake.url}]) as url, \
            aiohttp.ClientSession() as http:
        before = len(fake.seen)
        chat = {"model": "nope:1b", "messages": [{"role": "user", "content": "hi"}]}
        status, payload, _ = await _post(http, f"{url}/api/chat", chat)
        assert status == 404 and payload["error"].startswith("model 'nope:1b' not found")
        assert "llama3.1:8b" in payload["error"]  # it names what the backend serves
        status, payload, _ = await _post(http, f"{url}/v1/chat/completions", {**chat, "model": "nope"})
        assert status == 404 and payload["error"]["type"] == "not_found_error"
        reached = [s.path_qs for s in fake.seen[before:] if s.path_qs not in ("/api/tags", "/api/ps")]
        assert reached == []  # neither chat reached Ollama, and no pool was probed for them


async def _post_text(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, str, dict[str, str]]:
    async with http.post(url, json=body) as response:
        return response.status, await response.text(), dict(response.headers)


@asynccontextmanager
async def _gateway_with_pools(
    backends: list[dict[str, Any]], **overrides: Any
) -> AsyncIterator[tuple[str, web.Application]]:
    """``running_gateway``, also handing back the app, whose PoolDirectory counts the probes it started."""
    app = create_app(load_settings(None, backends=backends, **overrides), refresh_models=False)
    runner, port = await start_server(app, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        await runner.cleanup()


async def test_a_backend_down_for_a_probe_is_waited_for_not_forwarded_unaccounted() -> None:
    """A backend that answered moments ago restarts: 20 requests wait for its pool (one shared probe, which waits
    through the restart), none is forwarded unaccounted, and once it is back 4 go on and 16 queue in kvgate. (A
    backend that never answered is down instead: 502 at once, tests/e2e/test_backend_down.py.)"""
    fake = FakeLLM(Script(chunks=2, hold_after_chunks=1))
    host, port = "127.0.0.1", free_port()
    backend = {"name": "cpp", "kind": "llama-server", "url": f"http://{host}:{port}", "unified_kv": False}
    first = web.AppRunner(fake.app())
    await first.setup()
    await web.TCPSite(first, host, port).start()
    async with _gateway_with_pools([backend], admission={"probe_wait_s": 20.0}) as (url, app), \
            aiohttp.ClientSession() as http:
        async with http.get(f"{url}/health") as up:
            assert up.status == 200  # the backend answered kvgate: from now on a refusal is a restart
        await first.cleanup()
        body = {"prompt": "hi", "n_predict": 4, "stream": True}
        requests = [asyncio.ensure_future(_post_text(http, f"{url}/completion", body)) for _ in range(20)]
        await until(lambda: app[POOLS].probes >= 1)
        await asyncio.sleep(0.3)  # the probe is refused, and waits for the restart
        assert not any(r.done() for r in requests) and app[POOLS].probes == 1  # one probe, shared by all 20
        runner = web.AppRunner(fake.app())
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        try:
            await until(lambda: _queued(http, url, 16))  # all 20 accounted for: 16 wait in kvgate, 4 went on

            def reached() -> list[Any]:
                return [s for s in fake.seen if s.path_qs == "/completion"]

            await until(lambda: len(reached()) >= 4)  # the 4 admitted are on their way (new connections)
            assert await _queued(http, url, 16)
            assert len(reached()) == 4  # the 4 slots /props reports, no more: the other 16 wait in kvgate
            fake.script.release.set()
            results = await asyncio.gather(*requests)
        finally:
            await runner.cleanup()
    assert [status for status, _, _ in results] == [200] * 20
    assert max(float(h["X-Kvgate-Queue-Wait"]) for _, _, h in results) > 0
    probes = [s for s in fake.seen if s.path_qs == "/props"]
    assert len(probes) <= 2  # one pool probe shared by all 20 (plus the counter's one look at the template)


async def test_openai_backends_are_admitted_when_their_layout_is_configured() -> None:
    fake = FakeLLM(Script(chunks=2, hold_after_chunks=1))
    async with running(fake):
        backend = {"name": "vllm", "kind": "openai", "url": fake.url, "parallel": 2, "context_tokens": 4096}
        async with running_gateway([backend]) as url, aiohttp.ClientSession() as http:
            body = {"model": "llama3.1:8b", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            requests = [asyncio.ensure_future(_post_text(http, f"{url}/v1/chat/completions", body))
                        for _ in range(4)]
            await until(lambda: _queued(http, url, 2))  # two wait in kvgate, so two went on
            assert len([s for s in fake.seen if s.path_qs == "/v1/chat/completions"]) == 2  # parallel = 2
            fake.script.release.set()
            results = await asyncio.gather(*requests)
    assert [status for status, _, _ in results] == [200] * 4
    assert all("max_tokens=" in h["X-Kvgate-Rewrite"] for _, _, h in results)  # told the limit it reserved
    assert all(orjson.loads(s.body)["max_tokens"] > 0 for s in fake.seen if s.path_qs == "/v1/chat/completions")


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


async def test_openai_backends_without_a_layout_say_they_are_not_admitted() -> None:
    records = _Records()
    logger = logging.getLogger("gateway.app")
    saved = (logger.disabled, logger.level)
    logger.disabled, logger.level = False, logging.WARNING  # whatever logging set-up an earlier test made
    logger.addHandler(records)
    async with running(FakeLLM()) as fake, \
            running_gateway([{"name": "vllm", "kind": "openai", "url": fake.url}]) as url, \
            aiohttp.ClientSession() as http:
        body = {"model": "llama3.1:8b", "messages": [{"role": "user", "content": "hi"}]}
        status, _, headers = await _post(http, f"{url}/v1/chat/completions", body)
        async with http.get(f"{url}/kvgate/status") as response:
            backends = (await response.json())["backends"]
    assert status == 200 and "X-Kvgate-Reserved-Tokens" not in headers
    assert "forwarded without admission" in backends[0]["notes"][0]
    logger.removeHandler(records)
    logger.disabled, logger.level = saved
    assert any("forwarded without admission" in message for message in records.messages)  # said at start-up too


OLLAMA_SIM = SimConfig(models=("llama3.1:8b",), num_parallel=1, load_s=0.05, time_scale=50.0,
                       min_response_tokens=2, max_response_tokens=4, gen_tokens_per_s=2000.0)
ALTERNATING: list[tuple[str, dict[str, Any]]] = [
    ("/api/chat", {"messages": [{"role": "user", "content": "a"}], "stream": False}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "b"}]}),
    ("/api/chat", {"messages": [{"role": "user", "content": "c"}], "stream": False, "options": {"num_ctx": 8192}}),
    ("/v1/completions", {"prompt": "d"}),
    ("/api/generate", {"prompt": "e", "stream": False, "options": {"num_ctx": 131072}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "f"}], "max_tokens": 8}),
    ("/api/chat", {"messages": [{"role": "user", "content": "g"}], "stream": False, "options": {"num_ctx": 2048}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "h"}]}),
]


@pytest.mark.parametrize("configured", [None, 8192])
async def test_one_context_per_model_whoever_asks(configured: int | None) -> None:
    runner, sim = await start_sim(OLLAMA_SIM)
    backend: dict[str, Any] = {"name": "sim", "kind": "ollama", "url": sim, "parallel": 1}
    if configured is not None:
        backend["context_tokens"] = configured  # disagrees with Ollama's own default (32K on this 24 GiB GPU)
    try:
        async with running_gateway([backend]) as url, aiohttp.ClientSession() as http:
            for _ in range(2):
                for path, body in ALTERNATING:
                    status, payload, _ = await _post(http, url + path, {"model": "llama3.1:8b", **body})
                    assert status == 200, (path, payload)
            async with http.get(f"{sim}/sim/stats") as response:
                stats = await response.json()
            async with http.get(f"{url}/kvgate/status") as response:
                notes = (await response.json())["backends"][0]["notes"]
    finally:
        await runner.cleanup()
    print(f"context_tokens={configured}: {stats['loads']} load(s) for {2 * len(ALTERNATING)} alternating requests;"
          f" notes: {notes}")
    if configured is None:
        assert stats["loads"] == 1 and notes == []
    else:
        # kvgate loaded it at the configured 8K; the first /v1 client reloaded it at Ollama's default; from then on
        # kvgate follows the loaded context instead of fighting it, and says so
        assert stats["loads"] == 2
        assert any("context_tokens = 8192" in note and "follows the loaded context" in note for note in notes)


async def test_a_configured_context_that_disagrees_with_the_loaded_one_is_reported_at_start_up() -> None:
    runner, sim = await start_sim(OLLAMA_SIM)
    backend = {"name": "sim", "kind": "ollama", "url": sim, "parallel": 1, "context_tokens": 8192}
    try:
        async with aiohttp.ClientSession() as http:
            await _post(http, f"{sim}/api/generate", {"model": "llama3.1:8b", "stream": False})  # loaded at 32K
            async with running_gateway([backend]) as url:
                notes = await until(lambda: _notes(http, url))  # the start-up check runs beside start-up
                for path, body in ALTERNATING:
                    status, payload, _ = await _post(http, url + path, {"model": "llama3.1:8b", **body})
                    assert status == 200, (path, payload)
            async with http.get(f"{sim}/sim/stats") as response:
                stats = await response.json()
    finally:
        await runner.cleanup()
    assert any("is loaded with 32768" in note for note in notes)  # before any request
    assert stats["loads"] == 1  # the loaded context was followed, not fought


async def test_n_completions_hold_n_sequences(llama_sim: str) -> None:
    async with running_gateway([{"name": "cpp", "kind": "llama-server", "url": llama_sim}]) as url, \
            aiohttp.ClientSession() as http:
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}
        status, _, one = await _post(http, f"{url}/v1/chat/completions", chat)
        status_two, _, two = await _post(http, f"{url}/v1/chat/completions", {**chat, "n": 2})
        status_many, payload, _ = await _post(http, f"{url}/v1/chat/completions", {**chat, "n": 8})
    assert (status, status_two) == (200, 200)
    assert int(two["X-Kvgate-Reserved-Tokens"]) == 2 * int(one["X-Kvgate-Reserved-Tokens"])
    assert status_many == 400 and payload["error"]["code"] == "too_many_sequences"
    assert "8 completions (n)" in payload["error"]["message"] and "at most 4 sequences" in payload["error"]["message"]


async def test_a_tenants_output_cap_holds_whatever_field_carries_the_limit(llama_sim: str) -> None:
    tenants = {"ci": {"api_keys": ["ci-key"], "max_output_tokens": 128}}
    async with running_gateway([{"name": "cpp", "kind": "llama-server", "url": llama_sim}], tenants=tenants) as url, \
            aiohttp.ClientSession() as http:
        for body in ({"prompt": "hi", "max_tokens": 16, "n_predict": 3000}, {"prompt": "hi", "n_predict": -1},
                     {"prompt": "hi"}, {"prompt": "hi", "max_completion_tokens": 5000}):
            status, payload, headers = await _post(http, f"{url}/completion", body, {"X-Api-Key": "ci-key"})
            assert status == 200, payload
            assert payload["tokens_predicted"] <= 128, (body, payload["tokens_predicted"])
            assert int(headers["X-Kvgate-Reserved-Tokens"]) <= int(headers["X-Kvgate-Prompt-Tokens"]) + 128
            assert "=128 (was " in headers["X-Kvgate-Rewrite"]  # the field the backend obeys now says 128
