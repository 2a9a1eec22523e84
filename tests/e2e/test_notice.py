"""Issue 22, point 7: with ``fitting.notice`` the person reads, in the reply itself, what kvgate left out.

kvgate in front of the simulated Ollama (llama3.1:8b at 2,048 tokens, phi3:mini writing summaries) and the simulated
llama-server (4,096 cells), each behind a tap that records the bytes the backend sent. Every route and framing kvgate
trims or summarizes on, streamed and not, is asked once by a tenant with the notice on and once by one without, with
the official ``ollama`` and ``openai`` clients (raw HTTP for Anthropic's /v1/messages and llama-server's /completion,
whose SDKs the project does not use). With the notice on, a trimmed or summarized reply starts with the line, as the
client assembles its text; what the client received is the backend's bytes plus that one event (or, for a whole
reply, the same JSON with the line in front of its text). Without it, or for a request that was not changed, the
client gets the backend's bytes exactly. The Responses API (kvgate does not trim its ``input``) is checked through
the relay itself below; tool calls in tests/notice/test_shapes.py and at the end here.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx2
import ollama
import openai
import orjson
import pytest
from aiohttp import web

from gateway.domain import Dialect
from gateway.notice import Notice
from gateway.notice.shapes import Shape
from gateway.streaming import RelayPlan, relay
from gateway.support.hop_headers import SSE
from kvsim.config import SimConfig
from kvsim.runner import start_sim
from tests.support.fake_backend import FakeLLM, OllamaModels, running, serve
from tests.support.gateway_server import running_gateway
from tests.support.tap import RecordingTransport, RecordingTransport2, Tap, tapped

OL_MODEL, SUMMARY_MODEL, CPP_MODEL = "llama3.1:8b", "phi3:mini", "qwen2.5:7b"
OL_CONTEXT, CPP_CONTEXT = 2048, 4096
_SENTENCE = "the plan for the release needs a date a budget and a team of four people who know the code"
_WORDS = tuple(_SENTENCE.split(" "))
SUMMARY = {"remedies": ["summarize", "trim"], "summary_model": SUMMARY_MODEL, "summary_max_tokens": 64}
TENANTS: dict[str, dict[str, Any]] = {
    "on": {"fitting": {"notice": True}}, "off": {},
    "summ-on": {"fitting": {**SUMMARY, "notice": True}}, "summ-off": {"fitting": SUMMARY},
}
for _name, _tenant in TENANTS.items():
    _tenant["api_keys"] = [f"{_name}-key-0123456789"]
NOTICE = re.compile(r"^\[kvgate: (.+) to fit the ([\d,]+)-token context\]\n\n")


def words(n: int, seed: int) -> str:
    return " ".join(_WORDS[(seed + i) % len(_WORDS)] for i in range(n))


def history(turns: int, size: int) -> list[dict[str, str]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": words(size, i)} for i in range(turns)]


SUMMED = [*history(6, 150), {"role": "user", "content": words(1300, 6)}]
"""Too long for 2,048 tokens; its two oldest turns (what a summary replaces) fit the summary model."""
HI = [{"role": "user", "content": "say hi"}]


@dataclass(frozen=True)
class Route:
    backend: str  # "ol" or "cpp"
    path: str
    chat: bool
    client: str  # "ollama", "openai" or "http"
    model: str = OL_MODEL
    context: int = OL_CONTEXT

    def input(self, case: str) -> Any:
        if case == "summarized":
            return SUMMED
        if case == "neither":
            return HI if self.chat else "say hi"
        if self.chat:  # 13 messages, together well past the context
            return history(13, self.context // 9 + 20)
        return "BEGIN " + words(self.context * 3 // 2, 0) + " END"


def _cpp(path: str, chat: bool, client: str) -> Route:
    return Route("cpp", path, chat, client, CPP_MODEL, CPP_CONTEXT)


ROUTES = (
    Route("ol", "/api/chat", True, "ollama"), Route("ol", "/api/generate", False, "ollama"),
    Route("ol", "/v1/chat/completions", True, "openai"), Route("ol", "/v1/completions", False, "openai"),
    Route("ol", "/v1/messages", True, "http"),
    _cpp("/completion", False, "http"), _cpp("/v1/chat/completions", True, "openai"),
    _cpp("/v1/completions", False, "openai"), _cpp("/v1/messages", True, "http"),
)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    text: str
    sent: bytes  # the body bytes the client received


@contextlib.asynccontextmanager
async def backends() -> AsyncIterator[tuple[Tap, Tap]]:
    from tests.tokens.vocab_vectors import warm_sim_tokenizers

    cache = warm_sim_tokenizers(OL_MODEL, SUMMARY_MODEL, CPP_MODEL)
    ol_runner, ol = await start_sim(SimConfig(
        models=(OL_MODEL, SUMMARY_MODEL), load_s=0.01, time_scale=50.0, context_length=OL_CONTEXT,
        min_response_tokens=8, max_response_tokens=24, gen_tokens_per_s=2000.0, prompt_tokens_per_s=500_000.0,
        tokenizer_cache_dir=cache))
    cpp_runner, cpp = await start_sim(SimConfig(
        mode="llama-server", server_model=CPP_MODEL, ctx_size=CPP_CONTEXT, time_scale=50.0, gen_tokens_per_s=2000.0,
        min_response_tokens=8, max_response_tokens=24, tokenizer_cache_dir=cache))
    try:
        async with tapped(ol) as ol_tap, tapped(cpp) as cpp_tap:
            yield ol_tap, cpp_tap
    finally:
        await ol_runner.cleanup()
        await cpp_runner.cleanup()


def _sse_data(raw: bytes) -> list[Any]:
    out = []
    for line in raw.splitlines():
        if line.startswith(b"data:") and line[5:].strip() not in (b"", b"[DONE]"):
            out.append(orjson.loads(line[5:].strip()))
    return out


async def ask(url: str, route: Route, tenant: str, case: str, stream: bool) -> Reply:
    key = f"{tenant}-key-0123456789"
    given = route.input(case)
    if route.client == "ollama":
        transport = RecordingTransport()
        client = ollama.AsyncClient(host=url, headers={"Authorization": f"Bearer {key}"}, transport=transport)
        try:
            text = await _ollama_text(client, route, given, stream)
        finally:
            await client.close()  # type: ignore[no-untyped-call]
        return Reply(200, transport.headers, text, transport.last)
    if route.client == "openai":
        transport2 = RecordingTransport2()
        sdk_http = httpx2.AsyncClient(transport=transport2)
        sdk = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, http_client=sdk_http)
        try:
            text = await _openai_text(sdk, route, given, stream)
        finally:
            await sdk.close()
        return Reply(200, transport2.headers, text, transport2.last)
    body: dict[str, Any] = {"model": route.model, "stream": stream}
    if route.chat:
        body.update(messages=given, max_tokens=16)
    else:
        body.update(prompt=given, n_predict=16)
    async with aiohttp.ClientSession() as http, http.post(url + route.path, json=body, headers={
            "Authorization": f"Bearer {key}"}) as reply:
        sent = await reply.read()
        headers = {k.lower(): v for k, v in reply.headers.items()}
    return Reply(reply.status, headers, _http_text(route, sent, stream), sent)


async def _ollama_text(client: ollama.AsyncClient, route: Route, given: Any, stream: bool) -> str:
    options = {"num_predict": 16}
    if route.chat:
        if stream:
            return "".join([p.message.content or "" async for p in await client.chat(
                model=route.model, messages=given, stream=True, options=options)])
        return (await client.chat(model=route.model, messages=given, options=options)).message.content or ""
    if stream:
        return "".join([p.response or "" async for p in await client.generate(
            model=route.model, prompt=given, stream=True, options=options)])
    return (await client.generate(model=route.model, prompt=given, options=options)).response or ""


async def _openai_text(sdk: openai.AsyncOpenAI, route: Route, given: Any, stream: bool) -> str:
    if route.chat:
        if stream:
            chunks = await sdk.chat.completions.create(model=route.model, messages=given, max_tokens=16, stream=True)
            return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
        chat = await sdk.chat.completions.create(model=route.model, messages=given, max_tokens=16)
        return chat.choices[0].message.content or ""
    if stream:
        pieces = await sdk.completions.create(model=route.model, prompt=given, max_tokens=16, stream=True)
        return "".join([c.choices[0].text async for c in pieces if c.choices])
    return (await sdk.completions.create(model=route.model, prompt=given, max_tokens=16)).choices[0].text


def _http_text(route: Route, sent: bytes, stream: bool) -> str:
    if route.path == "/v1/messages":
        if stream:
            return "".join(e["delta"].get("text", "") for e in _sse_data(sent)
                           if e.get("type") == "content_block_delta")
        return next(str(b["text"]) for b in orjson.loads(sent)["content"] if b["type"] == "text")
    if stream:
        return "".join(e.get("content", "") for e in _sse_data(sent))
    return str(orjson.loads(sent)["content"])


def expected_line(route: Route, reply: Reply) -> str | None:
    """The notice the headers say the reply must start with (None: the request was not changed)."""
    summarized, trimmed = reply.headers.get("x-kvgate-summarized"), reply.headers.get("x-kvgate-trimmed")
    if summarized:
        n = int(re.match(r"replaced the (\d+) oldest", summarized).group(1))  # type: ignore[union-attr]
        what = f"{n} older messages were replaced by a summary"
    elif trimmed and route.chat:
        n = int(re.match(r"dropped the (\d+) oldest", trimmed).group(1))  # type: ignore[union-attr]
        what = f"{n} older messages were left out"
    elif trimmed:
        what = "the middle of the prompt was left out"
    else:
        return None
    return f"[kvgate: {what} to fit the {route.context:,}-token context]\n\n"


def _frames(raw: bytes, stream: bool, route: Route) -> list[bytes]:
    if route.client == "ollama":
        return raw.splitlines(keepends=True)
    return [frame for frame in re.split(rb"(?<=\n\n)", raw) if frame]


def _strip(value: Any, line: str, found: list[int]) -> Any:
    """``value`` with ``line`` taken off the front of every string that starts with it (counted in ``found``)."""
    if isinstance(value, dict):
        return {k: _strip(v, line, found) for k, v in value.items()}
    if isinstance(value, list):
        return [_strip(v, line, found) for v in value]
    if isinstance(value, str) and value.startswith(line):
        found.append(1)
        return value.removeprefix(line)
    return value


def bytes_check(route: Route, stream: bool, reply: Reply, backend_sent: bytes, line: str | None) -> str:
    """How the client's bytes relate to the backend's: identical, or the backend's plus the notice alone."""
    if line is None:
        assert reply.sent == backend_sent, "unchanged bytes expected"
        return "identical"
    if stream:
        frames = _frames(reply.sent, stream, route)
        escaped = orjson.dumps(line)[1:-1]
        inserted = [frame for frame in frames if escaped in frame]
        assert len(inserted) == 1, inserted
        assert b"".join(frame for frame in frames if frame is not inserted[0]) == backend_sent
        return f"backend's + 1 event ({len(inserted[0])} bytes)"
    found: list[int] = []
    assert _strip(orjson.loads(reply.sent), line, found) == orjson.loads(backend_sent) and len(found) == 1
    return "same JSON, line in the text"


