"""Property: over random conversations, trimming keeps turns well-formed and drops the fewest whole turns that fit.

The generator knows the truth the trimmer has to infer: which user messages open a turn and which tool call each
result answers. A brute force over every cut checks the trimmer's choice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.fitting.trim import Trimmed, trim_history

Message = dict[str, Any]
SYSTEM_ROLES = ("system", "developer")
EXAMPLES = 250


@dataclass
class Conversation:
    messages: list[Message] = field(default_factory=list)
    openers: set[int] = field(default_factory=set)  # id() of the user messages that open a turn
    pairs: list[tuple[int, int]] = field(default_factory=list)  # (id() of a call, id() of a result answering it)
    styles: set[str] = field(default_factory=set)
    cost_tokens: dict[int, int] = field(default_factory=dict)  # id() -> tokens
    base_tokens: int = 0
    target_tokens: int = 0

    def count(self, messages: list[Message]) -> int:
        return self.base_tokens + sum(self.cost_tokens[id(m)] for m in messages)


def _user(draw: st.DrawFn, text: str) -> Message:
    as_parts = draw(st.booleans())
    return {"role": "user", "content": [{"type": "text", "text": text}] if as_parts else text}


def _tool_exchange(draw: st.DrawFn, chat: Conversation, serial: int) -> list[Message]:
    """An assistant's tool call and its 1-3 results, in one of the three wire shapes, maybe with a user between."""
    style = draw(st.sampled_from(["openai", "ollama", "anthropic"]))
    refs = [f"call{serial}_{i}" for i in range(draw(st.integers(1, 3)))]
    chat.styles.add(style)
    if style == "anthropic":
        call: Message = {"role": "assistant", "content": [{"type": "tool_use", "id": r, "input": {}} for r in refs]}
        results: list[Message] = [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": r, "content": "ok"} for r in refs]}]
    elif style == "openai":
        call = {"role": "assistant", "content": None, "tool_calls": [{"id": r, "type": "function"} for r in refs]}
        results = [{"role": "tool", "tool_call_id": r, "content": "ok"} for r in refs]
    else:
        call = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": r}} for r in refs]}
        results = [{"role": "tool", "content": "ok"} for _ in refs]
    chat.pairs += [(id(call), id(result)) for result in results]
    between: list[Message] = []
    if draw(st.integers(0, 3)) == 0:  # a client that lets the user speak before the results arrive
        between = [_user(draw, "meanwhile")]
        chat.openers.add(id(between[0]))
    return [call, *between, *results]


@st.composite
def conversations(draw: st.DrawFn) -> Conversation:
    chat = Conversation()
    kinds = ["user", "user", "user", "assistant", "assistant", "tool call", "tool call", "orphan", "system", "unknown"]
    events = [draw(st.sampled_from(kinds)) for _ in range(draw(st.integers(1, 30)))]
    for serial, kind in enumerate(events):
        if kind == "user":
            chat.messages.append(_user(draw, f"u{serial}"))
            chat.openers.add(id(chat.messages[-1]))
        elif kind == "tool call":
            chat.messages += _tool_exchange(draw, chat, serial)
        elif kind == "orphan":  # a result whose call the client already cut away: answers nothing, opens nothing
            anthropic_orphan = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "gone"}]}
            openai_orphan = {"role": "tool", "tool_call_id": "gone", "content": "ok"}
            chat.messages.append(anthropic_orphan if draw(st.booleans()) else openai_orphan)
        else:
            role = {"assistant": "assistant", "unknown": "ipython"}.get(kind) or draw(st.sampled_from(SYSTEM_ROLES))
            chat.messages.append({"role": role, "content": f"{kind}{serial}"})
    # system messages anywhere, even between a call and its results
    for _ in range(draw(st.integers(0, 2))):
        chat.messages.insert(draw(st.integers(0, len(chat.messages))), {"role": "system", "content": "late"})
    chat.cost_tokens = {id(m): draw(st.integers(0, 40)) for m in chat.messages}
    chat.base_tokens = draw(st.integers(0, 20))
    # a target from below the fullest trim to above the whole chat, so every outcome is common
    floor_tokens = chat.count([m for m in chat.messages[:-1] if _is_system(m)] + chat.messages[-1:])
    chat.target_tokens = draw(st.integers(max(0, floor_tokens - 5), chat.count(chat.messages) + 10))
    return chat


def _is_system(message: Message) -> bool:
    return message.get("role") in SYSTEM_ROLES


