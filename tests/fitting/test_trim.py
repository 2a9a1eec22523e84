"""Trimming history: whole turns dropped oldest first, system prompts and the newest turn kept, tool calls and their
results together, the fewest turns dropped that fit."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.fitting.trim import trim_history

Message = dict[str, Any]


def _message(index: int, spec: str) -> Message:
    """One message from a short spec (see the table below)."""
    kind, _, ids = spec.partition(">") if ">" in spec else spec.partition("<")
    refs = [ref for ref in ids.split(",") if ref]
    text = f"{spec}@{index}"
    if spec.startswith("a>"):  # OpenAI (ids) or Ollama (no ids) tool calls
        calls = [{"id": ref, "type": "function", "function": {"name": "f", "arguments": "{}"}} for ref in refs]
        ollama = [{"function": {"name": "f", "arguments": {}}}]
        return {"role": "assistant", "content": "", "tool_calls": calls or ollama}
    if spec.startswith("t"):  # a tool message, with or without the id it answers
        return {"role": "tool", "content": text, **({"tool_call_id": refs[0]} if refs else {})}
    if spec.startswith("A>"):  # Anthropic tool_use blocks
        uses = [{"type": "tool_use", "id": ref, "name": "f", "input": {}} for ref in refs]
        return {"role": "assistant", "content": [{"type": "text", "text": text}, *uses]}
    if spec.startswith("U<"):  # Anthropic tool_result blocks
        results = [{"type": "tool_result", "tool_use_id": ref, "content": text} for ref in refs]
        return {"role": "user", "content": results}
    roles = {"s": "system", "d": "developer", "u": "user", "a": "assistant", "?": "ipython"}
    return {"role": roles[kind], "content": [{"type": "text", "text": text}] if kind == "u" and index % 2 else text}


def _chat(specs: str) -> list[Message]:
    return [_message(i, spec) for i, spec in enumerate(specs.split())]


async def _ten_each(messages: list[Message]) -> int:
    return 10 * len(messages) + 3


def _indices(original: list[Message], kept: list[Message]) -> list[int]:
    return [next(i for i, m in enumerate(original) if m is k) for k in kept]


# specs: s system, d developer, u user, a assistant, ? unknown role, a>x,y assistant calling tools x and y (a> without
# ids, as Ollama), t<x tool result for x (t without an id answers the latest call), A>x Anthropic tool_use x,
# U<x Anthropic user message of tool_result x. Each message costs 10 tokens, plus 3.
CASES = [
    ("alternating, one turn dropped", "s u a u a u", 43, [0, 3, 4, 5]),
    ("alternating, all but the newest", "s u a u a u", 23, [0, 5]),
    ("no system prompt", "u a u", 13, [2]),
    ("fewest turns that fit, nothing more", "s u a u a u a u", 100, [0, 3, 4, 5, 6, 7]),
    ("leading assistant after a cut", "s u a t a u", 43, [0, 5]),
    ("assistant opening the chat goes first", "s a u a u", 100, [0, 2, 3, 4]),
    ("OpenAI calls and results together", "s u a>x,y t<x t<y a u a u", 63, [0, 6, 7, 8]),
    ("last message a tool result, kept with its call", "s u a u a>x t<x", 43, [0, 3, 4, 5]),
    ("Ollama calls without ids", "u a> t t a u a> t", 43, [5, 6, 7]),
    ("Ollama result answers the latest call", "u a> u t a u", 43, [5]),
    ("Anthropic tool_result opens no turn", "u A>x U<x a u", 33, [4]),
    ("Anthropic tool_result kept with its tool_use", "u a u A>x,y U<x,y", 43, [2, 3, 4]),
    ("orphan tool_result opens no turn", "u a U<gone a u", 33, [4]),
    ("user between a call and its result", "u a>x u t<x a u", 43, [5]),
    ("system in the middle kept in place", "u a s u a u", 43, [2, 3, 4, 5]),
    ("system inside a dropped turn kept", "s u s a u", 33, [0, 2, 4]),
    ("developer kept like system", "d u a u", 23, [0, 3]),
    ("unknown role is part of the turn", "u ? a u", 13, [3]),
    ("consecutive users are separate turns", "u u a u", 33, [1, 2, 3]),
]


@pytest.mark.parametrize(("name", "specs", "target", "kept"), CASES, ids=[case[0] for case in CASES])
async def test_shortest_trim_of_whole_turns_that_fits(name: str, specs: str, target: int, kept: list[int]) -> None:
    messages = _chat(specs)
    trimmed = await trim_history(messages, _ten_each, target)
    assert trimmed is not None
    print(f"\n  {name:<50} {specs:<28} target {target:>3} -> kept {kept}")
    assert _indices(messages, trimmed.messages) == kept
    assert trimmed.prompt_tokens == 10 * len(kept) + 3 <= target
    assert trimmed.dropped == len(messages) - len(kept)


NOTHING = [
    ("even the fullest trim is too long", "s u u", 22),
    ("a single user message", "u", 5),
    ("a single turn with its tool calls", "s u a>x t<x", 5),
    ("no user message at all", "s a a>x t<x", 5),
    ("the only cut would split a call from its result", "u a>x u t<x", 5),
]


@pytest.mark.parametrize(("name", "specs", "target"), NOTHING, ids=[case[0] for case in NOTHING])
async def test_none_when_no_whole_turn_can_go(name: str, specs: str, target: int) -> None:
    print(f"\n  {name:<50} {specs:<28} target {target:>3} -> None")
    assert await trim_history(_chat(specs), _ten_each, target) is None


async def test_describe_keeps_its_format() -> None:
    messages = _chat("s u a u a u")
    trimmed = await trim_history(messages, _ten_each, 43)
    assert trimmed is not None
    assert trimmed.describe(len(messages), 12_345) == "dropped the 2 oldest of 6 messages; prompt 12,345 -> 43 tokens"


async def test_counts_are_few() -> None:
    calls = 0

    async def counting(messages: list[Message]) -> int:
        nonlocal calls
        calls += 1
        return 10 * len(messages)

    messages = _chat(" ".join(["s", *(["u", "a"] * 500), "u"]))
    trimmed = await trim_history(messages, counting, 5000)
    assert trimmed is not None and trimmed.prompt_tokens == 5000
    assert calls <= 12
