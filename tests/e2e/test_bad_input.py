"""Bad input gets a 4xx in the client's own dialect, naming the field or the limit."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from tests.support.fake_backend import FakeLLM, running
from tests.support.gateway_server import running_gateway


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[str, FakeLLM]]:
    async with running(FakeLLM()) as fake, running_gateway(
        [{"name": "gpu0", "url": fake.url}], server={"max_body_bytes": 4096}
    ) as url:
        yield url, fake


def _message(path: str, body: dict[str, Any]) -> str:
    if path.startswith("/api/"):
        assert set(body) == {"error"}
        return str(body["error"])
    if path == "/v1/messages":
        assert body["type"] == "error"
        return str(body["error"]["message"])
    error = body["error"]
    if path.startswith("/v1/") and path != "/v1/chat/completions/input_tokens":
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "invalid_request_error"
    else:
        assert set(error) == {"code", "message", "type"} and error["code"] in (400, 413)
    return str(error["message"])


CASES = [
    ("/api/chat", b'{"model": "m", "messages": [', "not valid JSON"),
    ("/api/chat", b'{"model": "m", "messages": "hi"}', "field 'messages' must be an array, got string"),
    ("/api/chat", b'{"model": "m", "options": {"num_ctx": "8192"}}', "field 'options.num_ctx' must be an integer"),
    ("/api/chat", b'{"messages": []}', "field 'model' is required"),
    ("/api/generate", b'{"model": "m", "prompt": 5}', "field 'prompt' must be a string, got integer"),
    ("/api/generate", b'{"model": "m", "stream": "yes"}', "field 'stream' must be a boolean"),
    ("/api/embed", b'{"input": "x"}', "field 'model' is required"),
    ("/api/show", b'[]', "must be a JSON object"),
    ("/v1/chat/completions", b'{"model": "m"}', "field 'messages' is required"),
    ("/v1/chat/completions", b'{"model": "m", "messages": [1]}', "field 'messages[0]' must be an object"),
    ("/v1/chat/completions", b'{"model": "m", "messages": [], "max_tokens": "9"}', "field 'max_tokens'"),
    ("/v1/completions", b'{"model": 7, "prompt": "x"}', "field 'model' must be a string, got integer"),
    ("/v1/messages", b'{"model": "m", "messages": {}}', "field 'messages' must be an array, got object"),
    ("/completion", b'{"prompt": {"a": 1}}', "field 'prompt' must be a string or an array"),
    ("/v1/chat/completions/input_tokens", b'{}', "field 'messages' is required"),
    ("/api/chat", b"", "missing request body"),
]


@pytest.mark.parametrize(("path", "raw", "expected"), CASES)
async def test_invalid_bodies_get_400_naming_the_field(
    gateway: tuple[str, FakeLLM], path: str, raw: bytes, expected: str
) -> None:
    url, fake = gateway
    async with aiohttp.ClientSession() as http, http.post(url + path, data=raw) as response:
        assert response.status == 400
        body = orjson.loads(await response.read())
    assert expected in _message(path, body)
    assert fake.seen == []


@pytest.mark.parametrize("path", ["/api/chat", "/v1/chat/completions", "/completion"])
@pytest.mark.parametrize("chunked", [False, True])
async def test_body_over_the_limit_gets_413(gateway: tuple[str, FakeLLM], path: str, chunked: bool) -> None:
    url, fake = gateway
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 5000}], "prompt": "p"})

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(raw), 1000):
            yield raw[start : start + 1000]

    async with aiohttp.ClientSession() as http, http.post(url + path, data=chunks() if chunked else raw) as response:
        assert response.status == 413
        message = _message(path, orjson.loads(await response.read()))
    assert "4,096" in message and "max_body_bytes" in message
    assert fake.seen == []


async def test_upload_routes_are_not_limited_and_stream_through(gateway: tuple[str, FakeLLM]) -> None:
    url, fake = gateway
    blob = bytes(range(256)) * 100
    async with aiohttp.ClientSession() as http, http.post(f"{url}/api/blobs/sha256:abc", data=blob) as response:
        assert response.status == 201
    assert fake.seen[-1].body == blob


LONE_SURROGATES = [  # JSON allows escapes of lone surrogates; they are not UTF-8, and every one of these was a 500
    ("/v1/responses", b'{"model": "llama3.1:8b", "input": [{"type": "function_call_output", "call_id": "x", '
                      b'"output": {"a": "\\udc98"}}]}'),
    ("/v1/responses", b'{"model": "llama3.1:8b", "input": [{"type": "weird", "x": "\\udc98"}]}'),
    ("/v1/chat/completions", b'{"model": "llama3.1:8b", "messages": [{"role": "user", "content": "a\\udc98b"}]}'),
    ("/v1/chat/completions", b'{"model": "llama3.1:8b", "stream": true, "messages": [{"role": "system", '
                             b'"content": "\\ud800"}, {"role": "user", "content": "x"}]}'),
    ("/api/chat", b'{"model": "llama3.1:8b", "stream": false, "messages": [{"role": "user", "content": "\\udfff"}]}'),
    ("/api/generate", b'{"model": "llama3.1:8b", "prompt": "\\ud800 hi", "stream": false}'),
    ("/v1/messages", b'{"model": "llama3.1:8b", "max_tokens": 5, "system": "\\udc98", "messages": [{"role": "user", '
                     b'"content": [{"type": "tool_result", "tool_use_id": "a", "content": {"x": "\\udc98"}}]}]}'),
]


@pytest.mark.parametrize(("path", "body"), LONE_SURROGATES)
async def test_lone_surrogates_in_any_field_are_answered_not_a_500(
    gateway: tuple[str, FakeLLM], path: str, body: bytes,
) -> None:
    url, _ = gateway
    async with aiohttp.ClientSession() as http, http.post(
        url + path, data=body, headers={"Content-Type": "application/json"}
    ) as response:
        text = await response.text()
        assert response.status == 200, text
