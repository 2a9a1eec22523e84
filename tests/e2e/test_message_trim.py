"""Issue 22 point 4: a single message longer than the context is trimmed head-and-tail like a prompt, on every chat
route and dialect, and announced; a chat whose system prompt alone is past the context is refused as before.

kvgate in front of the simulator (Ollama mode, and llama-server mode), with exact counts (the model's GGUF
tokenizer from /api/show; llama-server's own /v1/chat/completions/input_tokens). The simulator reports what it
really got (``prompt_eval_count``, ``usage``) and counts what it cut silently or failed for the context, so the
tests check that what kvgate forwarded fits, and that nothing was cut behind the client's back.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from openai import AsyncOpenAI

from tests.kvsim.helpers import running_sim
from tests.support.gateway_server import running_gateway

CONTEXT = 4096
MODEL = "llama3.1:8b"
_SENTENCE = "the plan for the release needs a date a budget and a team of four people who know the code"
PASTE = "START OF THE PASTE " + " ".join(f"{_SENTENCE} ({i})" for i in range(500)) + " END OF THE PASTE"
CUT = re.compile(r"cut message (\d+) of (\d+) \((user|tool|function_call_output)\): kept the first ([\d,]+) and last "
                 r"([\d,]+) characters of its text, ([\d,]+) omitted; prompt ([\d,]+) -> ([\d,]+) tokens$")


@contextlib.asynccontextmanager
async def simulator(mode: str) -> AsyncIterator[str]:
    from kvsim.config import SimConfig
    from tests.tokens.vocab_vectors import warm_sim_tokenizers

    config = SimConfig(mode="ollama" if mode == "ollama" else "llama-server", models=(MODEL,),
                       context_length=CONTEXT, ctx_size=CONTEXT, n_parallel=1,
                       load_s=0.01, time_scale=50.0, min_response_tokens=4, max_response_tokens=8,
                       prompt_tokens_per_s=500_000.0, gen_tokens_per_s=2000.0,
                       tokenizer_cache_dir=warm_sim_tokenizers(MODEL))
    async with running_sim(config) as url:
        yield url


def backend(sim: str, mode: str) -> dict[str, Any]:
    kind = "ollama" if mode == "ollama" else "llama-server"
    return {"name": "sim", "kind": kind, "url": sim, "context_tokens": CONTEXT, "parallel": 1}


async def post(url: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
    async with aiohttp.ClientSession() as http, http.post(f"{url}{path}", json=body) as response:
        return response.status, dict(response.headers), orjson.loads(await response.read())


async def sim_stats(sim: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(f"{sim}/sim/stats") as response:
        stats: dict[str, Any] = await response.json()
        return stats


def _chat(system: str, user: Any) -> list[dict[str, Any]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def body_for(path: str, system: str, text: str, *, parts: bool) -> dict[str, Any]:
    """The route's own shape of a chat: one system prompt, one user message (a string, or text parts)."""
    if path == "/v1/messages":
        content: Any = [{"type": "text", "text": text}] if parts else text
        return {"model": MODEL, "max_tokens": 16, "system": system, "messages": [{"role": "user", "content": content}]}
    if path in ("/v1/responses", "/responses"):
        given: Any = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}] \
            if parts else text
        return {"model": MODEL, "max_output_tokens": 16, "instructions": system, "input": given}
    content = [{"type": "text", "text": text[:len(text) // 2]}, {"type": "text", "text": text[len(text) // 2:]}] \
        if parts else text
    if path == "/api/chat":
        return {"model": MODEL, "stream": False, "options": {"num_predict": 16}, "messages": _chat(system, content)}
    return {"model": MODEL, "max_tokens": 16, "messages": _chat(system, content)}


def prompt_tokens_of(path: str, answer: dict[str, Any]) -> int:
    if path == "/api/chat":
        return int(answer["prompt_eval_count"])
    usage = answer["usage"]
    return int(usage.get("prompt_tokens") or usage.get("input_tokens") or 0)


ROUTES = [
    ("ollama", "/api/chat", False),
    ("ollama", "/v1/chat/completions", False),
    ("ollama", "/v1/chat/completions", True),
    ("ollama", "/v1/messages", True),
    ("ollama", "/v1/responses", False),
    ("ollama", "/v1/responses", True),
    ("llama-server", "/chat/completions", False),
    ("llama-server", "/v1/chat/completions", True),
    ("llama-server", "/v1/messages", False),
    ("llama-server", "/v1/responses", True),
]


@pytest.mark.parametrize(("mode", "path", "parts"), ROUTES,
                         ids=[f"{m}{p}{'-parts' if parts else ''}" for m, p, parts in ROUTES])
async def test_a_single_message_past_the_context_is_cut_head_and_tail_on_every_chat_route(
    mode: str, path: str, parts: bool
) -> None:
    async with simulator(mode) as sim, running_gateway([backend(sim, mode)],
                                                       counting={"count_budget_s": 30.0}) as url:
        status, headers, answer = await post(url, path, body_for(path, "Summarize what the user pasted.", PASTE,
                                                                 parts=parts))
        stats = await sim_stats(sim)
    trimmed = headers.get("X-Kvgate-Trimmed", "")
    print(f"\n{mode:12s} {path:22s} {'parts' if parts else 'text ':5s} {status} {trimmed}")
    assert status == 200, answer
    found = CUT.search(trimmed)
    assert found is not None, trimmed
    position, of = int(found.group(1)), int(found.group(2))
    assert position == of == (1 if path in ("/v1/messages", "/v1/responses") else 2)  # the system is not counted
    before, after = int(found.group(7).replace(",", "")), int(found.group(8).replace(",", ""))
    assert before > CONTEXT > after and headers["X-Kvgate-Counter"].endswith("exact")
    assert prompt_tokens_of(path, answer) == after <= CONTEXT - 16  # what the backend got is what kvgate counted
    assert (stats["truncated_prompts"], stats["context_exceeded"], stats["failed"]) == (0, 0, 0)


@pytest.mark.parametrize(("mode", "path"), [("ollama", "/api/chat"), ("ollama", "/v1/messages"),
                                            ("llama-server", "/v1/chat/completions"),
                                            ("llama-server", "/v1/responses")])
async def test_a_system_prompt_alone_past_the_context_is_refused_as_before(mode: str, path: str) -> None:
    async with simulator(mode) as sim, running_gateway([backend(sim, mode)],
                                                       counting={"count_budget_s": 30.0}) as url:
        status, _, answer = await post(url, path, body_for(path, PASTE, "What did I paste?", parts=False))
        stats = await sim_stats(sim)
    said = orjson.dumps(answer).decode()
    assert status == 400 and "context of 4,096 tokens" in said, said
    assert stats["requests"] == 0  # never reached the backend


def aider_summary_request() -> list[dict[str, str]]:
    """What aider's ChatSummary sends when the chat history outgrows the model: its summarize prompt, and the whole
    history as ONE user message ("# USER" / "# ASSISTANT" sections)."""
    turns = []
    for i in range(120):
        turns.append(f"# USER\nPlease change step {i} of the release plan: {_SENTENCE}.")
        turns.append(f"# ASSISTANT\nI changed step {i}: {_SENTENCE}, and updated the tests for it.")
    system = ("*Briefly* summarize this partial conversation about programming. Include less detail about older "
              "parts and more detail about the most recent messages. Start a new paragraph every time the topic "
              "changes! This is only part of a longer conversation so *DO NOT* conclude the summary with language "
              "like \"Finally, ...\". Because the conversation continues after the summary. The summary *MUST* "
              "include the function names, libraries, packages that are being discussed. The summary *MUST* include "
              "the filenames that are being referenced by the assistant inside the ```...``` fenced code blocks! The "
              "summaries *MUST NOT* include ```...``` fenced code blocks! Phrase the summary with the USER in first "
              "person, telling the ASSISTANT about the conversation. Write *as* the user. The user should refer to "
              "the assistant as *you*. Start the summary with \"I asked you...\".")
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n".join(turns)}]


@pytest.mark.parametrize("mode", ["ollama", "llama-server"])
async def test_aiders_history_summarizer_through_the_openai_client_is_answered(mode: str) -> None:
    """The official openai client sends aider's summarizer request (system + one user message with the whole
    history, far past the context): answered 200, the message cut in the middle and the client told."""
    async with simulator(mode) as sim, running_gateway([backend(sim, mode)],
                                                       counting={"count_budget_s": 30.0}) as url:
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=aider_summary_request(), max_tokens=64)  # type: ignore[arg-type]
        completion = raw.parse()
        await client.close()
        stats = await sim_stats(sim)
    trimmed = raw.headers.get("X-Kvgate-Trimmed", "")
    print(f"\naider summarizer on {mode}: {raw.status_code}; {trimmed}")
    assert raw.status_code == 200 and completion.choices[0].message.content
    assert CUT.search(trimmed) and trimmed.startswith("cut message 2 of 2 (user)")
    assert completion.usage is not None and completion.usage.prompt_tokens <= CONTEXT - 64
    assert (stats["truncated_prompts"], stats["context_exceeded"]) == (0, 0)
