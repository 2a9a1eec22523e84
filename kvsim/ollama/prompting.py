"""From messages to the token list a runner evaluates: Ollama's two truncations, as the real server does them.

1. Messages (``server/prompt.go`` ``chatPrompt``, when ``truncate`` is true): drop the oldest messages until
   the rendered prompt fits ``num_ctx``, always keeping the system messages and the last message.
2. Tokens, E3 (``llm/llama_server.go`` ``completionPromptForRequest``): a prompt still longer than
   ``num_ctx - 1`` keeps its first ``num_keep`` (+BOS) tokens and the tail, ``num_ctx - max((num_ctx -
   num_keep) / 2, 1)`` tokens in all (about half of num_ctx), answered 200 with no sign of it but the smaller
   ``prompt_eval_count``; with context shift off it is 400 instead. E2 runners kept ``num_keep`` and the tail
   up to ``num_ctx``.
3. ``truncate: false`` skips both; the runner then refuses a prompt that does not fit its slot (E3: llama-server's
   400 ``exceed_context_size_error`` relayed as a string; E2: ``the input length exceeds the context length``).

Pure apart from tokenizing (the tokenizer is passed in).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from kvsim.failures import SimError
from kvsim.templates import Message, render
from kvsim.vocab import SimTokenizer

IMAGE_TOKENS = 768
PROMPT_TOO_LONG = (
    "the prompt is longer than the context length currently available to the model; shorten the prompt, "
    "adjust the context length in settings, or use a model with a longer context length"
)
INPUT_TOO_LONG = "the input length exceeds the context length"


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    tokens: list[int]
    dropped_messages: int  # oldest non-system messages left out


def chat_prompt(
    template: str,
    tokenizer: SimTokenizer,
    messages: Sequence[Message],
    *,
    num_ctx: int,
    truncate: bool,
    vision: bool,
) -> RenderedPrompt:
    """``chatPrompt``: the first suffix of the conversation (plus earlier system messages) that fits."""
    last = len(messages) - 1
    start = 0
    if truncate:
        for i in range(last + 1):
            kept = [m for m in messages[:i] if m.role == "system"] + list(messages[i:])
            n_tokens = len(tokenizer.encode(render(template, kept)))
            if vision:
                n_tokens += IMAGE_TOKENS * sum(m.images for m in messages[i:])
            if n_tokens <= num_ctx or i == last:
                start = i
                break
    kept = [m for m in messages[:start] if m.role == "system"] + list(messages[start:])
    text = render(template, kept)
    dropped = sum(1 for m in messages[:start] if m.role != "system")
    return RenderedPrompt(text=text, tokens=tokenizer.encode(text), dropped_messages=dropped)


def context_shift_limit(num_ctx: int, num_keep: int) -> int:
    """``contextShiftPromptLimit``."""
    if num_ctx <= 1:
        return 0
    num_keep = max(0, min(num_keep, num_ctx - 1))
    return num_ctx - max((num_ctx - num_keep) // 2, 1)


def fit_tokens_e3(
    tokens: list[int], *, num_ctx: int, num_keep: int, adds_bos: bool, shift: bool, truncate: bool
) -> list[int]:
    """E3 ``completionPromptForRequest``: the tokens sent to llama-server (SimError 400 when shift is off)."""
    full_limit = num_ctx - 1
    if not truncate or num_ctx <= 1 or len(tokens) <= full_limit:
        return tokens
    if not shift:
        raise SimError(400, PROMPT_TOO_LONG)
    keep = len(tokens) if num_keep < 0 else num_keep
    keep = min(keep + (1 if adds_bos else 0), full_limit)
    limit = context_shift_limit(num_ctx, keep)
    discard = len(tokens) - limit
    return tokens[:keep] + tokens[keep + discard :]


def fit_tokens_e2(tokens: list[int], *, num_ctx: int, num_keep: int, truncate: bool) -> list[int]:
    """E1/E2 runners: keep ``num_keep`` and the tail up to ``num_ctx``; 400 with ``truncate: false``."""
    if len(tokens) <= num_ctx:
        return tokens
    if not truncate:
        raise SimError(400, INPUT_TOO_LONG)
    keep = max(0, min(num_keep, num_ctx - 1))
    discard = len(tokens) - num_ctx
    return tokens[:keep] + tokens[keep + discard :]


def exceed_context_body(n_prompt_tokens: int, n_ctx_slot: int) -> str:
    """llama-server's 400 body for a prompt that does not fit its slot (llama-server.md section 7)."""
    return orjson.dumps(
        {
            "error": {
                "code": 400,
                "message": f"request ({n_prompt_tokens} tokens) exceeds the available context size "
                f"({n_ctx_slot} tokens), try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": n_prompt_tokens,
                "n_ctx": n_ctx_slot,
            }
        }
    ).decode()
