"""Issue 13 end to end on the simulated Ollama: a conversation too long for the context keeps its gist.

kvgate in front of the simulator with llama3.1:8b pinned to a 2,048-token context, phi3:mini as the summary model
(a smaller model on the same backend: its summaries are the simulator's random text, which is fine: the mechanics,
tokens and headers are what is checked). A conversation grows turn by turn past the context; kvgate replaces its
oldest turns with one summary, reuses it on the next turns, and makes a new one only when the conversation crosses
the context again. The summary requests go through kvgate (the simulator sees them, as phi3:mini requests).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from tests.kvsim.helpers import running_sim
from tests.support.gateway_server import running_gateway
from tests.support.metrics_text import metric_sum

CONTEXT_TOKENS = 2048
MODEL, SUMMARY_MODEL = "llama3.1:8b", "phi3:mini"
_SENTENCE = "the plan for the release needs a date a budget and a team of four people who know the code"
WORDS = tuple(_SENTENCE.split(" "))


@contextlib.asynccontextmanager
async def simulator() -> AsyncIterator[str]:
    from kvsim.config import SimConfig
    from tests.tokens.vocab_vectors import warm_sim_tokenizers

    config = SimConfig(models=(MODEL, SUMMARY_MODEL), load_s=0.01, time_scale=50.0, min_response_tokens=8,
                       max_response_tokens=24, gen_tokens_per_s=2000.0, prompt_tokens_per_s=500_000.0,
                       tokenizer_cache_dir=warm_sim_tokenizers(MODEL, SUMMARY_MODEL))
    async with running_sim(config) as url:
        yield url


def backend(sim: str) -> dict[str, Any]:
    return {"name": "sim", "kind": "ollama", "url": sim, "context_tokens": CONTEXT_TOKENS, "parallel": 1}


def words(n: int, seed: int) -> str:
    return " ".join(WORDS[(seed + i) % len(WORDS)] for i in range(n))


async def post(url: str, path: str, body: dict[str, Any], headers: dict[str, str] | None = None,
               ) -> tuple[int, dict[str, str], bytes]:  # fmt: skip
    async with aiohttp.ClientSession() as http, http.post(f"{url}{path}", json=body, headers=headers) as response:
        return response.status, dict(response.headers), await response.read()


async def metric(url: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    async with aiohttp.ClientSession() as http, http.get(f"{url}/kvgate/metrics") as response:
        text = await response.text()
    return metric_sum(text, name, **labels)


async def test_a_growing_conversation_is_summarized_once_per_crossing_and_the_summary_reused() -> None:
    fitting = {"remedies": ["summarize", "trim", "refuse"], "summary_model": SUMMARY_MODEL,
               "keep_newest_turns": 2, "summary_max_tokens": 64}
    async with simulator() as sim, running_gateway([backend(sim)], fitting=fitting) as url:
        messages: list[dict[str, Any]] = [{"role": "system", "content": "You plan releases."}]
        rows: list[tuple[int, int, int, str, float]] = []
        for turn in range(9):
            messages.append({"role": "user", "content": f"turn {turn}: " + words(260, turn)})
            status, headers, raw = await post(url, "/api/chat", {"model": MODEL, "stream": False,
                                                                 "messages": messages,
                                                                 "options": {"num_predict": 16}})
            assert status == 200, raw
            reply = orjson.loads(raw)
            said = headers.get("X-Kvgate-Summarized")
            rows.append((turn, len(messages), reply["prompt_eval_count"], said or "-",
                         await metric(url, "kvgate_summary_calls_total")))
            assert "X-Kvgate-Trimmed" not in headers  # the summary worked: nothing was dropped without one
            assert reply["prompt_eval_count"] <= CONTEXT_TOKENS
            messages.append({"role": "assistant", "content": words(40, turn + 7)})
        print("\nturn msgs prompt calls  X-Kvgate-Summarized")
        for turn, n, prompt, header, made in rows:
            print(f"{turn:4d} {n:4d} {prompt:6d} {made:5.0f}  {header}")
        calls = rows[-1][4]
        summarized = [row for row in rows if row[3] != "-"]
        cached = [row for row in summarized if row[3].endswith("; cached")]
        assert summarized and cached  # summarized, and the next turns reused the summary
        assert 1 <= calls < len(summarized)  # one call per crossing, not one per turn
        assert await metric(url, "kvgate_summary_cache_hits_total") >= len(cached)
        async with aiohttp.ClientSession() as http, http.get(f"{sim}/sim/stats") as response:
            loaded = {entry["model"] for entry in (await response.json())["loaded"]}
        assert SUMMARY_MODEL in loaded  # the summaries were written by the summary model, through kvgate


@pytest.mark.parametrize("path", ["/api/chat", "/v1/chat/completions"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_a_failed_summary_falls_back_to_a_trim_that_says_why(path: str, stream: bool) -> None:
    """The summary model does not exist: the summary request is refused (404) and the chat is trimmed instead, the
    header naming the failure, in both dialects, streamed or not."""
    fitting = {"remedies": ["summarize", "trim"], "summary_model": "no-such-model:1b"}
    async with simulator() as sim, running_gateway([backend(sim)], fitting=fitting) as url:
        messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": words(220, i)} for i in range(13)]
        body: dict[str, Any] = {"model": MODEL, "stream": stream, "messages": messages}
        body.update({"options": {"num_predict": 16}} if path == "/api/chat" else {"max_tokens": 16})
        status, headers, _ = await post(url, path, body)
        assert status == 200
        assert "X-Kvgate-Summarized" not in headers
        trimmed = headers["X-Kvgate-Trimmed"]
        assert trimmed.startswith("dropped the ") and "summary failed: the summary model 'no-such-model:1b'" in trimmed
        assert await metric(url, "kvgate_summary_failures_total") == 1
        assert await metric(url, "kvgate_summary_failures_total", reason="error") == 1  # a 404: no such model
        assert await metric(url, "kvgate_decisions_total", decision="summary_failed") == 1


async def test_strict_tenants_are_refused_and_others_summarized() -> None:
    """Policy per tenant: a strict tenant's long chat is refused, unchanged; the same chat from another tenant is
    summarized. A client can't pose as kvgate's own summary requests (a made-up X-Kvgate-Internal is ignored)."""
    fitting = {"remedies": ["summarize", "trim"], "summary_model": SUMMARY_MODEL, "summary_max_tokens": 64}
    tenants = {"ci": {"api_keys": ["ci-key-0123456789"], "fitting": {"strict": True}},
               "team": {"api_keys": ["team-key-0123456789"]}}
    async with simulator() as sim, running_gateway([backend(sim)], fitting=fitting, tenants=tenants) as url:
        messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": words(120, i)} for i in range(17)]
        body = {"model": MODEL, "stream": False, "messages": messages, "options": {"num_predict": 16}}
        status, _, raw = await post(url, "/api/chat", body, {"Authorization": "Bearer ci-key-0123456789"})
        assert status == 400 and b"context" in raw
        status, headers, _ = await post(url, "/api/chat", body, {"Authorization": "Bearer team-key-0123456789",
                                                               "X-Kvgate-Internal": "guess",
                                                               "X-Kvgate-Route-Backend": "nope"})
        assert status == 200 and "X-Kvgate-Summarized" in headers, headers.get("X-Kvgate-Trimmed")


@pytest.mark.parametrize("path", ["/api/generate", "/v1/completions"])
async def test_a_prompt_too_long_keeps_its_head_and_tail(path: str) -> None:
    async with simulator() as sim, running_gateway([backend(sim)]) as url:
        prompt = "BEGIN " + words(3000, 0) + " END"
        body: dict[str, Any] = {"model": MODEL, "stream": False, "prompt": prompt}
        body.update({"options": {"num_predict": 16}} if path == "/api/generate" else {"max_tokens": 16})
        status, headers, raw = await post(url, path, body)
        assert status == 200, raw
        said = headers["X-Kvgate-Trimmed"]
        assert said.startswith("kept the first ") and " omitted; prompt " in said
        if path == "/api/generate":
            assert orjson.loads(raw)["prompt_eval_count"] <= CONTEXT_TOKENS
