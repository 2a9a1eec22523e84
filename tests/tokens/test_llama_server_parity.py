"""kvgate's GGUF-path count equals what a real llama-server counts, for a corpus of varied chats.
The server runs a tiny model with the real Llama 3 vocabulary and the Llama 3.1 Instruct chat template
(data/llama-3.1-instruct.jinja, as published in llama.cpp's models/templates). For every chat the GGUF path
(tokenizer converted from the model file + template rendered in Python, family detected from GET /props) must equal
both the server's `POST /v1/chat/completions/input_tokens` and the `usage.prompt_tokens` of a real completion.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway import dialects
from gateway.backends.client import BackendClient
from gateway.domain import Dialect, Operation
from gateway.tokens.llama_server_counter import LlamaServerCounter, probe_chat_template
from gateway.tokens.request_count import count_prompt
from gateway.tokens.sources import GGUFFileSource
from gateway.tokens.tokenizer_counter import TokenizerCounter
from tests.support.llama_server import RunningLlamaServer, run_llama_server
from tests.support.tinymodel import write_tiny_model
from tests.tokens.chat_corpus import chat_corpus

pytestmark = pytest.mark.llama_server

TEMPLATE = Path(__file__).parent / "data" / "llama-3.1-instruct.jinja"
CONTEXT_TOKENS = 32768


@pytest.fixture(scope="module")
def model_path() -> Path:
    return write_tiny_model(n_ctx_train=CONTEXT_TOKENS)


@pytest.fixture(scope="module")
def server(llama_server_bin: Path, model_path: Path) -> Iterator[RunningLlamaServer]:
    args = ("-c", str(CONTEXT_TOKENS), "-np", "1", "--chat-template-file", str(TEMPLATE), "-t", "2")
    with run_llama_server(model_path, *args, log_verbosity=1, binary=llama_server_bin) as running:
        yield running


async def _json(session: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> dict[str, Any]:
    async with session.request(method, url, json=body) as response:
        reply: dict[str, Any] = await response.json()
        assert response.status == 200, reply
        return reply


def _gguf_counter(model_path: Path, family: str | None) -> TokenizerCounter:
    # The server renders "Today Date" from its clock; both sides read the same day.
    return TokenizerCounter(GGUFFileSource(model_path), model="tiny", template=family, today=dt.date.today)


async def test_gguf_path_matches_server_on_chat_corpus(server: RunningLlamaServer, model_path: Path) -> None:
    corpus = chat_corpus()
    async with aiohttp.ClientSession() as session:
        family = await probe_chat_template(BackendClient(session, server.url))
        assert family == "llama3.1"
        ours = _gguf_counter(model_path, family)
        exact_server = LlamaServerCounter(BackendClient(session, server.url))
        rows = []
        for body in corpus:
            mine = await ours.count_chat(body["messages"], body.get("tools", ()))
            input_tokens = (await exact_server.count_chat(body["messages"], body.get("tools", ()))).tokens
            # tool_choice "none" keeps the tools in the prompt but stops the server parsing random output as calls
            request = {**body, "max_tokens": 1, "temperature": 0, "tool_choice": "none"}
            completion = await _json(session, "POST", f"{server.url}/v1/chat/completions", request)
            rows.append((mine.tokens, input_tokens, completion["usage"]["prompt_tokens"], mine.exact))
    matches = sum(1 for mine, inp, usage, _ in rows if mine == inp == usage)
    largest = max(max(abs(mine - inp), abs(mine - usage)) for mine, inp, usage, _ in rows)
    print(
        f"\nGGUF path vs llama-server: {matches}/{len(rows)} exact, largest difference {largest} tokens, "
        f"prompts {min(r[1] for r in rows)}..{max(r[1] for r in rows)} tokens"
    )
    assert all(exact for *_, exact in rows)
    assert matches == len(rows), [r for r in rows if not r[0] == r[1] == r[2]]


RAW_PROMPTS = [
    "Hello world",
    " leading space and trailing  ",
    "<|begin_of_text|>explicit BOS and <|eot_id|> specials",
    "東京 👩‍💻 e\u0301 \r\n\tmixed",
    "x" * 5000,
]


async def test_raw_prompts_match_tokenize_and_completion(server: RunningLlamaServer, model_path: Path) -> None:
    ours = _gguf_counter(model_path, None)
    async with aiohttp.ClientSession() as session:
        exact_server = LlamaServerCounter(BackendClient(session, server.url))
        for prompt in RAW_PROMPTS:
            for add_special in (True, False):
                mine = await ours.count_text(prompt, add_special=add_special)
                theirs = await exact_server.count_text(prompt, add_special=add_special)
                assert mine.tokens == theirs.tokens, (prompt, add_special)
            body = {"prompt": prompt, "n_predict": 1}
            reply = await _json(session, "POST", f"{server.url}/completion", body)
            parsed = dialects.parse(Dialect.LLAMACPP, Operation.GENERATE, body, "/completion")
            counted = await count_prompt(parsed.prompt_input, ours)
            assert counted.tokens == reply["tokens_evaluated"], prompt


async def test_counts_run_concurrently(server: RunningLlamaServer, model_path: Path) -> None:
    corpus = chat_corpus(12, seed=7)
    ours = _gguf_counter(model_path, "llama3.1")
    async with aiohttp.ClientSession() as session:
        exact_server = LlamaServerCounter(BackendClient(session, server.url))
        mine = await asyncio.gather(*(ours.count_chat(b["messages"], b.get("tools", ())) for b in corpus))
        theirs = await asyncio.gather(*(exact_server.count_chat(b["messages"], b.get("tools", ())) for b in corpus))
    assert [m.tokens for m in mine] == [t.tokens for t in theirs]


WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
RESPONSES_BODIES: list[dict[str, Any]] = [
    {"input": "What is the capital of France?"},
    {"input": "Be brief.", "instructions": "You are a terse assistant."},
    {"input": [{"type": "message", "role": "user", "content": "Hi there"},
               {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
               {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me a joke"}]}]},
    {"input": [{"type": "message", "role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER_TOOL]},
    {"instructions": "Use tools.", "tools": [WEATHER_TOOL], "input": [
        {"role": "user", "content": "Weather in Oslo?"},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"},
        {"type": "function_call_output", "call_id": "c1", "output": "-3 C, snow"},
    ]},
]


async def test_responses_bodies_count_like_the_server(server: RunningLlamaServer, model_path: Path) -> None:
    """/v1/responses: kvgate's reading of input, instructions and tools gives the server's own count
    (POST /v1/responses/input_tokens), through the server's counter and through the GGUF path alike."""
    async with aiohttp.ClientSession() as session:
        family = await probe_chat_template(BackendClient(session, server.url))
        ours = _gguf_counter(model_path, family)
        exact_server = LlamaServerCounter(BackendClient(session, server.url))
        rows = []
        for body in RESPONSES_BODIES:
            prompt = dialects.parse(Dialect.OPENAI, Operation.RESPONSES, body, "/v1/responses").prompt_input
            theirs = (await _json(session, "POST", f"{server.url}/v1/responses/input_tokens", body))["input_tokens"]
            via_server = await count_prompt(prompt, exact_server)
            via_gguf = await count_prompt(prompt, ours)
            rows.append((theirs, via_server.tokens, via_gguf.tokens, via_gguf.exact))
    print("\n/v1/responses (server, kvgate via server, kvgate via GGUF, exact):", rows)
    assert all(theirs == server_count == gguf for theirs, server_count, gguf, _ in rows), rows
