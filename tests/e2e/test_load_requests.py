"""Issue 23, point 4d: Ollama's load and unload requests (``/api/generate`` with no prompt, ``/api/chat`` with
``messages: []``, ``keep_alive: 0``) go through the load gate like a load a request causes, and a client's
``keep_alive`` 0 or negative is the admin's only (``residency.client_keep_alive``, default "strip").

kvgate in front of the simulated Ollama (24 GiB GPU; its exporter is the ``vram`` source); the simulator's own
counters (/sim/stats) are the truth. Before the fix: a plain client's load request went straight to Ollama (with a
foreign process on the GPU: 500 ``cudaMalloc failed``), and 5 chats with ``keep_alive: 0`` caused 5 loads."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.test_load_admission import backend_for, call, chat, foreign, resident, simulator, stats
from tests.support.gateway_server import running_gateway

ADMIN_KEY = "admin-key-0123456789"


async def test_five_keep_alive_zero_chats_load_the_model_once() -> None:
    async with simulator() as sim, running_gateway([backend_for(sim)]) as url:
        rows = []
        for _ in range(5):
            status, headers, _ = await chat(url, "llama3.1:8b", keep_alive=0)
            rows.append((status, headers.get("X-Kvgate-Keep-Alive")))
        counted = await stats(sim)
        print(f"\n5 chats with keep_alive 0: {counted['loads']} loads, {counted['unloads']} unloads; {rows[0]}")
        assert [status for status, _ in rows] == [200] * 5
        assert counted["loads"] == 1 and counted["unloads"] == 0  # before the fix: 5 loads
        assert rows[0][1] is not None and "stripped keep_alive 0" in rows[0][1]
        assert "llama3.1:8b" in await resident(sim)


async def test_keep_alive_zero_on_embed_is_stripped_too() -> None:
    """/api/embed reads keep_alive like chat and generate (facts/ollama.md, section 5): 3 embeds with keep_alive 0
    load the model once and unload it never."""
    async with simulator() as sim, running_gateway([backend_for(sim)]) as url:
        rows = [await call(url, "POST", "/api/embed", {"model": "llama3.1:8b", "input": "hi", "keep_alive": 0})
                for _ in range(3)]
        counted = await stats(sim)
        print(f"\n3 embeds with keep_alive 0: {counted['loads']} loads, {counted['unloads']} unloads")
        assert [status for status, _, _ in rows] == [200] * 3, rows[0]
        assert counted["loads"] == 1 and counted["unloads"] == 0
        assert all("stripped keep_alive 0" in headers.get("X-Kvgate-Keep-Alive", "") for _, headers, _ in rows)


@pytest.mark.parametrize(("path", "body"), [
    ("/api/generate", {"model": "llama3.1:8b"}),
    ("/api/chat", {"model": "llama3.1:8b", "messages": []}),
], ids=["generate", "chat"])  # fmt: skip
async def test_a_load_request_meets_the_gpu_check(path: str, body: dict[str, Any]) -> None:
    async with simulator(llama_fit=False) as sim, \
            running_gateway([{**backend_for(sim), "cpu_offload": "off"}]) as url:
        await foreign(sim, 20)  # 20 GiB of 24 held by another process
        failures = (await stats(sim))["load_failures"]
        status, headers, answer = await call(url, "POST", path, {**body, "stream": False})
        print(f"\n{path} load request beside a 20 GiB process: {status} {str(answer)[:120]}")
        assert status == 503, answer  # before the fix: Ollama's own 500 cudaMalloc failed
        assert "gpu memory" in answer["error"].lower() or "bytes of GPU memory" in answer["error"]
        assert int(headers["Retry-After"]) >= 1
        assert (await stats(sim))["load_failures"] == failures  # Ollama never tried


async def test_a_load_request_loads_through_the_gate_at_the_pinned_context() -> None:
    async with simulator() as sim, running_gateway([backend_for(sim)]) as url:
        status, _, answer = await call(url, "POST", "/api/generate", {"model": "llama3.1:8b", "stream": False})
        assert status == 200 and answer.get("done") is True, answer
        context = (await resident(sim))["llama3.1:8b"]
        # a client's load at another context would make Ollama reload it: the context is pinned to the loaded one
        status, _, _ = await call(url, "POST", "/api/generate", {"model": "llama3.1:8b", "stream": False,
                                                                 "options": {"num_ctx": 2048}})
        assert status == 200
        assert (await resident(sim))["llama3.1:8b"] == context and (await stats(sim))["loads"] == 1


async def test_an_unload_request_is_the_admins_only() -> None:
    async with simulator() as sim, running_gateway([backend_for(sim)], server={"admin_key": ADMIN_KEY}) as url:
        assert (await chat(url, "llama3.1:8b"))[0] == 200
        unload = {"model": "llama3.1:8b", "keep_alive": 0, "stream": False}
        status, headers, _ = await call(url, "POST", "/api/generate", unload)
        assert status == 200 and "stripped keep_alive 0" in headers["X-Kvgate-Keep-Alive"]
        assert "llama3.1:8b" in await resident(sim) and (await stats(sim))["unloads"] == 0
        status, headers = await _admin_post(url, "/api/generate", unload)
        assert status == 200 and "X-Kvgate-Keep-Alive" not in headers
        assert await resident(sim) == {}  # the admin's unload goes through


async def test_refuse_answers_400_naming_the_setting() -> None:
    async with simulator() as sim, running_gateway([backend_for(sim)],
                                                   residency={"client_keep_alive": "refuse"}) as url:
        status, _, answer = await chat(url, "llama3.1:8b", keep_alive="-1m")
        assert status == 400 and 'residency.client_keep_alive = "refuse"' in answer["error"]
        assert (await stats(sim))["requests"] == 0


async def _admin_post(url: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str]]:
    import aiohttp

    async with aiohttp.ClientSession() as http, http.post(f"{url}{path}", json=body,
                                                          headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as r:
        await r.read()
        return r.status, dict(r.headers)


@pytest.mark.parametrize("tenants", [{}, {"ci": {"api_keys": ["ci-key-0123456789"], "max_output_tokens": 8}}],
                         ids=["no-tenants", "tenants"])
async def test_the_admins_keep_alive_passes_and_the_admin_key_stays_in_kvgate(tenants: dict[str, Any]) -> None:
    """The admin key on a chat is the admin's, not an unknown tenant key (no 401 once tenants have keys), and it is
    never sent on to the backend (with no tenants, a client's own key would be)."""
    from tests.support.fake_backend import FakeLLM, running

    async with running(FakeLLM()) as fake, running_gateway(
            [{"name": "f", "url": fake.url}], tenants=tenants, server={"admin_key": ADMIN_KEY}) as url:
        body = {"model": "llama3.1:8b", "stream": False, "keep_alive": 0,
                "messages": [{"role": "user", "content": "hi"}]}
        status, headers = await _admin_post(url, "/api/chat", body)
        assert status == 200 and "X-Kvgate-Keep-Alive" not in headers
        seen = fake.requests_to("/api/chat")[-1]
        assert "Authorization" not in seen.headers and ADMIN_KEY not in str(seen.headers)
        assert b'"keep_alive":0' in seen.body.replace(b" ", b"")
