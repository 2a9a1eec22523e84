"""Issue 24, point 5: one error boundary. Every error kvgate answers itself (a key no tenant has, an operator route
without the admin key, a refused reload, a method a route does not take, an odd target, an odd Expect, a model no
backend has) is a JSON body in the route's own dialect, with its status and, where it has one, the setting it names
(``param``) and ``Retry-After``. The bodies were built in nine places before (the admin check and the reload by
hand); the refactor keeps every answer as it was, and this matrix (printed) pins them."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from tests.support.fake_backend import FakeLLM, running
from tests.support.gateway_server import running_gateway

ADMIN = "admin-key-0123456789"
TENANT_KEY = "tenant-key-0123456789"


def _shape(body: bytes) -> str:
    """Which dialect's error object the body is: Ollama's {"error": "..."}, OpenAI's {"error": {"message", "type",
    "param", "code"}}, llama-server's {"error": {"code": <int>, "message", "type"}}."""
    data = json.loads(body)
    error = data.get("error")
    if isinstance(error, str):
        return "ollama"
    if isinstance(error, dict) and isinstance(error.get("code"), int):
        return "llama-server"
    if isinstance(error, dict) and {"message", "type", "param", "code"} <= set(error):
        return "openai"
    return "unknown"


async def _raw(port: int, head: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), timeout=5)
        headers = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
        length = int(next(line.split(b":", 1)[1] for line in headers.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        return int(status_line.split()[1]), await asyncio.wait_for(reader.readexactly(length), timeout=5)
    finally:
        writer.close()


async def test_every_error_kvgate_answers_is_in_the_routes_dialect() -> None:
    async with running(FakeLLM()) as fake, running_gateway(
        [{"name": "ollama", "kind": "ollama", "url": fake.url}],
        server={"admin_key": ADMIN}, tenants={"team": {"api_keys": [TENANT_KEY]}},
    ) as url:
        port = int(url.rsplit(":", 1)[1])
        chat: dict[str, Any] = {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}
        cases: list[tuple[str, str, str, dict[str, str], Any, int, str]] = [
            # (what, method, path, headers, json body, status, dialect)
            ("unknown key, kvgate route", "POST", "/kvgate/count", {"Authorization": "Bearer nope"}, chat, 401,
             "openai"),
            ("no admin key, status", "GET", "/kvgate/status", {}, None, 403, "openai"),
            ("no admin key, metrics", "GET", "/kvgate/metrics", {"Authorization": f"Bearer {TENANT_KEY}"}, None,
             403, "openai"),
            ("reload with no source", "POST", "/kvgate/reload", {"Authorization": f"Bearer {ADMIN}"}, None, 400,
             "openai"),
            ("method not allowed", "GET", "/kvgate/count", {"Authorization": f"Bearer {TENANT_KEY}"}, None, 405,
             "openai"),
            ("management without admin", "POST", "/api/pull", {"Authorization": f"Bearer {TENANT_KEY}"},
             {"model": "x"}, 403, "ollama"),
            ("unknown model, Ollama", "POST", "/api/chat", {"Authorization": f"Bearer {TENANT_KEY}"}, chat, 404,
             "ollama"),
            ("unknown model, OpenAI", "POST", "/v1/chat/completions", {"Authorization": f"Bearer {TENANT_KEY}"},
             chat, 404, "openai"),
        ]
        rows: list[tuple[str, str, tuple[int, str, str], Any]] = []
        async with aiohttp.ClientSession() as http:
            for what, method, path, headers, body, status, dialect in cases:
                async with http.request(method, f"{url}{path}", headers=headers, json=body) as response:
                    raw = await response.read()
                    got = (response.status, response.content_type, _shape(raw) if raw[:1] == b"{" else "text")
                    rows.append((what, f"{method} {path}", got, json.loads(raw)["error"] if raw[:1] == b"{" else {}))
                    assert got == (status, "application/json", dialect), (what, got, raw[:200])
                    if status == 405:
                        assert response.headers["Allow"] == "POST"
        for what, head, dialect in [
            ("odd target", b"GET http://evil/api/tags HTTP/1.1\r\nHost: x\r\n\r\n", "ollama"),
            ("odd Expect", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 200-ok\r\n"
                           b"Content-Length: 2\r\n\r\n", "openai"),
            ("CONNECT, kvgate route", b"CONNECT /kvgate/count?route=/api/chat HTTP/1.1\r\nHost: x\r\n\r\n",
             "openai"),  # found by the fuzzer: matched no route, so no path; rendered by its raw target
            ("CONNECT, Ollama route", b"CONNECT /api/tags HTTP/1.1\r\nHost: x\r\n\r\n", "ollama"),
        ]:
            status, raw = await _raw(port, head)
            rows.append((what, head.split(b"\r\n")[0].decode(), (status, "application/json", _shape(raw)),
                         json.loads(raw)["error"]))
            assert status in (400, 404, 405, 417) and _shape(raw) == dialect, (what, status, raw[:200])
        print("\n" + "\n".join(f"  {what:<26} {request:<34} {got}  {str(error)[:70]}" for what, request, got, error
                                 in rows))
        reload_error = next(error for what, _, _, error in rows if what == "reload with no source")
        assert reload_error["code"] == "invalid_config"
        admin_error = next(error for what, _, _, error in rows if what == "no admin key, status")
        assert admin_error["type"] == "permission_error" and admin_error["code"] == "admin_only"
