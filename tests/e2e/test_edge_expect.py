"""Issue 23, point 2: an odd ``Expect`` header is a 417 in the route's dialect on any route, never a 500."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway.edge.expect import expect_problem
from tests.support.fake_backend import FakeLLM, running
from tests.support.gateway_server import running_gateway

BODY = json.dumps({"model": "llama3.1:8b", "messages": [{"role": "user", "content": "hi"}], "stream": False}).encode()
CASES = [  # (method, path, Expect value)
    ("POST", "/api/chat", b"\xff100-continue"),
    ("POST", "/v1/chat/completions", b"caf\xc3\xa9"),
    ("GET", "/kvgate/health", b"\x80"),
    ("GET", "/kvgate/status", b"\xfe\xff"),
    ("GET", "/no/such/route", b"\xc3"),
    ("POST", "/api/chat", b"200-ok"),
    ("POST", "/completion", b"100-continue, \xff"),
]


async def _exchange(port: int, method: str, path: str, expect: bytes, body: bytes) -> tuple[bytes, bytes]:
    """Send the headers; answer a 100 Continue with the body; the first status line and the rest of the reply."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n".encode()
                     + b"Content-Length: %d\r\nExpect: %s\r\nConnection: close\r\n\r\n" % (len(body), expect))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
        if head.startswith(b"HTTP/1.1 100"):
            writer.write(body)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
        length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        return head, await asyncio.wait_for(reader.readexactly(length), timeout=5)
    finally:
        writer.close()


async def test_odd_expect_is_417_on_every_route_and_100_continue_still_works() -> None:
    async with running(FakeLLM()) as fake, running_gateway(
        [{"name": "ollama", "kind": "ollama", "url": fake.url}],
    ) as url:
        port = int(url.rsplit(":", 1)[1])
        rows = []
        for method, path, expect in CASES:
            head, rest = await _exchange(port, method, path, expect, BODY if method == "POST" else b"")
            rows.append((method, path, expect, head.split(b"\r\n", 1)[0].decode(), rest))
        print("\nodd Expect values:")
        for method, path, expect, status, rest in rows:
            print(f"  {method:4} {path:22} Expect {expect!r:26} -> {status}  {rest[:100]!r}")
        for _, path, expect, status, rest in rows:
            assert status.startswith("HTTP/1.1 417"), (path, expect, status, rest)
            error = json.loads(rest)["error"]
            message = error if isinstance(error, str) else error["message"]
            assert "Expect" in message and "100-continue" in message
        assert isinstance(json.loads(rows[0][4])["error"], str)  # Ollama's dialect on /api/*
        assert json.loads(rows[1][4])["error"]["code"] == "expectation_failed"  # OpenAI's on /v1/*
        head, rest = await _exchange(port, "POST", "/api/chat", b"100-Continue", BODY)
        assert head.startswith(b"HTTP/1.1 200"), head
        head, _ = await _exchange(port, "GET", "/kvgate/health", b"100-continue", b"")
        assert head.startswith(b"HTTP/1.1 200"), head


@pytest.mark.parametrize("value", ["100-continue", "100-CONTINUE", " 100-continue "])
def test_expect_continue_values_are_accepted(value: str) -> None:
    assert expect_problem(value) is None
    assert expect_problem(value + "x") is not None
