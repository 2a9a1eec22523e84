"""No false refusals from the first request (issue 9, point 7).

A FRESH kvgate in front of the simulated Ollama gets 17 varied chats of one model (three tests: one per model
family), with and without a system prompt, one to many turns, tool results where the family has them, unicode,
lengths spread up to the context. Each chat's true prompt length is the simulator's own render + tokenize, checked
against the prompt_eval_count it reports. Every chat whose true prompt plus its output fits the context must be
forwarded unchanged, and the count kvgate states in X-Kvgate-Prompt-Tokens must equal prompt_eval_count when the
counter calls it exact (phi3 included: the simulator gives phi-3's special tokens llama.cpp's right-strip, so
`<|end|>\n` is one token in both), and be within the counter's stated tolerance (the one kvgate's truncation check
allows it) when it calls it an estimate.

kvgate runs with its DEFAULT counting settings and an empty tokenizer cache, as on a first start. Converting a
model's tokenizer from /api/show takes 0.7-1.8 s here, longer than `count_budget_s` (0.25 s), so the first chat of
each model is counted with the byte estimate; admission then waits up to `refusal_count_wait_s` for the real count
before it would refuse or trim on that estimate, so a first chat the estimate puts over the context still goes
through (and its reply states the exact count), and one that fits even by the estimate goes through with the
estimate (its reply says "estimate"). The table says which.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.observability.truncation import tolerance_tokens
from kvsim.catalog import lookup, select
from kvsim.config import SimConfig
from kvsim.templates import Message, render
from kvsim.vocab import tokenizer_for
from tests.kvsim.helpers import running_sim
from tests.support.gateway_server import running_gateway
from tests.tokens.vocab_vectors import SESSION_CACHE_DIR, warm_sim_tokenizers

CONTEXT_TOKENS = 4096
MODELS = ("llama3.1:8b", "qwen2.5:7b", "phi3:mini")
TOOL_FAMILIES = ("llama3", "qwen2")
_TEXT = ("the model answers quickly because the context holds every token we send; café naïve 東京 😀 numbers "
         "3.14159 and 2048, code `print(1)`, <b>tags</b> & symbols")
WORDS = tuple(_TEXT.split(" "))
ESTIMATE_MARGIN = 0.10  # counting.estimate_safety_margin, default
CHATS_PER_MODEL = 17  # 51 chats over the three models, as one fresh kvgate per model


def true_prompt_tokens(model: str, messages: list[dict[str, Any]]) -> int:
    spec = lookup(select(MODELS), model)
    assert spec is not None
    rendered = render(spec.template, [Message(m["role"], m["content"]) for m in messages])
    return len(tokenizer_for(spec, cache_dir=SESSION_CACHE_DIR).encode(rendered))


def make_chat(rng: random.Random, model: str, target_tokens: int, output_tokens: int) -> list[dict[str, Any]]:
    """A chat of about `target_tokens` true prompt tokens (never more than the context minus the output)."""
    family = lookup(select(MODELS), model)
    assert family is not None
    roles: list[str] = ["system"] if rng.random() < 0.5 else []
    for turn in range(rng.choice((0, 0, 1, 2, 4, 8))):
        roles += ["user", "assistant"]
        if family.template in TOOL_FAMILIES and rng.random() < 0.3:
            roles += ["tool", "assistant"] if turn % 2 else ["tool"]
            if roles[-1] == "tool":
                roles.append("assistant")
    roles.append("user")
    share = max(1, int(target_tokens / 1.6 / len(roles)))
    texts = [[rng.choice(WORDS) for _ in range(rng.randint(max(1, share // 2), share * 3 // 2 + 1))] for _ in roles]
    chat = [{"role": r, "content": " ".join(t)} for r, t in zip(roles, texts, strict=True)]
    while true_prompt_tokens(model, chat) + output_tokens > CONTEXT_TOKENS:
        longest = max(range(len(texts)), key=lambda i: len(texts[i]))
        del texts[longest][-max(1, len(texts[longest]) // 20):]
        chat[longest]["content"] = " ".join(texts[longest])
    return chat


def test_simulated_phi3_strips_whitespace_after_special_tokens_like_llama_cpp() -> None:
    """llama.cpp gives phi-3's special tokens (but <s>, <unk>, <|endoftext|>) the right-strip attribute: the
    whitespace after them is swallowed, and the text after a special token gets SentencePiece's space prefix."""
    spec = lookup(select(MODELS), "phi3:mini")
    assert spec is not None
    rendered = render(spec.template, [Message("user", "hello there"), Message("assistant", "  hi\n"),
                                      Message("user", "Be brief.")])
    assert rendered == ("<|user|>\nhello there<|end|>\n<|assistant|>\n  hi\n<|end|>\n"
                        "<|user|>\nBe brief.<|end|>\n<|assistant|>\n")
    # <s> <|user|> ▁hello ▁there <|end|> <|assistant|> ▁hi <0x0A> <|end|> <|user|> ▁Be ▁brief . <|end|> <|assistant|>
    assert tokenizer_for(spec, cache_dir=SESSION_CACHE_DIR).encode(rendered) == [
        1, 32010, 22172, 727, 32007, 32001, 7251, 13, 32007, 32010, 1522, 11473, 29889, 32007, 32001]


