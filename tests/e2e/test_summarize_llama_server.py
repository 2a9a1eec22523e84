"""Issue 13 end to end with a real llama-server writing the summaries (its tiny model's text is random, which is fine:
the mechanics, tokens and headers are what is checked, not the prose).

kvgate in front of two backends: a real llama-server ("cpp": the tiny model, alias "tiny", a 1,024-token context, one
slot) and the simulated Ollama ("sim": llama3.1:8b pinned to 2,048 tokens). Summaries are written by the tiny model,
through kvgate (``summary_backend = "cpp"``), for

1. chats to the llama-server's own model in the OpenAI dialect, streamed and not: the first request too long for the
   context costs one summary call, the next turn reuses it ("; cached");
2. chats to the simulated Ollama's llama3.1:8b in the Ollama dialect, streamed and not (the summarizer is "a smaller
   model elsewhere").

Either way the summary request is seen where it went: kvgate counts it as the ``kvgate-summarizer`` tenant's and
backend "cpp"'s request, and the llama-server's own /metrics show the tokens it predicted for it (at most
``summary_max_tokens`` each). Every request prints a row: case, status, prompt tokens before and after, summary calls
so far, X-Kvgate-Summarized.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.kvsim.helpers import running_sim
from tests.support.gateway_server import running_gateway
from tests.support.llama_server import RunningLlamaServer, run_llama_server
from tests.support.metrics_text import metric_sum as metric
from tests.support.tinymodel import write_tiny_model

pytestmark = pytest.mark.llama_server

TEMPLATE = Path(__file__).parents[1] / "tokens" / "data" / "llama-3.1-instruct.jinja"
CPP_CONTEXT, SIM_CONTEXT = 1024, 2048
CPP_MODEL, SIM_MODEL = "tiny", "llama3.1:8b"
SUMMARY_MAX_TOKENS, REPLY_TOKENS = 64, 8
FITTING = {"remedies": ["summarize", "trim", "refuse"], "summary_model": CPP_MODEL, "summary_backend": "cpp",
           "keep_newest_turns": 2, "summary_max_tokens": SUMMARY_MAX_TOKENS}
_SENTENCE = "the plan for the release needs a date a budget and a team of four people who know the code"
WORDS = tuple(_SENTENCE.split(" "))
SUMMARIZED = re.compile(r"^replaced the ([\d,]+) oldest of ([\d,]+) messages with a summary; "
                        r"prompt ([\d,]+) -> ([\d,]+) tokens(; cached)?$")
ROWS: list[str] = []


@pytest.fixture(scope="module")
def server(llama_server_bin: Path) -> Iterator[RunningLlamaServer]:
    model = write_tiny_model(n_ctx_train=4096)
    args = ("-c", str(CPP_CONTEXT), "-np", "1", "-a", CPP_MODEL, "--chat-template-file", str(TEMPLATE), "-t", "2",
            "--metrics")
    with run_llama_server(model, *args, log_verbosity=1, binary=llama_server_bin) as running:
        yield running


@pytest.fixture(scope="module", autouse=True)
def table() -> Iterator[None]:
    yield
    print("\ncase                    status  before  after  calls  X-Kvgate-Summarized")
    for row in ROWS:
        print(row)


@contextlib.asynccontextmanager
async def simulator() -> AsyncIterator[str]:
    from kvsim.config import SimConfig
    from tests.tokens.vocab_vectors import warm_sim_tokenizers

    config = SimConfig(models=(SIM_MODEL,), load_s=0.01, time_scale=50.0, min_response_tokens=4,
                       max_response_tokens=8, gen_tokens_per_s=2000.0, prompt_tokens_per_s=500_000.0,
                       tokenizer_cache_dir=warm_sim_tokenizers(SIM_MODEL))
    async with running_sim(config) as url:
        yield url


@contextlib.asynccontextmanager
async def gateway(server: RunningLlamaServer) -> AsyncIterator[tuple[str, str]]:
    """kvgate in front of the llama-server and the simulated Ollama; yields (kvgate, simulator)."""
    async with simulator() as sim:
        backends: list[dict[str, Any]] = [{"name": "cpp", "kind": "llama-server", "url": server.url},
                    {"name": "sim", "kind": "ollama", "url": sim, "context_tokens": SIM_CONTEXT, "parallel": 1}]
        async with running_gateway(backends, fitting=FITTING) as url:
            yield url, sim


def words(n: int, seed: int) -> str:
    return " ".join(WORDS[(seed + i) % len(WORDS)] for i in range(n))


def chat(sizes: list[int], seed: int) -> list[dict[str, Any]]:
    """A system message, then alternating user and assistant messages of ``sizes`` words (the last one a user's)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You plan releases."}]
    for i, size in enumerate(sizes):
        role = "user" if i % 2 == 0 else "assistant"
        messages.append({"role": role, "content": f"{seed}.{i}: " + words(size, seed + i)})
    return messages


async def post(url: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession() as http, http.post(f"{url}{path}", json=body) as response:
        return response.status, dict(response.headers), await response.read()


async def scrape(url: str, path: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(f"{url}{path}") as response:
        assert response.status == 200
        return await response.text()


def summarized(headers: dict[str, str]) -> tuple[int, int, bool]:
    """The prompt tokens before and after, and whether the summary was cached, from X-Kvgate-Summarized."""
    said = headers.get("X-Kvgate-Summarized")
    assert said is not None, {name: value for name, value in headers.items() if name.startswith("X-Kvgate")}
    found = SUMMARIZED.match(said)
    assert found is not None, said
    return int(found.group(3).replace(",", "")), int(found.group(4).replace(",", "")), found.group(5) is not None


def sse_events(raw: bytes) -> list[Any]:
    """The data of each server-sent event; the stream must be well-formed and end with [DONE]."""
    text = raw.decode()
    assert text.endswith("\n\n"), text[-200:]
    data = []
    for event in text.strip("\n").split("\n\n"):
        lines = [line for line in event.split("\n") if not line.startswith(":")]
        assert lines and all(line.startswith("data: ") for line in lines), event
        data.append("\n".join(line[len("data: "):] for line in lines))
    assert data[-1] == "[DONE]", data[-3:]
    return [orjson.loads(item) for item in data[:-1]]


def record(case: str, status: int, headers: dict[str, str], before: int, after: int, calls: float) -> None:
    said = headers.get("X-Kvgate-Summarized") or "-"
    ROWS.append(f"{case:23s} {status:6d} {before:7d} {after:6d} {calls:6.0f}  {said}")


async def ask_openai(url: str, messages: list[dict[str, Any]], stream: bool) -> tuple[int, dict[str, str], int]:
    """One chat to the llama-server's model; returns status, headers and the server's own prompt_tokens."""
    body: dict[str, Any] = {"model": CPP_MODEL, "stream": stream, "messages": messages, "max_tokens": REPLY_TOKENS}
    if stream:
        body["stream_options"] = {"include_usage": True}
    status, headers, raw = await post(url, "/v1/chat/completions", body)
    assert status == 200, raw[:500]
    if stream:
        assert headers["Content-Type"].startswith("text/event-stream")
        chunks = sse_events(raw)
        assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
        usage = next(chunk["usage"] for chunk in reversed(chunks) if chunk.get("usage"))
    else:
        reply = orjson.loads(raw)
        assert reply["choices"][0]["message"]["role"] == "assistant"
        usage = reply["usage"]
    return status, headers, int(usage["prompt_tokens"])


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_openai_chat_to_the_llama_server_is_summarized_by_it_once_and_reused(
    server: RunningLlamaServer, stream: bool,
) -> None:
    """/v1/chat/completions to the llama-server's model, too long for its 1,024 tokens: the server summarizes its
    own conversation's oldest turns (one call), the prompt fits, and the next turn reuses the summary."""
    case = f"openai/{'stream' if stream else 'plain'}"
    seed = 3 if stream else 0
    cpp_before = await scrape(server.url, "/metrics")
    async with gateway(server) as (url, _):
        messages = chat([150, 150, 150, 150, 150, 150, 150], seed)
        status, headers, served = await ask_openai(url, messages[:3], stream)  # fits: nothing to summarize
        metrics = await scrape(url, "/kvgate/metrics")
        calls = metric(metrics, "kvgate_summary_calls_total")
        record(case + " fits", status, headers, served, served, calls)
        assert calls == 0 and "X-Kvgate-Summarized" not in headers and "X-Kvgate-Trimmed" not in headers

        status, headers, served = await ask_openai(url, messages, stream)
        before, after, cached = summarized(headers)
        metrics = await scrape(url, "/kvgate/metrics")
        calls = metric(metrics, "kvgate_summary_calls_total")
        record(case, status, headers, before, after, calls)
        assert before > CPP_CONTEXT and after <= CPP_CONTEXT - REPLY_TOKENS and not cached
        assert served == after  # the llama-server's own count of the prompt it was sent
        assert calls == 1 and metric(metrics, "kvgate_summary_failures_total") == 0
        assert "X-Kvgate-Trimmed" not in headers

        # the summary request went through kvgate's admission to the llama-server: its own tenant, backend "cpp"
        assert metric(metrics, "kvgate_tenant_requests_total", tenant="kvgate-summarizer", status="200") == 1
        assert metric(metrics, "kvgate_requests_total", route="/v1/chat/completions", backend="cpp",
                      status="200") == 3  # the summary's and the client's two
        cpp_after = await scrape(server.url, "/metrics")
        predicted = (metric(cpp_after, "llamacpp:tokens_predicted_total")
                     - metric(cpp_before, "llamacpp:tokens_predicted_total"))
        assert 1 <= predicted <= SUMMARY_MAX_TOKENS + 2 * REPLY_TOKENS  # the summary's tokens and the replies'

        # the next turn: the same oldest turns, so the same summary, with no new call
        messages += [{"role": "assistant", "content": words(40, seed + 7)}, {"role": "user", "content": "go on"}]
        status, headers, served = await ask_openai(url, messages, stream)
        before, after, cached = summarized(headers)
        metrics = await scrape(url, "/kvgate/metrics")
        calls = metric(metrics, "kvgate_summary_calls_total")
        record(case + " next", status, headers, before, after, calls)
        assert cached and calls == 1 and metric(metrics, "kvgate_summary_cache_hits_total") == 1
        assert before > CPP_CONTEXT and after <= CPP_CONTEXT - REPLY_TOKENS and served == after


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_ollama_chat_to_the_simulator_is_summarized_by_the_llama_server(
    server: RunningLlamaServer, stream: bool,
) -> None:
    """/api/chat to the simulated Ollama's llama3.1:8b, too long for its 2,048 tokens: the tiny model on the
    llama-server writes the summary (a smaller model elsewhere), and the prompt the simulator evaluates fits."""
    case = f"ollama/{'stream' if stream else 'plain'}"
    seed = 5 if stream else 1
    cpp_before = await scrape(server.url, "/metrics")
    async with gateway(server) as (url, sim):
        messages = chat([160, 160, 160, 160, 500, 500, 500], seed)
        body = {"model": SIM_MODEL, "stream": stream, "messages": messages, "options": {"num_predict": REPLY_TOKENS}}
        status, headers, raw = await post(url, "/api/chat", body)
        assert status == 200, raw[:500]
        if stream:
            lines = [orjson.loads(line) for line in raw.splitlines() if line.strip()]
            assert lines[-1]["done"] is True and not any(line["done"] for line in lines[:-1])
            final = lines[-1]
        else:
            final = orjson.loads(raw)
        before, after, cached = summarized(headers)
        metrics = await scrape(url, "/kvgate/metrics")
        calls = metric(metrics, "kvgate_summary_calls_total")
        record(case, status, headers, before, after, calls)
        assert before > SIM_CONTEXT and after <= SIM_CONTEXT - REPLY_TOKENS and not cached
        assert final["prompt_eval_count"] == after <= SIM_CONTEXT  # what the simulator evaluated fits
        assert calls == 1 and metric(metrics, "kvgate_summary_failures_total") == 0
        assert "X-Kvgate-Trimmed" not in headers

        # the summary went through kvgate to the llama-server, and only there: the simulator runs llama3.1:8b alone
        assert metric(metrics, "kvgate_tenant_requests_total", tenant="kvgate-summarizer", status="200") == 1
        assert metric(metrics, "kvgate_requests_total", backend="cpp", status="200") == 1
        assert metric(metrics, "kvgate_requests_total", route="/api/chat", backend="sim", status="200") == 1
        cpp_after = await scrape(server.url, "/metrics")
        predicted = (metric(cpp_after, "llamacpp:tokens_predicted_total")
                     - metric(cpp_before, "llamacpp:tokens_predicted_total"))
        assert 1 <= predicted <= SUMMARY_MAX_TOKENS  # nothing but the summary ran there
        async with aiohttp.ClientSession() as http, http.get(f"{sim}/sim/stats") as response:
            loaded = {entry["model"] for entry in (await response.json())["loaded"]}
        assert loaded == {SIM_MODEL}

