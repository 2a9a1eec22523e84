"""PromptCounter through its public methods: which chains it keeps, when it estimates instead of counting, and the
count budget that hands a slow first count to the background."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest

from gateway.backends import Backend
from gateway.backends.client import BackendClient, BackendStatusError
from gateway.config.settings import load_settings
from gateway.dialects import parse
from gateway.domain import Dialect, Operation, ParsedRequest
from gateway.runtimes import runtime_for
from gateway.tokens.prompt_counter import UNLISTED_CHAINS, PromptCounter

VOCAB = Path(__file__).resolve().parents[2] / "gateway" / "data" / "vocab"
LISTED = "listed-model"
CONFIGURED = "configured-model"


class NoTokenizeClient:
    """The backend's client, for a server without a tokenize endpoint (its /tokenize answers 404)."""

    label = "backend 'api'"

    async def post_json(self, path: str, body: Any, *, timeout_s: float | None = None) -> dict[str, Any]:
        error = BackendStatusError(f"POST {path} on backend 'api' answered HTTP 404: Not Found")
        error.backend_status = 404
        raise error


def setup(**counting: Any) -> tuple[PromptCounter, Backend]:
    settings = load_settings(
        None, backends=[{"name": "api", "kind": "openai", "url": "http://127.0.0.1:9"}],
        models={CONFIGURED: {"gguf_path": str(VOCAB / "ggml-vocab-llama-bpe.gguf")}}, counting=counting,
    )
    backend = Backend(settings.backends[0], cast(BackendClient, NoTokenizeClient()), models=frozenset({LISTED}),
                      runtime=runtime_for(settings.backends[0].kind))
    return PromptCounter(settings, runtime_for), backend


def chat(model: str, content: str = "Hello there, how are you today?") -> ParsedRequest:
    body = {"model": model, "messages": [{"role": "user", "content": content}]}
    return parse(Dialect.OPENAI, Operation.CHAT, body, "/v1/chat/completions")


async def test_listed_and_configured_models_keep_one_chain_each() -> None:
    counter, backend = setup()
    listed = await counter.chain(backend, LISTED)
    assert await counter.chain(backend, LISTED) is listed
    await counter.chain(backend, CONFIGURED)
    assert counter.chains_held() == 2
    for index in range(UNLISTED_CHAINS * 3):  # made-up names do not push the kept ones out
        await counter.chain(backend, f"made-up-{index}")
    assert await counter.chain(backend, LISTED) is listed
    assert counter.chains_held() == 2 + UNLISTED_CHAINS


async def test_unlisted_chains_are_a_least_recently_used_cache() -> None:
    counter, backend = setup()
    first = await counter.chain(backend, "made-up-0")
    evicted = await counter.chain(backend, "made-up-1")
    for index in range(2, UNLISTED_CHAINS):
        await counter.chain(backend, f"made-up-{index}")
    assert await counter.chain(backend, "made-up-0") is first  # used again: now the most recent
    await counter.chain(backend, "made-up-new")  # pushes out made-up-1, the least recently used
    assert counter.chains_held() == UNLISTED_CHAINS
    assert await counter.chain(backend, "made-up-0") is first
    assert await counter.chain(backend, "made-up-1") is not evicted  # built anew
    assert counter.chains_held() == UNLISTED_CHAINS


async def test_a_prompt_over_exact_count_max_bytes_is_estimated() -> None:
    counter, backend = setup(exact_count_max_bytes=1000, count_budget_s=30.0)
    exact = await counter.count(chat(CONFIGURED), backend)
    assert exact.exact and exact.counter != "estimate"
    big = await counter.count(chat(CONFIGURED, "word " * 400), backend)
    assert big.counter == "estimate" and not big.exact
    assert big.tokens > 0


async def test_a_count_over_its_budget_is_estimated_and_finishes_in_the_background() -> None:
    counter, backend = setup(count_budget_s=30.0)
    first = await counter.count(chat(CONFIGURED), backend, budget_s=0.0)  # the tokenizer isn't built yet
    assert first.counter == "estimate" and not first.exact
    later = await counter.count(chat(CONFIGURED), backend)  # waits for the count under way, within its budget
    assert later.exact and later.counter != "estimate"
    again = await counter.count(chat(CONFIGURED), backend, budget_s=0.0)  # warm now: no budget to fall back on
    assert again == later


async def test_a_request_without_a_prompt_is_refused() -> None:
    counter, backend = setup()
    tokenize = parse(Dialect.LLAMACPP, Operation.TOKENIZE, {"content": "x"}, "/tokenize")
    with pytest.raises(ValueError, match="no prompt to count"):
        await counter.count(tokenize, backend)


async def test_an_embedding_counts_each_input_on_its_own() -> None:
    """Each input of an embedding is a task (and a sequence) of its own on llama-server: counted one by one."""
    counter, backend = setup()
    embed = parse(Dialect.OPENAI, Operation.EMBED, {"model": LISTED, "input": ["one two", "three", [1, 2, 3]]},
                  "/v1/embeddings")
    counted = await counter.count(embed, backend)
    assert len(counted.per_prompt) == 3 and counted.per_prompt[2] == 3
    assert counted.tokens == sum(counted.per_prompt)


async def test_prompts_tokenized_at_once_stay_within_max_tokenizing_bytes() -> None:
    """Eight chats counted at once (the issue-23 attack: 8 x 3.9 MiB, just under exact_count_max_bytes, took RSS
    from 224 MB to 2.4 GB): at most max_tokenizing_bytes of them are tokenized at a time. With a long count budget
    the rest wait their turn and are counted exactly; with a short one they are estimated, flagged."""
    content = "word " * 20_000
    size = len(content)
    counter, backend = setup(max_tokenizing_bytes=2 * size + size // 2, count_budget_s=30.0)
    await counter.count(chat(CONFIGURED), backend)  # its tokenizer is loaded
    counts = await asyncio.gather(*(counter.count(chat(CONFIGURED, f"{i} {content}"), backend) for i in range(8)))
    assert all(c.exact and c.counter != "estimate" for c in counts)
    assert size * 2 <= counter.tokenizing.peak_bytes <= 2 * size + size // 2
    assert counter.tokenizing.held_bytes == 0

    counter, backend = setup(max_tokenizing_bytes=2 * size + size // 2, count_budget_s=0.001)
    await counter.count(chat(CONFIGURED), backend, budget_s=30.0)  # loaded: the eight find it warm
    counts = await asyncio.gather(*(counter.count(chat(CONFIGURED, f"{i} {content}"), backend) for i in range(8)))
    estimated = [c for c in counts if c.counter == "estimate"]
    print(f"\n8 chats of {size:,} bytes, budget {counter.tokenizing.limit_bytes:,}: "
          f"{len(estimated)} estimated, peak {counter.tokenizing.peak_bytes:,} bytes")
    assert estimated and all(not c.exact for c in estimated)
    assert counter.tokenizing.peak_bytes <= 2 * size + size // 2
