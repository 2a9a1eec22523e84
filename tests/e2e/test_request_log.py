"""Each proxied request ends with one JSON log line that says what kvgate did, and no line ever holds a key or a
prompt unless ``server.log_contents`` is on (issue 15, point 3).

A real kvgate with ``log_format = "json"`` in front of the fake Ollama gets a matrix of requests: admitted, refused
(the tenant's prompt cap), trimmed (history longer than the context), a bad key (401), streamed, and a client that
leaves mid-stream. Every record any logger writes meanwhile is formatted as kvgate formats it and searched.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from gateway.observability.logs import JsonFormatter, RequestIdFilter
from tests.support.exact_count import exact_counting
from tests.support.fake_backend import FakeLLM, running
from tests.support.gateway_server import running_gateway
from tests.support.poll import until

KEY = "kvg-team-key-3f9a1c77e2b4d6a8"
TIGHT_KEY = "kvg-tight-key-0b1d2e3f4a5b6c7d"
BAD_KEY = "kvg-not-a-key-9e8d7c6b5a4f3e2d"
ADMIN_KEY = "kvg-admin-key-a1b2c3d4e5f6a7b8"
SECRET = "PROMPT-SECRET-hunter2-7d41"
"""In the last user message of every request: never logged unless log_contents is on."""
OLD_SECRET = "HISTORY-SECRET-swordfish-55c0"
FIELDS = ("request_id", "tenant", "model", "backend", "decision", "status", "duration_ms")


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.addFilter(RequestIdFilter())
        self.setFormatter(JsonFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))

    def requests(self) -> list[dict[str, Any]]:
        """The request lines: those of gateway.proxy that carry a status."""
        entries = [json.loads(line) for line in self.lines]
        return [entry for entry in entries if entry["logger"] == "gateway.proxy" and "status" in entry]


@pytest.fixture
def captured() -> Iterator[_Lines]:
    handler = _Lines()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


@pytest.fixture
async def fake() -> AsyncIterator[FakeLLM]:
    async with running(FakeLLM()) as server:
        yield server


def _chat(content: str, *, stream: bool = False, history: int = 0) -> dict[str, Any]:
    old = [{"role": "user" if i % 2 == 0 else "assistant",
            "content": f"{OLD_SECRET} " + " ".join(f"word{i}x{j}" for j in range(2500))} for i in range(history)]
    return {"model": "llama3.1:8b", "stream": stream, "messages": [*old, {"role": "user", "content": content}]}


async def _matrix(gateway: str, fake: FakeLLM) -> dict[str, int]:
    """Send every kind of request once; the statuses, by kind."""
    statuses: dict[str, int] = {}
    team = {"Authorization": f"Bearer {KEY}"}
    async with aiohttp.ClientSession() as http:
        cases: list[tuple[str, dict[str, Any], dict[str, str]]] = [
            ("ok", _chat(f"hello {SECRET}"), team),
            ("refused", _chat(f"too long for the tight tenant {SECRET} " * 5), {"X-Api-Key": TIGHT_KEY}),
            ("trimmed", _chat(f"and now {SECRET}", history=6), team),
            ("bad_key", _chat(f"hello {SECRET}"), {"Authorization": f"Bearer {BAD_KEY}"}),
            ("streamed", _chat(f"stream {SECRET}", stream=True), team),
        ]
        for name, body, headers in cases:
            async with http.post(f"{gateway}/api/chat", json=body, headers=headers) as response:
                await response.read()
                statuses[name] = response.status
        fake.script.stall_after_chunks = 1
        response = await http.post(f"{gateway}/api/chat", json=_chat(f"leave {SECRET}", stream=True), headers=team)
        await asyncio.wait_for(response.content.readline(), timeout=5)
        response.close()
        await until(lambda: fake.cancelled)
        statuses["disconnect"] = 499
        async with http.get(f"{gateway}/kvgate/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as got:
            assert got.status == 200
    return statuses


def _gateway(fake: FakeLLM, **server: Any) -> Any:
    return running_gateway(
        [{"name": "gpu0", "url": fake.url, "timeouts": {"first_byte_s": 30, "idle_s": 30}}],
        server={"log_format": "json", "admin_key": ADMIN_KEY, **server},
        tenants={"team": {"api_keys": [KEY]}, "tight": {"api_keys": [TIGHT_KEY], "max_prompt_tokens": 20}},
        **exact_counting("llama3.1:8b"),  # the cap applies to a real count
    )


async def test_one_json_line_per_request_with_what_kvgate_did(fake: FakeLLM, captured: _Lines) -> None:
    async with _gateway(fake) as gateway:
        statuses = await _matrix(gateway, fake)
        await until(lambda: len(captured.requests()) >= len(statuses))
    assert statuses == {"ok": 200, "refused": 400, "trimmed": 200, "bad_key": 401, "streamed": 200,
                        "disconnect": 499}
    lines = [entry for entry in captured.requests() if entry["msg"].startswith("POST /api/chat")]
    assert [line["status"] for line in lines] == list(statuses.values())  # one line per request, in order
    assert len({line["request_id"] for line in lines}) == len(lines)
    for line in lines:
        assert [field for field in FIELDS if field not in line] == [], line
    ok, refused, trimmed, bad_key, streamed, gone = lines
    assert (ok["tenant"], ok["backend"], ok["model"], ok["decision"]) == ("team", "gpu0", "llama3.1:8b", "admitted")
    assert ok["prompt_tokens"] > 0 and ok["reserved_tokens"] > ok["prompt_tokens"] and ok["queue_wait_s"] == 0
    assert isinstance(ok["exact"], bool) and ok["counter"] and "admitted" in ok["actions"]
    assert (refused["tenant"], refused["decision"], refused["reason"]) == ("tight", "refused", "max_prompt_tokens")
    assert refused["prompt_tokens"] > 20
    assert trimmed["decision"] == "admitted" and trimmed["trimmed_messages"] > 0 and "trimmed" in trimmed["actions"]
    assert (bad_key["tenant"], bad_key["backend"], bad_key["decision"]) == ("-", "-", "error")
    assert streamed["decision"] == "admitted" and streamed["status"] == 200
    assert gone["status"] == 499 and gone["reserved_tokens"] > 0
    assert all("content" not in line for line in lines)


async def test_keys_and_prompts_never_reach_the_log_by_default(fake: FakeLLM, captured: _Lines) -> None:
    async with _gateway(fake) as gateway:
        await _matrix(gateway, fake)
        await until(lambda: len(captured.requests()) >= 6)
    text = "\n".join(captured.lines)
    for secret in (KEY, TIGHT_KEY, BAD_KEY, ADMIN_KEY, SECRET, OLD_SECRET, "word0x1"):
        assert secret not in text


async def test_log_contents_adds_the_last_user_message_and_still_no_key(fake: FakeLLM, captured: _Lines) -> None:
    async with _gateway(fake, log_contents=True) as gateway:
        await _matrix(gateway, fake)
        await until(lambda: len(captured.requests()) >= 6)
    lines = [entry for entry in captured.requests() if entry["msg"].startswith("POST /api/chat")]
    assert lines[0]["content"] == f"hello {SECRET}"
    assert lines[1]["content"].endswith("...") and len(lines[1]["content"]) == 203  # cut to 200 characters
    text = "\n".join(captured.lines)
    for secret in (KEY, TIGHT_KEY, BAD_KEY, ADMIN_KEY, OLD_SECRET):  # the history is not logged, only the last turn
        assert secret not in text
