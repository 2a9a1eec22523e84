"""Issue 22 point 4: an estimate never refuses. OpenAI-compatible backends (``kind = "openai"``) are counted exactly
where they can be (the server's /tokenize, a configured tokenizer.json); otherwise the request is forwarded with
its output at the estimate floor, and the backend's own 400 stands for a prompt that really is too long.

Backends: a vLLM-shaped fake (tests/support/fake_vllm.py, its /tokenize on or off) and the simulator in llama-server
mode configured as ``kind = "openai"``. The issue's case: a 2,602-token prompt on a 4,096-token context, which
kvgate's byte estimate (with its margins) takes for 4,200 tokens and used to refuse in 1 ms, naming the model ''.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from openai import AsyncOpenAI, BadRequestError

from gateway.tokens.byte_estimate import EstimateCounter
from tests.support.fake_vllm import FakeVllm, chat_tokens, running_vllm
from tests.support.gateway_server import running_gateway
from tests.support.poll import until

CONTEXT = 4096
ISSUE_PROMPT_TOKENS = 2602
MODEL = "qwen2.5-7b-instruct"


def words(n_bytes: int) -> str:
    """English-looking text of exactly ``n_bytes`` ASCII bytes."""
    text = ("the quick brown fox jumps over the lazy dog and then reads the release notes again " * 400)
    return text[:n_bytes]


def issue_chat(prompt_tokens: int = ISSUE_PROMPT_TOKENS) -> list[dict[str, str]]:
    """One user message the fake vLLM counts as ``prompt_tokens`` (4 bytes a token, 7 for the template)."""
    return [{"role": "user", "content": words((prompt_tokens - 7) * 4)}]


def vllm_backend(url: str, **extra: Any) -> dict[str, Any]:
    return {"name": "vllm", "kind": "openai", "url": url, "parallel": 2, "context_tokens": CONTEXT, **extra}


async def post(url: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
    async with aiohttp.ClientSession() as http, http.post(f"{url}{path}", json=body) as response:
        return response.status, dict(response.headers), orjson.loads(await response.read())


async def estimate_with_margins(messages: list[dict[str, str]]) -> int:
    """What kvgate's byte estimate, with the admission margin, makes of the chat: over the context here."""
    counted = await EstimateCounter().count_chat(messages)
    return math.ceil(counted.tokens * 1.1)


ROWS: list[tuple[str, bool, dict[str, Any], dict[str, Any], int, str]] = [
    # (case, vLLM has /tokenize, backend extras, request extras, status expected, what answers)
    ("the issue's prompt, /tokenize", True, {}, {}, 200, "vllm; exact"),
    ("the issue's prompt, no /tokenize", False, {}, {}, 200, "estimate; estimate"),
    ("the issue's prompt, no /tokenize, max_tokens 3000", False, {}, {"max_tokens": 3000}, 200, "estimate; estimate"),
    ("5,000 tokens, no /tokenize: the backend's 400", False, {}, {"prompt_tokens": 5000}, 400, "backend"),
]


@pytest.mark.parametrize(("case", "tokenize", "backend", "extra", "status", "counter"), ROWS,
                         ids=[row[0] for row in ROWS])
async def test_an_estimate_never_refuses_on_an_openai_backend(
    case: str, tokenize: bool, backend: dict[str, Any], extra: dict[str, Any], status: int, counter: str
) -> None:
    extra = dict(extra)
    messages = issue_chat(extra.pop("prompt_tokens", ISSUE_PROMPT_TOKENS))
    assert await estimate_with_margins(messages) > CONTEXT or "5,000" in case  # the estimate alone says too long
    async with running_vllm(FakeVllm(tokenize=tokenize)) as vllm, \
            running_gateway([vllm_backend(vllm.url, **backend)]) as url:
        got, headers, body = await post(url, "/v1/chat/completions", {"model": MODEL, "messages": messages, **extra})
        forwarded = vllm.bodies("/v1/chat/completions")
    print(f"\n{case:50s} {got} counter={headers.get('X-Kvgate-Counter')!s:22s} "
          f"rewrite={headers.get('X-Kvgate-Rewrite')} {str(body)[:110]}")
    assert got == status, body
    if counter == "backend":  # the backend judged, with its exact count: its own 400, relayed as it said it
        assert body["type"] == "BadRequestError" and "maximum context length is 4096 tokens" in body["message"]
        assert len(forwarded) == 1 and forwarded[0]["messages"] == messages
        return
    assert headers["X-Kvgate-Counter"] == counter and len(forwarded) == 1
    assert forwarded[0]["messages"] == messages  # never trimmed on an estimate: the prompt may fit
    if counter.startswith("estimate"):  # the output at the floor: a quarter of the context, at most 1,024
        assert forwarded[0]["max_tokens"] == 1024
        was = "unset" if "max_tokens" not in extra else str(extra["max_tokens"])
        assert headers["X-Kvgate-Rewrite"] == f"max_tokens=1024 (was {was})"
        assert int(headers["X-Kvgate-Reserved-Tokens"]) == CONTEXT  # at most the context
    assert body["usage"]["prompt_tokens"] == ISSUE_PROMPT_TOKENS


async def test_the_tokenize_endpoint_is_probed_once_per_backend() -> None:
    async with running_vllm(FakeVllm()) as vllm, running_gateway([vllm_backend(vllm.url)]) as url:
        for _ in range(3):
            for model in (MODEL, MODEL):
                assert (await post(url, "/v1/chat/completions", {"model": model, "messages": issue_chat(100)}))[0] \
                    == 200
        probes = [b for b in vllm.bodies("/tokenize") if "model" not in b]
        counts = [b for b in vllm.bodies("/tokenize") if "model" in b]
    assert len(probes) == 1 and len(counts) >= 6