async def test_the_notice_in_every_route_and_framing_and_none_when_off() -> None:
    rows: list[tuple[str, ...]] = []
    async with backends() as (ol_tap, cpp_tap):
        gateway_backends: list[dict[str, Any]] = [
            {"name": "ol", "kind": "ollama", "url": ol_tap.url, "context_tokens": OL_CONTEXT, "parallel": 1},
            {"name": "cpp", "kind": "llama-server", "url": cpp_tap.url}]
        async with running_gateway(gateway_backends, tenants=TENANTS) as url:
            for route in ROUTES:
                tap = ol_tap if route.backend == "ol" else cpp_tap
                cases = ("trimmed", "summarized", "neither") if route.chat and route.backend == "ol" \
                    else ("trimmed", "neither")
                for case in cases:
                    for stream in (False, True):
                        for notice in (True, False):
                            tenant = ("summ-" if case == "summarized" else "") + ("on" if notice else "off")
                            reply = await ask(url, route, tenant, case, stream)
                            assert reply.status == 200, (route, case, reply.sent[:300])
                            line = expected_line(route, reply)
                            assert (line is None) == (case == "neither"), (route, case, reply.headers)
                            shown = line if notice else None
                            if shown is not None:
                                assert reply.text.startswith(shown), (route, case, stream, reply.text[:200])
                            if shown is None:
                                assert not NOTICE.match(reply.text[:200]), (route, case, stream)
                            check = bytes_check(route, stream, reply, tap.last(route.path), shown)
                            rows.append((f"{route.backend} {route.path}", "stream" if stream else "whole", case,
                                         "on" if notice else "off", repr(reply.text[:64]), check))
    print(f"\n{'route':26} {'reply':6} {'case':10} {'notice':6} {'the client reads':68} bytes")
    for row in rows:
        print(f"{row[0]:26} {row[1]:6} {row[2]:10} {row[3]:6} {row[4]:68} {row[5]}")