def _kept_from(messages: list[Message], cut: int) -> list[Message]:
    return [m for i, m in enumerate(messages) if i >= cut or _is_system(m)]


def _cuts(chat: Conversation) -> list[int]:
    """Every place the history may begin: a turn-opening user message after the first message, inside no
    call..result span."""
    messages = chat.messages
    at = {id(m): i for i, m in enumerate(messages)}
    spans = [(at[call], at[result]) for call, result in chat.pairs]
    others = [i for i, m in enumerate(messages) if not _is_system(m)]
    return [cut for cut in others[1:]
            if id(messages[cut]) in chat.openers and not any(call < cut <= result for call, result in spans)]


def _brute_force(chat: Conversation) -> list[Message] | None:
    """The first cut, oldest first, whose kept messages fit."""
    for cut in _cuts(chat):
        if chat.count(kept := _kept_from(chat.messages, cut)) <= chat.target_tokens:
            return kept
    return None


def _run(coroutine: Coroutine[Any, Any, Trimmed | None]) -> Trimmed | None:
    """Drive a coroutine that never really suspends (the count here is plain arithmetic)."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    raise AssertionError("the trimmer suspended on something other than the count")


def _check_well_formed(chat: Conversation, trimmed: Trimmed) -> None:
    messages, kept = chat.messages, trimmed.messages
    at = {id(m): i for i, m in enumerate(messages)}
    indices = [at[id(m)] for m in kept]
    assert indices == sorted(set(indices)), "kept messages are a subsequence of the original, in order"
    assert kept[-1] is messages[-1], "the last message is kept"
    assert all(id(m) in {id(k) for k in kept} for m in messages if _is_system(m)), "system messages are kept"
    history = [m for m in kept if not _is_system(m)]
    assert id(history[0]) in chat.openers, "the history opens with a user turn"
    originals = [m for m in messages if not _is_system(m)]
    assert history == originals[len(originals) - len(history):], "whole turns only: the history is a suffix"
    kept_ids = {id(m) for m in kept}
    assert all((call in kept_ids) == (result in kept_ids) for call, result in chat.pairs), "calls with results"
    assert trimmed.prompt_tokens == chat.count(kept) <= chat.target_tokens
    assert trimmed.dropped == len(messages) - len(kept) > 0


@pytest.mark.parametrize("half", [1, 2])
def test_trimming_random_conversations(half: int) -> None:
    """EXAMPLES random conversations, in two halves (each a test of its own, under 2 s)."""
    outcomes: Counter[tuple[str, str]] = Counter()
    dropped_turns: Counter[str] = Counter()

    @settings(max_examples=EXAMPLES // 2, deadline=None, database=None)
    @given(conversations())
    def check(chat: Conversation) -> None:
        async def count(messages: list[Message]) -> int:
            return chat.count(messages)

        trimmed = _run(trim_history(chat.messages, count, chat.target_tokens))
        expected = _brute_force(chat)
        styles = "+".join(sorted(chat.styles)) if len(chat.styles) < 2 else "mixed"
        if trimmed is None:
            assert expected is None, "None only when no whole-turn trim fits"
            outcomes[styles or "no tools", "none (too long)" if _cuts(chat) else "none (no cut)"] += 1
            return
        _check_well_formed(chat, trimmed)
        assert expected is not None and [id(m) for m in trimmed.messages] == [id(m) for m in expected], \
            "the trim that drops the fewest whole turns"
        outcomes[styles or "no tools", "trimmed"] += 1
        kept_ids = {id(m) for m in trimmed.messages}
        turns = sum(1 for m in chat.messages if id(m) in chat.openers and id(m) not in kept_ids)
        dropped_turns["1" if turns <= 1 else "2-3" if turns <= 3 else "4+"] += 1

    check()
    _print_summary(outcomes, dropped_turns)


def _print_summary(outcomes: Counter[tuple[str, str]], dropped_turns: Counter[str]) -> None:
    columns = ("trimmed", "none (too long)", "none (no cut)")
    rows = sorted({row for row, _ in outcomes})
    print(f"\n  trim property: {sum(outcomes.values())} conversations")
    print(f"  {'tool calls':<18}" + "".join(f"{c:>17}" for c in columns))
    for row in rows:
        print(f"  {row:<18}" + "".join(f"{outcomes[row, c]:>17}" for c in columns))
    print("  user turns dropped when trimmed: " + ", ".join(f"{k}: {dropped_turns[k]}" for k in ("1", "2-3", "4+")))
