"""Count the prompt of a parsed request body, whatever API it came in.

    dialect        body                              counted as
    ollama         /api/chat {messages, tools}       chat
                   /api/generate {prompt, system,    chat [system, user(prompt, images)]; raw: text
                                  images, raw}
    openai         /v1/chat/completions {messages}   chat
                   /v1/completions {prompt}          text (a list of prompts: the sum; token arrays: their length)
    llama-server   /completion {prompt}              text (string, token ids, or a mix; a list: the sum)
                   /v1/chat/completions {messages}   chat
    anthropic      /v1/messages {system, messages,   chat (system first; tools as {name, description,
                                 tools}                    parameters})

`dialect` accepts gateway.domain.Dialect values ("ollama", "openai", "llama-server", "anthropic"); the shape of
the body (messages or prompt) decides chat or text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gateway.tokens.count import Counter, Message, TokenCount, Tool
from gateway.tokens.text import content_text


async def count_request(body: Mapping[str, Any], dialect: str, counter: Counter) -> TokenCount:
    """The prompt length of a request body; counts 0 (exact) for a body with neither messages nor prompt."""
    tools = _tools(body.get("tools"), dialect)
    if isinstance(body.get("messages"), list):
        messages = _messages(body, dialect)
        return await counter.count_chat(messages, tools)
    prompt = body.get("prompt")
    if dialect == "ollama" and not body.get("raw") and isinstance(prompt, str):
        return await counter.count_chat(_ollama_generate_messages(body), tools)
    if prompt is None and isinstance(body.get("content"), str | list):
        prompt = body.get("content")  # llama-server /tokenize-style and /infill bodies
    return await _count_prompt(prompt, counter)


def _messages(body: Mapping[str, Any], dialect: str) -> list[Message]:
    messages: list[Message] = [m for m in body["messages"] if isinstance(m, Mapping)]
    if dialect == "anthropic" and body.get("system"):
        system = body["system"]
        messages = [{"role": "system", "content": content_text(system, separator="\n")}, *messages]
    return messages


def _ollama_generate_messages(body: Mapping[str, Any]) -> list[Message]:
    messages: list[Message] = []
    if isinstance(body.get("system"), str) and body["system"]:
        messages.append({"role": "system", "content": body["system"]})
    user: dict[str, Any] = {"role": "user", "content": body.get("prompt") or ""}
    if isinstance(body.get("suffix"), str) and body["suffix"]:
        user["content"] = f"{user['content']}{body['suffix']}"
    if body.get("images"):
        user["images"] = body["images"]
    messages.append(user)
    return messages


def _tools(raw: Any, dialect: str) -> list[Tool]:
    if not isinstance(raw, list):
        return []
    tools = [t for t in raw if isinstance(t, Mapping)]
    if dialect == "anthropic":
        return [
            {
                "type": "function",
                "function": {
                    "name": t.get("name", ""),
                    "description": t.get("description", ""),
                    "parameters": t.get("input_schema", {}),
                },
            }
            if "input_schema" in t
            else t
            for t in tools
        ]
    return tools


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
