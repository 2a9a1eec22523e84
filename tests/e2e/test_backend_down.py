"""Issue 22 point 4: a dead backend (connection refused) answers at once, a restarting one is waited for.

"Up" is tracked per backend in one place (gateway/backends/liveness.py, kept by its client): a backend that
answered any call or request within ``admission.probe_wait_s`` is restarting, and a request waits for it as
before (the pool probe, the count and the forward all go through the same rule); one that did not is down, and
the request gets a 502 at once, in its dialect, naming the backend and the reason, as nginx would answer.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from tests.support.fake_backend import FakeLLM, Script
from tests.support.fake_vllm import FakeVllm
from tests.support.gateway_server import running_gateway
from tests.support.llama_server import free_port

CHAT = [{"role": "user", "content": "hi"}]
ROUTES: list[tuple[str, str, dict[str, Any]]] = [  # (dialect, path, body)
    ("ollama", "/api/chat", {"model": "m", "messages": CHAT}),
    ("ollama", "/api/generate", {"model": "m", "prompt": "hi"}),
    ("openai", "/v1/chat/completions", {"model": "m", "messages": CHAT}),
    ("openai", "/v1/completions", {"model": "m", "prompt": "hi"}),
    ("openai", "/v1/responses", {"model": "m", "input": "hi"}),
    ("anthropic", "/v1/messages", {"model": "m", "max_tokens": 8, "messages": CHAT}),
    ("llama-server", "/completion", {"model": "m", "prompt": "hi"}),
    ("llama-server", "/chat/completions", {"model": "m", "messages": CHAT}),
    ("llama-server", "/infill", {"model": "m", "input_prefix": "def f(", "input_suffix": ")"}),
]
KINDS = ("ollama", "llama-server", "openai")


def _message(dialect: str, body: Any) -> str:
    if dialect == "ollama":
        return str(body["error"])
    return str(body["error"]["message"])


def _backend(kind: str, url: str) -> dict[str, Any]:
    extra = {"parallel": 2, "context_tokens": 4096} if kind == "openai" else {}
    return {"name": "gone", "kind": kind, "url": url, **extra}


async def test_a_port_nothing_listens_on_answers_502_at_once_on_every_dialect() -> None:
    """Every backend kind, every KV route: 502 in the route's format, naming the backend and the refusal, in far less
    than ``probe_wait_s`` (10 s, the default); the table shows each time."""
    url = f"http://127.0.0.1:{free_port()}"
    rows = []
    async with aiohttp.ClientSession() as http:
        for kind in KINDS:
            async with running_gateway([_backend(kind, url)]) as gateway:
                for dialect, path, body in ROUTES:
                    started = time.monotonic()
                    async with http.post(f"{gateway}{path}", json=body) as response:
                        answer = orjson.loads(await response.read())
                        elapsed_s = time.monotonic() - started
                    rows.append((kind, path, response.status, elapsed_s, _message(dialect, answer)))
    print(f"\n{'backend':13s} {'route':22s} status  seconds  message")
    for kind, path, status, elapsed_s, message in rows:
        print(f"{kind:13s} {path:22s} {status:6d} {elapsed_s:8.3f}  {message[:100]}")
    assert {status for _, _, status, _, _ in rows} == {502}
    assert all("backend 'gone'" in message for *_, message in rows)
    assert all("Connect call failed" in message or "refused" in message for *_, message in rows)
    assert max(elapsed_s for _, _, _, elapsed_s, _ in rows) < 5.0  # not held for probe_wait_s (10 s)


def _fake_for(kind: str) -> web.Application:
    if kind == "openai":
        return FakeVllm(model="m").app()
    return FakeLLM(Script(models=("m",))).app()


async def _serve_on(app: web.Application, port: int) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


V1_CHAT = ("/v1/chat/completions", {"model": "m", "messages": CHAT, "max_tokens": 4})
API_CHAT = ("/api/chat", {"model": "m", "messages": CHAT, "stream": False})


@pytest.mark.parametrize(("kind", "path", "body"), [
    ("ollama", *API_CHAT), ("ollama", *V1_CHAT), ("llama-server", *V1_CHAT), ("llama-server", "/completion",
                                                                                {"prompt": "hi", "n_predict": 4}),
    ("openai", *V1_CHAT),  # no pool probe here: the count and the forward wait for the restart
], ids=["ollama-api", "ollama-v1", "llama-server-v1", "llama-server-native", "openai-v1"])
async def test_a_backend_up_moments_ago_that_restarts_within_probe_wait_s_completes_the_request(
    kind: str, path: str, body: dict[str, Any]
) -> None:
    """The backend answered a request, then stops (a restart); a request sent meanwhile waits, and completes once
    the backend listens again, within probe_wait_s."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    runner = await _serve_on(_fake_for(kind), port)
    async with running_gateway([_backend(kind, url)], admission={"probe_wait_s": 10.0, "pool_refresh_s": 0.05}) \
            as gateway, aiohttp.ClientSession() as http:
        async with http.post(f"{gateway}{path}", json=body) as response:
            assert response.status == 200, await response.text()
        await runner.cleanup()  # the backend goes away: connections are refused now
        await asyncio.sleep(0.15)  # 3x pool_refresh_s: the pool's layout is stale, the next request probes or forwards

        async def send() -> tuple[int, float]:
            started = time.monotonic()
            async with http.post(f"{gateway}{path}", json=body) as answer:
                await answer.read()
                return answer.status, time.monotonic() - started

        waiting = asyncio.ensure_future(send())
        await asyncio.sleep(0.6)  # the restart takes this long
        assert not waiting.done()  # it waits for the restart: not a 502
        runner = await _serve_on(_fake_for(kind), port)  # back on the same port
        try:
            status, waited_s = await asyncio.wait_for(waiting, 15)
        finally:
            await runner.cleanup()
    print(f"\n{kind} {path}: restarted after 0.6 s; the request waited {waited_s:.2f} s and got {status}")
    assert status == 200 and waited_s >= 0.6


async def test_after_probe_wait_s_without_an_answer_a_backend_is_down() -> None:
    """A backend that answered, then stays gone: a request right after waits through the restart window
    (probe_wait_s) and then gets the backend's refusal (502; or 503 while its pool could not be learned); once the
    backend has not answered for probe_wait_s, the next request gets a 502 at once."""
    port, probe_wait_s = free_port(), 0.5
    runner = await _serve_on(FakeLLM(Script(models=("m",))).app(), port)
    body = {"prompt": "hi", "n_predict": 4}
    async with running_gateway([_backend("llama-server", f"http://127.0.0.1:{port}")],
                               admission={"probe_wait_s": probe_wait_s, "pool_refresh_s": 0.01}) as gateway, \
            aiohttp.ClientSession() as http:
        async with http.post(f"{gateway}/completion", json=body) as response:
            assert response.status == 200
        await runner.cleanup()
        answers = []
        for pause_s in (0.05, 3 * probe_wait_s):  # well within the restart window, then 3x past it
            await asyncio.sleep(pause_s)  # time without an answer from the backend is what is tested
            started = time.monotonic()
            async with http.post(f"{gateway}/completion", json=body) as response:
                said = orjson.loads(await response.read())["error"]["message"]
                answers.append((response.status, time.monotonic() - started, said))
    print("\n" + "\n".join(f"{status} after {waited_s:.2f} s: {said[:120]}" for status, waited_s, said in answers))
    (first, first_s, _), (second, second_s, said) = answers
    assert first in (502, 503) and first_s >= 0.3  # waited for a restart that did not come
    assert second == 502 and second_s < 0.3 and "backend 'gone'" in said and "Connect call failed" in said
