"""Count a request's prompt, in the one shape every dialect parses its body into (``gateway.domain.Prompt``).

    Prompt.messages (a chat)     count_chat(messages, tools): the template renders it, system prompts included
    Prompt.text (a text prompt)  a string, token ids (their length), a mix of both (BOS once), a list of prompts
                                 (the sum), or llama-server's multimodal object ({"prompt_string", ...})
    Prompt.batch (a batch)       each prompt on its own (its ``extra_tokens`` added), in ``TokenCount.per_prompt``

Where each dialect keeps those (Ollama's generate system + prompt + suffix, Anthropic's ``system``, the Responses
API's ``instructions`` and ``input`` items, llama-server's infill pieces) is the dialect's business
(``gateway/dialects/``); nothing here knows a dialect. A prompt the dialect could only approximate
(``exact_shape`` False) is counted as an estimate; an empty one counts 0, exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from gateway.domain import Prompt
from gateway.tokens.byte_estimate import utf8_length
from gateway.tokens.count import Counter, Message, TokenCount
from gateway.tokens.countable_text import content_text, json_text


async def count_prompt(prompt: Prompt, counter: Counter) -> TokenCount:
    """The prompt length a backend will see for ``prompt`` (for a batch: each prompt's, and their sum)."""
    if prompt.batch:
        return await _count_batch(prompt, counter)
    if prompt.messages is not None:
        messages: list[Message] = [m for m in prompt.messages if isinstance(m, Mapping)]
        counted = await counter.count_chat(messages, list(prompt.tools))
    else:
        counted = await _count_prompt(prompt.text, counter)
    return counted if prompt.exact_shape else replace(counted, exact=False)


async def _count_batch(prompt: Prompt, counter: Counter) -> TokenCount:
    parts = [await count_prompt(part, counter) for part in prompt.batch]
    lengths = tuple(part.tokens + item.extra_tokens for part, item in zip(parts, prompt.batch, strict=True))
    exact = prompt.exact_shape and all(part.exact for part in parts)
    return TokenCount(sum(lengths), parts[0].counter, exact, per_prompt=lengths)


async def _count_prompt(prompt: Any, counter: Counter) -> TokenCount:
    if prompt is None:
        return TokenCount(0, counter.name, exact=True)
    if isinstance(prompt, str | bytes):
        return await counter.count_text(prompt)
    if isinstance(prompt, Sequence):
        if all(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
            return TokenCount(len(prompt), "token-ids", exact=True)
        if any(isinstance(x, str) for x in prompt) and any(isinstance(x, int) for x in prompt):
            return await _count_mixed(prompt, counter)
        parts = [await _count_prompt(p, counter) for p in prompt]
        return _sum(parts, counter)
    if isinstance(prompt, Mapping):
        # llama-server multimodal prompt object: {"prompt_string": ..., "multimodal_data": [...]}
        return await _count_prompt(prompt.get("prompt_string"), counter)
    return TokenCount(0, counter.name, exact=True)


async def _count_mixed(prompt: Sequence[Any], counter: Counter) -> TokenCount:
    # llama-server: one prompt made of strings and token ids; BOS once, at the start.
    ids = sum(1 for x in prompt if isinstance(x, int))
    texts = [x for x in prompt if isinstance(x, str)]
    parts = [await counter.count_text(t, add_special=i == 0) for i, t in enumerate(texts)]
    total = _sum(parts, counter)
    return TokenCount(total.tokens + ids, total.counter, total.exact)


def _sum(parts: Sequence[TokenCount], counter: Counter) -> TokenCount:
    if not parts:
        return TokenCount(0, counter.name, exact=True)
    return TokenCount(sum(p.tokens for p in parts), parts[0].counter, all(p.exact for p in parts))


def prompt_bytes(prompt: Prompt) -> int:
    """UTF-8 bytes of the text a counter would tokenize for ``prompt`` (message contents, reasoning, tool calls,
    tool schemas; a text prompt's strings): what bounds the work and memory of an exact count. Token ids and
    images cost nothing here."""
    if prompt.messages is not None:
        total = sum(utf8_length(json_text(tool)) for tool in prompt.tools)
        for message in prompt.messages:
            if not isinstance(message, Mapping):
                continue
            total += utf8_length(content_text(message.get("content")))
            total += sum(utf8_length(message[key]) for key in ("thinking", "reasoning_content")
                         if isinstance(message.get(key), str))
            total += sum(utf8_length(json_text(call)) for call in message.get("tool_calls") or ()
                         if isinstance(message.get("tool_calls"), Sequence))
        return total
    if prompt.batch:
        return sum(prompt_bytes(part) for part in prompt.batch)
    return _text_bytes(prompt.text)


def _text_bytes(text: Any) -> int:
    if isinstance(text, str | bytes):
        return utf8_length(text)
    if isinstance(text, Mapping):
        return _text_bytes(text.get("prompt_string"))
    if isinstance(text, Sequence):
        return sum(_text_bytes(part) for part in text)
    return 0