async def test_a_counted_refusal_names_the_model_the_client_asked_for() -> None:
    """A prompt really too long (counted by the server's /tokenize), refused with on_too_long = "reject": kvgate's
    400 names the client's model and the backend, never ''. By default the message is cut instead (trimmed)."""
    messages = issue_chat(5000)
    body = {"model": MODEL, "messages": messages}
    async with running_vllm(FakeVllm()) as vllm, \
            running_gateway([vllm_backend(vllm.url)], admission={"on_too_long": "reject"}) as url:
        status, _, refused = await post(url, "/v1/chat/completions", body)
        assert vllm.bodies("/v1/chat/completions") == []
    message = refused["error"]["message"]
    assert status == 400 and refused["error"]["code"] == "context_length_exceeded"
    assert f"prompt is {chat_tokens(list(messages)):,} tokens; model '{MODEL}' on backend 'vllm'" in message
    assert "''" not in message and "estimated" not in message
    async with running_vllm(FakeVllm()) as vllm, running_gateway([vllm_backend(vllm.url)]) as url:
        status, headers, answered = await post(url, "/v1/chat/completions", body)
    assert status == 200, answered
    assert headers["X-Kvgate-Trimmed"].startswith("cut message 1 of 1 (user): kept the first ")


async def test_the_simulated_llama_server_as_kind_openai_is_counted_by_its_own_routes() -> None:
    from kvsim.config import SimConfig
    from kvsim.runner import start_sim

    runner, sim = await start_sim(SimConfig(mode="llama-server", ctx_size=CONTEXT, time_scale=50.0))
    try:
        messages = [{"role": "user", "content": words(11_500)}]
        exact = (await post(sim, "/v1/chat/completions/input_tokens", {"messages": messages}))[2]["input_tokens"]
        assert exact < CONTEXT - 1024 < CONTEXT < await estimate_with_margins(messages)
        backend = {"name": "cpp", "kind": "openai", "url": sim, "parallel": 4, "context_tokens": CONTEXT,
                   "unified_kv": True}
        async with running_gateway([backend]) as url:
            status, headers, body = await post(url, "/v1/chat/completions",
                                               {"model": "llama3.1:8b", "messages": messages, "max_tokens": 8})
    finally:
        await runner.cleanup()
    print(f"\nsimulated llama-server as kind=openai: {status} {headers.get('X-Kvgate-Counter')} "
          f"{headers.get('X-Kvgate-Prompt-Tokens')} tokens (the server counts {exact})")
    assert status == 200, body
    assert headers["X-Kvgate-Counter"] == "llama-server; exact" and int(headers["X-Kvgate-Prompt-Tokens"]) == exact
    assert body["usage"]["prompt_tokens"] == exact


async def test_a_configured_tokenizer_json_counts_an_openai_backend_exactly(tmp_path: Path) -> None:
    from tests.tokens.vocab_vectors import shared_tokenizer

    path = tmp_path / "tokenizer.json"
    shared_tokenizer("qwen2").save(str(path))
    models = {MODEL: {"tokenizer_json": str(path), "chat_template": "chatml"}}
    async with running_vllm(FakeVllm(tokenize=False)) as vllm, \
            running_gateway([vllm_backend(vllm.url)], models=models) as url:

        async def counted() -> str:  # the first requests are estimated while the tokenizer loads (count_budget_s)
            status, headers, body = await post(url, "/v1/chat/completions",  # (the fake counts otherwise than
                                               {"model": MODEL, "messages": issue_chat(), "max_tokens": 100})  # qwen)
            assert status == 200, body
            return headers["X-Kvgate-Counter"]

        assert await until(lambda: _exact(counted), timeout_s=30) == "tokenizer.json; exact"


async def _exact(counted: Any) -> str | None:
    said: str = await counted()
    return said if said.endswith("exact") else None


async def test_a_tenant_prompt_cap_is_not_enforced_on_an_estimate() -> None:
    """A prompt of 1,800 tokens, estimated at about 2,700 against the tenant's cap of 2,000: no exact count to be
    had, so it goes on (the cap applies to counts); with /tokenize, the real count is under the cap anyway."""
    tenants = {"ci": {"api_keys": ["ci-key-0123456789"], "max_prompt_tokens": 2000}}
    client_body = {"model": MODEL, "messages": issue_chat(1800)}
    for tokenize in (False, True):
        async with running_vllm(FakeVllm(tokenize=tokenize)) as vllm, \
                running_gateway([vllm_backend(vllm.url)], tenants=tenants) as url, aiohttp.ClientSession() as http, \
                http.post(f"{url}/v1/chat/completions", json=client_body,
                          headers={"Authorization": "Bearer ci-key-0123456789"}) as response:
            assert response.status == 200, await response.text()
            assert response.headers["X-Kvgate-Counter"] == ("vllm; exact" if tokenize else "estimate; estimate")


async def test_the_official_openai_client_gets_the_issues_prompt_answered_and_a_real_overflow_from_the_backend(
) -> None:
    async with running_vllm(FakeVllm(tokenize=False)) as vllm, running_gateway([vllm_backend(vllm.url)]) as url:
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        answer = await client.chat.completions.create(model=MODEL, messages=issue_chat())  # type: ignore[arg-type]
        assert answer.usage is not None and answer.usage.prompt_tokens == ISSUE_PROMPT_TOKENS
        with pytest.raises(BadRequestError) as too_long:
            await client.chat.completions.create(model=MODEL, messages=issue_chat(5000))  # type: ignore[arg-type]
        assert "maximum context length is 4096 tokens" in str(too_long.value)  # vLLM's words, not kvgate's
        await client.close()
