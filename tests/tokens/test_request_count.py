"""Each dialect's body, parsed into one Prompt, turns into the right count_chat / count_text calls."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from gateway import dialects
from gateway.domain import Dialect, Operation
from gateway.errors import InvalidField
from gateway.tokens.count import Counter, Message, TokenCount, Tool
from gateway.tokens.request_count import count_prompt


async def count_request(body: dict[str, Any], dialect: str, counter: Counter) -> TokenCount:
    """Parse ``body`` as its dialect would (chat when it has messages, else generate; infill for llama-server
    bodies with ``input_prefix``) and count the prompt."""
    kind = Dialect(dialect)
    if "messages" in body:
        operation = Operation.CHAT
    elif "input_prefix" in body:
        operation = Operation.INFILL
    else:
        operation = Operation.GENERATE
    if kind is Dialect.OLLAMA:
        body = {"model": "m", **body}
    return await count_prompt(dialects.parse(kind, operation, body, "").prompt_input, counter)


class RecordingCounter:
    """Counts one token per character and remembers what it was asked."""

    name = "recording"

    def __init__(self) -> None:
        self.chats: list[tuple[list[Message], list[Tool]]] = []
        self.texts: list[tuple[str | bytes, bool]] = []

    async def count_chat(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> TokenCount:
        self.chats.append((list(messages), list(tools)))
        return TokenCount(sum(len(str(m.get("content") or "")) for m in messages), self.name, True)

    async def count_text(self, text: str | bytes, *, add_special: bool = True) -> TokenCount:
        self.texts.append((text, add_special))
        return TokenCount(len(text) + int(add_special), self.name, True)


TOOL = {"type": "function", "function": {"name": "f", "parameters": {}}}


@pytest.mark.parametrize("dialect", ["ollama", "openai", "llama-server"])
async def test_chat_bodies(dialect: str) -> None:
    counter = RecordingCounter()
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "tools": [TOOL], "stream": True}
    assert (await count_request(body, dialect, counter)).tokens == 5
    assert counter.chats == [([{"role": "user", "content": "hello"}], [TOOL])]


async def test_ollama_generate_is_a_chat_of_system_and_prompt() -> None:
    counter = RecordingCounter()
    body = {"model": "m", "prompt": "hi", "system": "sys", "images": ["aW1n"], "suffix": "!"}
    await count_request(body, "ollama", counter)
    assert counter.chats == [
        ([{"role": "system", "content": "sys"}, {"role": "user", "content": "hi!", "images": ["aW1n"]}], [])
    ]


async def test_ollama_raw_generate_is_text() -> None:
    counter = RecordingCounter()
    assert (await count_request({"prompt": "abc", "raw": True}, "ollama", counter)).tokens == 4
    assert counter.texts == [("abc", True)]


@pytest.mark.parametrize(
    ("prompt", "tokens", "texts"),
    [
        ("abc", 4, [("abc", True)]),
        (["ab", "cde"], 3 + 4, [("ab", True), ("cde", True)]),
        ([1, 2, 3], 3, []),
        ([[1, 2], [3]], 3, []),
        (["ab", 7, 8, "c"], 3 + 2 + 1, [("ab", True), ("c", False)]),
        ({"prompt_string": "xy", "multimodal_data": []}, 3, [("xy", True)]),
        (None, 0, []),
    ],
)
async def test_completion_prompts(prompt: Any, tokens: int, texts: list[tuple[str, bool]]) -> None:
    for dialect in ("openai", "llama-server") if not isinstance(prompt, dict) else ("llama-server",):
        counter = RecordingCounter()
        counted = await count_request({"prompt": prompt}, dialect, counter)
        assert counted.tokens == tokens
        assert counter.texts == texts


async def test_llama_server_infill_is_an_estimate_of_its_pieces() -> None:
    counter = RecordingCounter()
    counted = await count_request({"input_prefix": "ab", "input_suffix": "cd"}, "llama-server", counter)
    assert counted.tokens == len("ab\ncd") + 1 and not counted.exact


async def test_anthropic_system_blocks_and_tools() -> None:
    counter = RecordingCounter()
    body = {
        "system": [{"type": "text", "text": "be"}, {"type": "text", "text": "nice"}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "yo"}]}],
        "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
    }
    await count_request(body, "anthropic", counter)
    (messages, tools), *_ = counter.chats
    assert messages[0] == {"role": "system", "content": "be\nnice"}
    assert tools == [
        {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}
    ]


async def test_non_mapping_messages_are_refused_by_the_dialect() -> None:
    with pytest.raises(InvalidField, match=r"messages\[0\]"):
        await count_request({"messages": ["junk", {"role": "user", "content": "ok"}]}, "openai", RecordingCounter())