# --- the Responses API, through the relay itself ---------------------------------------------------------------

@contextlib.asynccontextmanager
async def relaying(backend_url: str, line: str) -> AsyncIterator[str]:
    """A server whose one route relays the backend's /v1/responses answer with ``notice`` (``gateway.streaming``)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        async with aiohttp.ClientSession(auto_decompress=False) as http, http.post(
                backend_url + "/v1/responses", data=await request.read(),
                headers={"Content-Type": "application/json"}) as upstream:
            relayed = await relay(request, upstream, RelayPlan(Dialect.OPENAI, "r", "sim", idle_s=30.0,
                                                               notice=Notice(Shape.RESPONSES, line)))
            return relayed.response

    async with serve({("POST", "/v1/responses"): handler}) as url:
        yield url


@pytest.mark.parametrize("backend", ["ollama", "llama-server"])
async def test_the_responses_api_reads_the_notice_streamed_whole_and_in_the_final_response(backend: str) -> None:
    """The OpenAI SDK's three ways of reading a Responses reply (whole, events, the stream helper's final
    response) all show the notice; both simulators' event streams (Ollama's Go-sorted keys, llama-server's own,
    which has no output_item events: the SDK's stream helper refuses it, through kvgate or not)."""
    line = "[kvgate: 3 older messages were left out to fit the 2,048-token context]\n\n"
    config = SimConfig(models=(OL_MODEL,), load_s=0.01, time_scale=50.0, min_response_tokens=8,
                       max_response_tokens=24, gen_tokens_per_s=2000.0) if backend == "ollama" else SimConfig(
        mode="llama-server", server_model=OL_MODEL, time_scale=50.0, gen_tokens_per_s=2000.0)
    runner, sim = await start_sim(config)
    try:
        async with relaying(sim, line) as url:
            sdk = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x")
            whole = await sdk.responses.create(model=OL_MODEL, input="say hi", max_output_tokens=16)
            events = [event async for event in await sdk.responses.create(
                model=OL_MODEL, input="say hi", max_output_tokens=16, stream=True)]
            final = None
            if backend == "ollama":
                async with sdk.responses.stream(model=OL_MODEL, input="say hi", max_output_tokens=16) as helper:
                    async for _ in helper:
                        pass
                    final = (await helper.get_final_response()).output_text
            await sdk.close()
    finally:
        await runner.cleanup()
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = [e.text for e in events if e.type == "response.output_text.done"]
    completed = [e.response.output_text for e in events if e.type == "response.completed"]
    print(f"\n{backend}: whole {whole.output_text[:60]!r}; deltas {deltas[:60]!r}; final {(final or '')[:60]!r}")
    assert whole.output_text.startswith(line) and deltas.startswith(line)
    assert done == [deltas] and completed == [deltas] and final in (None, deltas)  # one text, everywhere
    assert whole.usage is not None and whole.usage.output_tokens <= 16  # the backend's figure, not the notice's


