"""Property: over the random conversations of the trim property, a new summary replaces exactly the turns before the
largest boundary that keeps ``keep_newest_turns`` turns, with system prompts in place and no tool call parted from its
result. The generator's own truth (which user messages open turns, which result answers which call) gives the cuts."""

from __future__ import annotations

from collections import Counter
from collections.abc import Coroutine
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.fitting.summary_fit import (
    SUMMARY_PREFIX,
    Summarized,
    SummaryCache,
    SummaryGoal,
    summarize_history,
    summary_key,
)
from tests.fitting.test_trim_property import Conversation, _cuts, _is_system, conversations

Message = dict[str, Any]


def _run(coroutine: Coroutine[Any, Any, Summarized | None]) -> Summarized | None:
    """Drive a coroutine that never really suspends (the count and the summarizer here return at once)."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    raise AssertionError("summarize_history suspended on something other than its callables")


def _expected(chat: Conversation, cut: int, summary: Message) -> list[Message]:
    before = chat.messages[:cut]
    first = next(i for i, m in enumerate(before) if not _is_system(m))
    return [*before[:first], summary, *[m for m in before[first:] if _is_system(m)], *chat.messages[cut:]]


@pytest.mark.parametrize("half", [1, 2])
def test_summarizing_random_conversations(half: int) -> None:
    """250 random conversations, in two halves (each a test of its own, under 2 s)."""
    outcomes: Counter[str] = Counter()

    @settings(max_examples=125, deadline=None, database=None)
    @given(chat=conversations(), keep_newest_turns=st.integers(1, 3))
    def check(chat: Conversation, keep_newest_turns: int) -> None:
        calls: list[list[Message]] = []

        async def count(messages: list[Message]) -> int:
            return len(messages)

        async def summarize(messages: list[Message]) -> str:
            calls.append(messages)
            return "text"

        result = _run(summarize_history(
            chat.messages, SummaryGoal(keep_newest_turns, 10**9), count=count,
            summarize=summarize, cache=SummaryCache(4), key_for=lambda replaced: summary_key("m", "i", replaced)))
        cuts = _cuts(chat)
        if len(cuts) < keep_newest_turns:
            assert result is None and calls == []
            outcomes[f"none, {keep_newest_turns} newest kept"] += 1
            return
        assert result is not None and not result.cached
        cut = cuts[-keep_newest_turns]
        summary = {"role": "system", "content": SUMMARY_PREFIX + "text"}
        assert result.messages == _expected(chat, cut, summary)
        assert [id(m) for m in result.messages[-(len(chat.messages) - cut):]] == [id(m) for m in chat.messages[cut:]]
        replaced = [m for m in chat.messages[:cut] if not _is_system(m)]
        assert [[id(m) for m in source] for source in calls] == [[id(m) for m in replaced]]
        assert result.replaced == len(replaced)
        replaced_ids = {id(m) for m in replaced}
        assert all((call in replaced_ids) == (answer in replaced_ids) for call, answer in chat.pairs)
        outcomes[f"summarized, {keep_newest_turns} newest kept"] += 1

    check()
    print(f"\n  summarize property: {sum(outcomes.values())} conversations")
    for outcome, times in sorted(outcomes.items()):
        print(f"  {outcome:<32}{times:>5}")
