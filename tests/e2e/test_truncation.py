"""Silent truncation is seen: a reply whose reported prompt is short of kvgate's count is logged with the request id,
counted in ``kvgate_truncations_total``, shown on ``/kvgate/status`` and, for a reply not yet started, named in
``X-Kvgate-Truncated``. The simulated Ollama truncates as the real one does (facts/ollama.md section 4.6)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

import gateway
from gateway.observability.truncation import (
    EXACT_SLACK_TOKENS,
    INEXACT_SLACK_TOKENS,
    TRUNCATED_HEADER,
    detect,
    tolerance_tokens,
)
from gateway.observability.truncations import OTHER_MODEL, TruncationLog, model_label
from kvsim.config import SimConfig
from tests.kvsim.helpers import running_sim
from tests.support.fake_backend import Handler, json_answer, serve
from tests.support.gateway_server import running_gateway
from tests.support.poll import until

VOCAB = Path(gateway.__file__).parent / "data" / "vocab"
MODEL = "llama3.1:8b"
METRIC = "kvgate_truncations_total"


@pytest.mark.parametrize(
    ("counted", "exact", "byte_estimate", "margin", "expected"),
    [
        (0, True, False, 0.1, 0),
        (10, True, False, 0.1, EXACT_SLACK_TOKENS),  # the fixed slack wins on small prompts
        (400, True, False, 0.1, EXACT_SLACK_TOKENS),
        (401, True, False, 0.1, 5),  # 1%, rounded up
        (6078, True, False, 0.1, 61),
        (50, False, False, 0.1, INEXACT_SLACK_TOKENS),  # an uncalibrated small chat may be over-counted 4x
        (6078, False, False, 0.1, 1520),  # a tokenizer with the template overhead still a guess: 25%
        (50, False, True, 0.1, INEXACT_SLACK_TOKENS),
        (1000, False, True, 0.1, 546),  # 1000 - floor(1000 / (2 * 1.1))
        (6078, False, True, 0.1, 3316),
        (6078, False, True, 0.0, 3039),
        (6078, False, True, -1.0, 3039),  # a nonsensical margin counts as none
    ],
)
def test_tolerance(counted: int, exact: bool, byte_estimate: bool, margin: float, expected: int) -> None:
    assert tolerance_tokens(counted, exact=exact, byte_estimate=byte_estimate, estimate_margin=margin) == expected


@pytest.mark.parametrize(
    ("counted", "reported", "exact", "counter", "truncated"),
    [
        (6078, 2051, True, "gguf", True),  # the reproduced case: Ollama kept about half of num_ctx 4096
        (6078, 2051, False, "gguf", True),
        (6078, 2051, False, "estimate", True),  # an estimate that far off is a truncation too
        (4500, 2051, False, "gguf", True),  # just over num_ctx, cut to half
        (6078, 6017, True, "gguf", False),  # within 1%
        (6078, 6016, True, "gguf", True),
        (6078, 5000, False, "gguf", False),  # the template overhead not learned yet
        (6078, 4000, False, "estimate", False),  # English runs more bytes per token than the estimate assumes
        (6078, 7000, True, "gguf", False),  # more than counted is never a truncation
        (6078, None, True, "gguf", False),  # no figure in the reply
        (100, 20, False, "gguf", False),  # an uncalibrated small count
    ],
)
def test_detect(counted: int, reported: int | None, exact: bool, counter: str, truncated: bool) -> None:
    found = detect(counted, reported, exact=exact, estimate_margin=0.1, counter=counter)
    assert (found is not None) == truncated


def test_the_header_names_both_figures_of_the_forwarded_count() -> None:
    found = detect(6078, 2051, exact=True, estimate_margin=0.1, counter="gguf")
    assert found is not None and found.counter == "gguf" and found.missing_tokens == 4027
    assert found.describe() == "backend reported 2,051 prompt tokens; kvgate counted 6,078"
    estimated = detect(6078, 2051, exact=False, estimate_margin=0.1, counter="estimate")
    assert estimated is not None and estimated.describe().endswith("6,078 (estimate)")
    assert detect(6078, None, exact=True, estimate_margin=0.1) is None


def test_model_label_is_bounded_by_the_backend_list() -> None:
    assert model_label({"llama3.1:8b", "qwen:7b"}, "llama3.1:8b") == "llama3.1:8b"
    assert model_label({"tiny:latest", "qwen:7b"}, "tiny") == "tiny:latest"
    assert model_label({"only.gguf"}, "made-up-name") == "only.gguf"  # llama-server serves its one model
    assert model_label({"a", "b"}, "x" * 500) == OTHER_MODEL
    assert model_label(set(), None) == OTHER_MODEL


def test_truncation_log_keeps_counts_and_the_latest_events() -> None:
    book = TruncationLog(keep=2, wall_clock=lambda: 0.0)
    for index in range(3):
        book.add(request_id=f"r{index}", backend="sim", model=MODEL, counted_tokens=100, reported_tokens=10,
                 counter="gguf")
    snapshot = book.snapshot()
    assert snapshot["counts"] == [{"backend": "sim", "model": MODEL, "truncations": 3}]
    assert [event["request_id"] for event in snapshot["recent"]] == ["r2", "r1"]
    assert snapshot["recent"][0]["at"] == "1970-01-01T00:00:00Z"


@pytest.fixture
async def sim() -> AsyncIterator[str]:
    """Ollama loading at num_ctx 4096 whatever a /v1 client does (OLLAMA_CONTEXT_LENGTH)."""
    config = SimConfig(models=(MODEL,), context_length=4096, load_s=0.05, time_scale=50.0,
                       min_response_tokens=2, max_response_tokens=4)
    async with running_sim(config) as url:
        yield url


def _long_prompt() -> str:
    return " ".join(f"w{i}" for i in range(2250))  # about 6,000 tokens on the simulated tokenizer


def _requests() -> list[tuple[str, dict[str, Any]]]:
    messages = [{"role": "user", "content": _long_prompt()}]
    return [
        ("/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 4}),
        ("/api/chat", {"model": MODEL, "messages": messages, "stream": False,
                       "options": {"num_ctx": 4096, "num_predict": 4}}),
        ("/api/chat", {"model": MODEL, "messages": messages, "stream": True,
                       "options": {"num_ctx": 4096, "num_predict": 4}}),
        ("/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 4, "stream": True,
                                  "stream_options": {"include_usage": True}}),
    ]


async def _warm(http: aiohttp.ClientSession, url: str, path: str, body: dict[str, Any]) -> None:
    """Send a short request until kvgate counts with the model's tokenizer (it loads in the background while the
    first requests get the byte estimate, whose apparent truncations are checked by a recount, not named)."""
    async def counted_with_the_tokenizer() -> bool:
        async with http.post(url + path, json=body) as response:
            await response.read()
            return not response.headers.get("X-Kvgate-Counter", "estimate").startswith("estimate")

    await until(counted_with_the_tokenizer, timeout_s=10.0, interval_s=0.1)


async def _metric(http: aiohttp.ClientSession, url: str) -> float:
    async with http.get(f"{url}/kvgate/metrics") as response:
        text = await response.text()
    lines = [line for line in text.splitlines() if line.startswith(METRIC + "{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


async def test_admission_off_truncation_is_logged_counted_shown_and_named(
    sim: str, caplog: pytest.LogCaptureFixture
) -> None:
    backend = {"name": "sim", "kind": "ollama", "url": sim, "context_tokens": 4096, "parallel": 1}
    caplog.set_level(logging.WARNING, logger="gateway.proxy")
    replies = []
    async with running_gateway([backend], admission={"enabled": False}) as url, aiohttp.ClientSession() as http:
        await _warm(http, url, "/api/chat", {"model": MODEL, "stream": False, "options": {"num_predict": 1},
                                             "messages": [{"role": "user", "content": "hi"}]})
        for index, (path, body) in enumerate(_requests()):
            headers = {"X-Request-ID": f"trunc-{index}"}
            async with http.post(url + path, json=body, headers=headers) as response:
                await response.read()
                assert response.status == 200, await response.text()
                replies.append((path, body.get("stream", False), response.headers))
        assert await _metric(http, url) == len(replies)
        async with http.get(f"{url}/kvgate/metrics") as response:
            assert f'{METRIC}{{backend="sim",model="{MODEL}"}} 4.0' in await response.text()
        async with http.get(f"{url}/kvgate/status") as response:
            status = await response.json()
        async with http.get(f"{url}/kvgate/status", headers={"Accept": "text/html"}) as response:
            page = await response.text()

    for path, stream, sent in replies:
        counted = int(sent["X-Kvgate-Prompt-Tokens"])
        assert counted > 4096, (path, counted)  # longer than the context
        if stream:
            assert TRUNCATED_HEADER not in sent  # the headers had gone out before the figure came
        else:
            named = sent[TRUNCATED_HEADER]
            assert named.startswith("backend reported ") and f"kvgate counted {counted:,}" in named, named
    truncations = status["truncations"]
    assert truncations["counts"] == [{"backend": "sim", "model": MODEL, "truncations": 4}]
    recent = truncations["recent"]
    assert [event["request_id"] for event in recent] == ["trunc-3", "trunc-2", "trunc-1", "trunc-0"]
    assert all(event["reported_tokens"] < 4096 < event["counted_tokens"] for event in recent), recent
    assert "Silent truncations" in page and "trunc-0" in page
    warnings = [record for record in caplog.records if "silent truncation" in record.getMessage()]
    assert [getattr(record, "request_id", None) for record in warnings] == [f"trunc-{i}" for i in range(4)]
    assert "kvgate counted" in warnings[0].getMessage()


async def test_admission_on_keeps_the_metric_at_zero(sim: str) -> None:
    backend = {"name": "sim", "kind": "ollama", "url": sim, "context_tokens": 4096, "parallel": 1}
    async with running_gateway([backend]) as url, aiohttp.ClientSession() as http:
        for path, body in _requests():
            async with http.post(url + path, json=body) as response:
                await response.read()
                assert response.status in (200, 400), await response.text()  # refused, or trimmed to fit
                assert TRUNCATED_HEADER not in response.headers
        short = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
        async with http.post(f"{url}/v1/chat/completions", json=short) as response:
            assert response.status == 200 and TRUNCATED_HEADER not in response.headers
        assert await _metric(http, url) == 0
        async with http.get(f"{url}/kvgate/status") as response:
            assert (await response.json())["truncations"] == {"counts": [], "recent": []}


def _fake_backend(padding_bytes: int) -> dict[tuple[str, str], Handler]:
    """An OpenAI-style server that always reports a 1-token prompt, its JSON reply sent in 64 KiB pieces without a
    Content-Length (as Go servers send bodies over their buffer)."""

    async def chat(request: web.Request) -> web.StreamResponse:
        body = orjson.dumps({"choices": [{"message": {"content": "x" * padding_bytes}}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for start in range(0, len(body), 1 << 16):
            await response.write(body[start:start + (1 << 16)])
        await response.write_eof()
        return response

    listing = {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}
    return {("POST", "/v1/chat/completions"): chat, ("GET", "/v1/models"): json_answer(listing)}


@pytest.mark.parametrize(("padding_bytes", "named"), [(1 << 20, True), (6 << 20, False)])
async def test_held_replies_get_the_header_and_larger_ones_stream_on(padding_bytes: int, named: bool) -> None:
    chat = {"model": "fake-model", "messages": [{"role": "user", "content": _long_prompt()}]}
    # counted with a real tokenizer: a header is a claim to the client, never made on a byte estimate alone
    models = {"fake-model": {"gguf_path": str(VOCAB / "ggml-vocab-llama-bpe.gguf")}}
    async with serve(_fake_backend(padding_bytes)) as backend_url:
        backend = {"name": "fake", "kind": "openai", "url": backend_url}
        async with running_gateway([backend], models=models, counting={"count_budget_s": 30.0}) as url, \
                aiohttp.ClientSession() as http:
            async with http.post(f"{url}/v1/chat/completions", json=chat) as response:
                payload = orjson.loads(await response.read())
                headers = response.headers
            assert len(payload["choices"][0]["message"]["content"]) == padding_bytes
            assert (TRUNCATED_HEADER in headers) == named
            assert await _metric(http, url) == 1  # too large to hold, still counted (found in the body's tail)
            async with http.get(f"{url}/kvgate/metrics") as metrics:
                assert f'{METRIC}{{backend="fake",model="fake-model"}} 1.0' in await metrics.text()