# --- tool calls: no line where a client parses a call ---------------------------------------------------------

def _tool_chat(stream: bool) -> Callable[[web.Request], Any]:
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\": \"x\"}"}}

    async def answer(request: web.Request) -> web.StreamResponse:
        if not stream:
            return web.json_response({"id": "c1", "object": "chat.completion", "created": 1, "model": OL_MODEL,
                                      "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                                          "role": "assistant", "content": None, "tool_calls": [call]}}],
                                      "usage": {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14}})
        response = web.StreamResponse(headers={"Content-Type": SSE})
        await response.prepare(request)
        for delta, finish in (({"role": "assistant", "content": ""}, None), ({"tool_calls": [{**call, "index": 0}]},
                                                                            None), ({}, "tool_calls")):
            chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": OL_MODEL,
                     "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    return answer


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_tool_call_reply_gets_no_notice_and_its_bytes_pass_unchanged(stream: bool) -> None:
    fake = FakeLLM()
    fake.answers.update(OllamaModels({OL_MODEL: ("ggml-vocab-llama-bpe.gguf", "sha256:" + "1" * 64)}).answers())
    fake.answers["/v1/chat/completions"] = _tool_chat(stream)
    long_chat = history(21, 500)  # past the fake's 8,192-token context
    async with running(fake), tapped(fake.url) as tap, running_gateway(
            [{"name": "b", "kind": "ollama", "url": tap.url, "parallel": 1}], fitting={"notice": True}) as url:
        transport = RecordingTransport2()
        sdk = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", http_client=httpx2.AsyncClient(transport=transport))
        tools: Any = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
        chat: Any = await sdk.chat.completions.create(model=OL_MODEL, messages=long_chat, tools=tools,  # type: ignore[arg-type]
                                                      max_tokens=16, stream=stream)
        calls = [c async for c in chat] if stream else chat.choices[0].message.tool_calls
        await sdk.close()
    assert "x-kvgate-trimmed" in transport.headers and calls
    assert transport.last == tap.last("/v1/chat/completions")  # the backend's bytes, exactly