@pytest.fixture
async def sim() -> AsyncIterator[str]:
    config = SimConfig(models=MODELS, num_parallel=1, load_s=0.05, time_scale=50.0, context_length=CONTEXT_TOKENS,
                       min_response_tokens=2, max_response_tokens=6, gen_tokens_per_s=500.0,
                       prompt_tokens_per_s=200_000.0,
                       tokenizer_cache_dir=warm_sim_tokenizers(*MODELS))  # the simulator's: this run's shared cache
    async with running_sim(config) as url:
        yield url


@pytest.mark.parametrize("model", MODELS)
async def test_fresh_kvgate_counts_within_tolerance_and_refuses_nothing_that_fits(
    sim: str, tmp_path: Path, model: str
) -> None:
    """One model per fresh kvgate, so each test converts one tokenizer cold (CHATS_PER_MODEL chats meanwhile)."""
    rng = random.Random(f"9-{model}")
    backend = {"name": "sim", "kind": "ollama", "url": sim, "context_tokens": CONTEXT_TOKENS, "parallel": 1}
    rows: list[tuple[str, int, int, int, int, str, str]] = []
    fresh = {"cache_dir": str(tmp_path)}  # default counting settings, and an empty tokenizer cache: a first start
    async with running_gateway([backend], counting=fresh) as url, aiohttp.ClientSession() as http:
        for _ in range(CHATS_PER_MODEL):
            output_tokens = rng.choice((16, 64, 256))
            target = int(rng.uniform(0.0, 1.05) * (CONTEXT_TOKENS - output_tokens))
            chat = make_chat(rng, model, max(8, target), output_tokens)
            truth = true_prompt_tokens(model, chat)
            body = {"model": model, "stream": False, "messages": chat, "options": {"num_predict": output_tokens}}
            async with http.post(f"{url}/api/chat", json=body) as response:
                payload = await response.json()
                headers = response.headers
            counted = int(headers.get("X-Kvgate-Prompt-Tokens", -1))
            counter = headers.get("X-Kvgate-Counter", "?")
            outcome = "ok" if response.status == 200 and "X-Kvgate-Trimmed" not in headers else (
                f"{response.status} {str(payload.get('error', headers.get('X-Kvgate-Trimmed')))[:60]}")
            evaluated = int(payload.get("prompt_eval_count", -1))
            rows.append((model, len(chat), truth, output_tokens, counted, counter, outcome))
            assert evaluated == truth, (model, chat)  # the simulator evaluated exactly the chat, untruncated
    _print_table(rows)
    for model, n, truth, out, counted, counter, outcome in rows:
        row = (model, n, truth, out, counted, counter, outcome)
        assert outcome == "ok", row  # it fits: no false refusal, no trimming
        assert counter.endswith(("; exact", "; estimate")), row
        if counter.endswith("; exact"):
            assert counted == truth, row
        else:  # the counter's stated tolerance: what kvgate's truncation check allows this count
            tolerance = tolerance_tokens(counted, exact=False, byte_estimate=counter.startswith("estimate;"),
                                         estimate_margin=ESTIMATE_MARGIN)
            assert counted - tolerance <= truth, (row, tolerance)
    assert rows[-1][5].endswith("; exact"), rows[-1]  # the estimate only bridges the tokenizer's load


def _print_table(rows: list[tuple[str, int, int, int, int, str, str]]) -> None:
    print(f"\n{'model':14s} {'msgs':>4s} {'true':>6s} {'out':>4s} {'kvgate':>6s} {'diff':>5s}  {'counter':14s} outcome")
    for model, n, truth, out, counted, counter, outcome in rows:
        print(f"{model:14s} {n:4d} {truth:6d} {out:4d} {counted:6d} {counted - truth:5d}  {counter:14s} {outcome}")
    for model in dict.fromkeys(r[0] for r in rows):
        mine = [r for r in rows if r[0] == model]
        exact = sum(1 for r in mine if r[5].endswith("; exact") and r[4] == r[2])
        estimated = sum(1 for r in mine if r[5].endswith("; estimate"))
        print(f"{model:14s} {exact}/{len(mine)} counted exactly, {estimated} estimated; first reply: {mine[0][5]}")
    refused = sum(1 for r in rows if r[6] != "ok")
    print(f"{refused} of {len(rows)} refused or trimmed; largest true prompt + output: "
          f"{max(r[2] + r[3] for r in rows)} of {CONTEXT_TOKENS}")
