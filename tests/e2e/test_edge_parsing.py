"""Issue 23, point 2: a bound on what parsing a body may build (``server.max_json_elements``, counted on the bytes
before parsing), and large bodies parsed off the event loop."""

from __future__ import annotations

import threading
from typing import Any

import aiohttp
import pytest

from gateway.edge.body.json_bound import decode_bounded, json_elements
from gateway.errors import PayloadTooLarge
from tests.support.fake_backend import FakeLLM, running
from tests.support.gateway_server import running_gateway

LIMIT = 1000
MODEL = "llama3.1:8b"


def _chat(extra_elements: int) -> bytes:
    """A chat whose body carries ``extra_elements`` empty objects in an unknown field: ``[{}, {}, ...]``."""
    head = '{"model": "' + MODEL + '", "stream": false, "messages": [{"role": "user", "content": "hi"}], "x": ['
    return (head + ", ".join(["{}"] * extra_elements) + "]}").encode()


@pytest.mark.parametrize(("path", "dialect"), [("/api/chat", "ollama"), ("/v1/chat/completions", "openai"),
                                               ("/kvgate/count?route=/api/chat", "openai")])
async def test_a_body_over_max_json_elements_is_413_naming_the_limit_and_the_value(path: str, dialect: str) -> None:
    async with running(FakeLLM()) as fake, running_gateway(
        [{"name": "ollama", "kind": "ollama", "url": fake.url}], server={"max_json_elements": LIMIT},
    ) as url, aiohttp.ClientSession() as http:
        rows = []
        for n in (10, LIMIT, 5 * LIMIT):
            body = _chat(n)
            async with http.post(f"{url}{path}", data=body, headers={"Content-Type": "application/json"}) as resp:
                answer: Any = await resp.json()
                rows.append((n, json_elements(body), resp.status, answer))
        print(f"\n{path}: " + "; ".join(f"[{{}}] x {n}: {elements} elements -> {status}"
                                        for n, elements, status, _ in rows))
        assert [status for *_, status, _ in rows] == [200, 413, 413]
        _, elements, _, answer = rows[-1]
        message = answer["error"] if dialect == "ollama" else answer["error"]["message"]
        assert "server.max_json_elements" in message and f"{LIMIT:,}" in message and f"{elements:,}" in message
        assert not any(seen.path_qs == path and len(seen.body) > 5 * LIMIT for seen in fake.seen)


def test_elements_are_counted_on_the_bytes() -> None:
    assert json_elements(b'{"a": [1, 2, {"b": "x,y"}]}') == 6  # { [ , , { and the comma inside the string
    assert json_elements(b"") == 0


async def test_large_bodies_are_parsed_off_the_event_loop() -> None:
    seen: list[bool] = []

    def decode(raw: bytes) -> dict[str, Any]:
        seen.append(threading.current_thread() is threading.main_thread())
        return {"n": len(raw)}

    assert await decode_bounded(b"{}", max_elements=10, thread_above_bytes=100, decode=decode) == {"n": 2}
    big = b'{"a": "' + b"x" * 200 + b'"}'
    assert await decode_bounded(big, max_elements=10, thread_above_bytes=100, decode=decode) == {"n": len(big)}
    assert seen == [True, False]
    with pytest.raises(PayloadTooLarge):
        await decode_bounded(b"[" * 11, max_elements=10, thread_above_bytes=100, decode=decode)
    assert len(seen) == 2  # refused before parsing
