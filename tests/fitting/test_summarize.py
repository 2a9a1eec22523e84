"""Summarizing history: one summary where the oldest turns were, system prompts in place, the newest turns verbatim,
tool calls with their results; summaries cached and reused, so a growing conversation pays one call per threshold
crossed, not one per turn."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from gateway.fitting.summary_fit import (
    SUMMARY_PREFIX,
    Summarized,
    SummaryCache,
    SummaryFailed,
    SummaryGoal,
    summarize_history,
    summary_key,
)

Message = dict[str, Any]
PREFIX_WORDS = len(SUMMARY_PREFIX.split())


def _words(content: Any) -> int:
    if isinstance(content, str):
        return len(content.split())
    if isinstance(content, list):
        return sum(_words(block.get("text") or block.get("content")) for block in content if isinstance(block, dict))
    return 0


async def count(messages: list[Message]) -> int:
    """A fake count: whitespace-separated words, plus 3 per message."""
    return sum(3 + _words(message.get("content")) for message in messages)


class FakeSummarizer:
    """Returns a summary of ``words`` words (the first names the call) and records every input."""

    def __init__(self, words: int = 10, error: Exception | None = None) -> None:
        self.words = words
        self.error = error
        self.calls: list[list[Message]] = []

    async def __call__(self, messages: list[Message]) -> str:
        self.calls.append(messages)
        if self.error is not None:
            raise self.error
        return " ".join([f"summary{len(self.calls)}", *["w"] * (self.words - 1)])


def key_for(replaced: Sequence[Message]) -> str:
    return summary_key("summary-model", "Summarize.", replaced)


def _message(index: int, spec: str) -> Message:
    """s system, d developer, u user, a assistant, a>x a call to tool x, t<x its result, A>x / U<x the same as
    Anthropic tool_use / tool_result blocks."""
    ref = spec[2:]
    if spec.startswith("a>"):
        return {"role": "assistant", "content": "", "tool_calls": [{"id": ref, "function": {"name": "f"}}]}
    if spec.startswith("t<"):
        return {"role": "tool", "content": f"result@{index}", "tool_call_id": ref}
    if spec.startswith("A>"):
        return {"role": "assistant", "content": [{"type": "tool_use", "id": ref, "name": "f", "input": {}}]}
    if spec.startswith("U<"):
        return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": ref, "content": f"r@{index}"}]}
    roles = {"s": "system", "d": "developer", "u": "user", "a": "assistant"}
    return {"role": roles[spec], "content": f"{spec}@{index}"}


def _chat(specs: str) -> list[Message]:
    return [_message(i, spec) for i, spec in enumerate(specs.split())]


def _layout(original: list[Message], result: list[Message]) -> str:
    """The result as original indices, S for the summary."""
    def name(message: Message) -> str:
        if str(message.get("content")).startswith(SUMMARY_PREFIX):
            return "S"
        return str(next(i for i, m in enumerate(original) if m is message))
    return " ".join(name(m) for m in result)


async def _summarize(messages: list[Message], cache: SummaryCache, summarizer: FakeSummarizer, *,
                     keep_newest_turns: int = 1, target_tokens: int = 10_000,
                     summary_role: str = "system") -> Summarized | None:
    return await summarize_history(messages, SummaryGoal(keep_newest_turns, target_tokens, summary_role),
                                   count=count, summarize=summarizer, cache=cache, key_for=key_for)


# ---------------------------------------------------------------------------------------------------------------
# (a) the key test: a conversation growing turn by turn costs one call per threshold crossed

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
USER_WORDS, ASSISTANT_WORDS, SUMMARY_WORDS = 20, 30, 40
TARGET_TOKENS, KEEP_TURNS, TURNS = 400, 2, 30


def _said(role: str, turn: int, words: int) -> Message:
    return {"role": role, "content": " ".join([f"{role}{turn}", *["x"] * (words - 1)])}


def _expected_calls(turns: int) -> int:
    """The calls the policy must make, by arithmetic on the fake costs (words + 3 per message)."""
    system, user, assistant = 3 + 5, 3 + USER_WORDS, 3 + ASSISTANT_WORDS
    summary = 3 + PREFIX_WORDS + SUMMARY_WORDS
    calls, first_verbatim = 0, 0  # the first turn kept verbatim after the latest summary (0: none made yet)
    for turn in range(1, turns + 1):
        if first_verbatim == 0 and system + (turn - 1) * (user + assistant) + user <= TARGET_TOKENS:
            continue  # the whole history fits: forwarded as it is
        if first_verbatim and system + summary + (turn - first_verbatim) * (user + assistant) + user <= TARGET_TOKENS:
            continue  # the latest summary still leaves room
        calls, first_verbatim = calls + 1, turn - KEEP_TURNS + 1
    return calls


async def test_a_growing_conversation_costs_one_call_per_threshold_crossed() -> None:
    cache, summarizer = SummaryCache(max_entries=64), FakeSummarizer(words=SUMMARY_WORDS)
    history: list[Message] = [SYSTEM]
    rows, outcomes = [], {"fits": 0, "new": 0, "cached": 0}
    for turn in range(1, TURNS + 1):
        history.append(_said("user", turn, USER_WORDS))
        before_tokens = await count(history)
        after_tokens, outcome = before_tokens, "fits"
        if before_tokens > TARGET_TOKENS:
            result = await _summarize(history, cache, summarizer, keep_newest_turns=KEEP_TURNS,
                                      target_tokens=TARGET_TOKENS)
            assert result is not None
            assert result.prompt_tokens == await count(result.messages) <= TARGET_TOKENS
            assert result.messages[0] is SYSTEM and result.messages[1]["role"] == "system"
            verbatim = result.messages[2:]
            assert verbatim == history[-len(verbatim):], "whole turns, verbatim, up to the newest"
            assert len(verbatim) >= 2 * KEEP_TURNS - 1, "at least the newest KEEP_TURNS turns"
            after_tokens, outcome = result.prompt_tokens, "cached" if result.cached else "new"
        outcomes[outcome] += 1
        rows.append((turn, len(history), before_tokens, after_tokens, len(summarizer.calls), outcome))
        history.append(_said("assistant", turn, ASSISTANT_WORDS))

    print(f"\n  growing conversation: target {TARGET_TOKENS} tokens, newest {KEEP_TURNS} turns kept verbatim")
    print(f"  {'turn':>4} {'messages':>8} {'before':>7} {'after':>6} {'calls':>5}  outcome")
    for turn, messages, before_tokens, after_tokens, calls, outcome in rows:
        print(f"  {turn:>4} {messages:>8} {before_tokens:>7,} {after_tokens:>6,} {calls:>5}  {outcome}")
    print(f"  {outcomes}; cache hits {cache.hits}, misses {cache.misses}")

    assert len(summarizer.calls) == outcomes["new"] == _expected_calls(TURNS) == 5
    assert outcomes["cached"] >= 3 * outcomes["new"], "most summarized requests reuse a summary"
    for previous, source in enumerate(summarizer.calls[1:], start=1):
        assert source[0] == {"role": "user", "content": SUMMARY_PREFIX + f"summary{previous} " + "w " * 38 + "w"}
        assert len(source) < 2 * 7, "incremental: the previous summary and only the turns since"


# ---------------------------------------------------------------------------------------------------------------
# (b) the shape of the summarized history

LAYOUTS = [
    # (why, specs, keep_newest_turns, layout of the result: original indices, S for the summary)
    ("one turn kept", "s u a u a u", 1, "0 S 5"),
    ("two turns kept", "s u a u a u", 2, "0 S 3 4 5"),
    ("a system prompt between turns stays in place", "s u a d u a u", 1, "0 S 3 6"),
    ("system prompts before and between", "d s u a s u a u", 1, "0 1 S 4 7"),
    ("a user message between a call and its result is no cut", "s u a>x u t<x a u", 1, "0 S 6"),
    ("a pending tool result is kept with its call", "s u a u a>x t<x", 1, "0 S 3 4 5"),
    ("Anthropic tool_result is no turn", "u A>x U<x a u", 1, "S 4"),
    ("a leading assistant is replaced with the first turn", "s a u a u", 1, "0 S 4"),
]


@pytest.mark.parametrize(("why", "specs", "keep", "layout"), LAYOUTS, ids=[case[0] for case in LAYOUTS])
async def test_the_summary_replaces_the_oldest_turns(why: str, specs: str, keep: int, layout: str) -> None:
    messages, summarizer = _chat(specs), FakeSummarizer()
    result = await _summarize(messages, SummaryCache(8), summarizer, keep_newest_turns=keep)
    assert result is not None and _layout(messages, result.messages) == layout
    kept = {id(m) for m in result.messages}
    replaced = [m for m in messages if id(m) not in kept]
    assert summarizer.calls == [replaced], "the summarizer sees exactly the replaced messages, in order"
    assert all(m["role"] not in ("system", "developer") for m in replaced)
    assert result.replaced == len(replaced) and not result.cached
    assert result.prompt_tokens == await count(result.messages)


async def test_the_summary_takes_the_role_the_dialect_allows() -> None:
    messages = _chat("u a u a u")
    result = await _summarize(messages, SummaryCache(8), FakeSummarizer(words=3), summary_role="user")
    assert result is not None
    assert result.messages[0] == {"role": "user", "content": SUMMARY_PREFIX + "summary1 w w"}


def test_the_header_says_what_was_replaced() -> None:
    new = Summarized([], replaced=12, prompt_tokens=3_000, cached=False)
    assert new.describe(total=20, before_tokens=9_000) == (
        "replaced the 12 oldest of 20 messages with a summary; prompt 9,000 -> 3,000 tokens")
    cached = Summarized([], replaced=12, prompt_tokens=3_000, cached=True)
    assert cached.describe(total=20, before_tokens=9_000).endswith("3,000 tokens; cached")


# ---------------------------------------------------------------------------------------------------------------
# (c) the cache: keyed by everything a summary depends on, bounded, counted

def test_the_key_changes_with_the_model_the_instructions_and_every_replaced_message() -> None:
    messages = _chat("u a u a")
    base = summary_key("m", "Summarize.", messages)
    assert len(base) == 64 and int(base, 16) >= 0
    assert summary_key("m", "Summarize.", [dict(reversed(m.items())) for m in messages]) == base, "canonical"
    assert summary_key("other", "Summarize.", messages) != base
    assert summary_key("m", "Summarize briefly.", messages) != base
    for index in range(len(messages)):
        edited = [dict(m, content=m["content"] + "!") if i == index else m for i, m in enumerate(messages)]
        assert summary_key("m", "Summarize.", edited) != base, f"message {index} edited"
    assert summary_key("m", "Summarize.", messages[1:]) != base
    assert summary_key("m", "Summarize.", [dict(messages[0], role="assistant"), *messages[1:]]) != base


def test_the_cache_evicts_the_least_recently_used_and_counts() -> None:
    cache = SummaryCache(max_entries=2)
    cache.put("a", "A")
    cache.put("b", "B")
    assert cache.get("a") == "A"  # "b" is now the least recently used
    cache.put("c", "C")
    assert len(cache) == 2 and cache.get("b") is None and cache.get("c") == "C" and cache.get("a") == "A"
    assert (cache.hits, cache.misses) == (3, 1)
    cache.put("a", "A2")
    assert cache.get("a") == "A2" and len(cache) == 2


def test_a_cache_of_zero_entries_stores_nothing() -> None:
    cache = SummaryCache(max_entries=0)
    cache.put("a", "A")
    assert len(cache) == 0 and cache.get("a") is None
    with pytest.raises(ValueError, match="max_entries"):
        SummaryCache(max_entries=-1)


async def test_reuse_takes_the_largest_cached_summary_that_fits() -> None:
    messages, cache, summarizer = _chat("s u a u a u a u"), SummaryCache(8), FakeSummarizer()
    replaced_before = {cut: [m for m in messages[:cut] if m["role"] != "system"] for cut in (3, 5, 7)}
    cache.put(key_for(replaced_before[3]), "short")
    cache.put(key_for(replaced_before[5]), "also short")
    cache.put(key_for(replaced_before[7]), "far " * 200)  # the largest, but too long
    result = await _summarize(messages, cache, summarizer, target_tokens=40)
    assert result is not None and result.cached and summarizer.calls == []
    assert _layout(messages, result.messages) == "0 S 5 6 7" and result.messages[1]["content"].endswith("also short")
    assert result.describe(len(messages), 100).endswith("; cached")


# ---------------------------------------------------------------------------------------------------------------
# (d) failures

async def test_a_failing_summarizer_raises_summary_failed_naming_the_error() -> None:
    cache = SummaryCache(8)
    with pytest.raises(SummaryFailed, match="the summarizer failed: RuntimeError: backend down") as caught:
        await _summarize(_chat("u a u"), cache, FakeSummarizer(error=RuntimeError("backend down")))
    assert len(cache) == 0, "nothing cached from a failed call"
    assert caught.value.reason == "error"


async def test_an_empty_summary_is_a_failure() -> None:
    summarizer = FakeSummarizer()

    async def empty(messages: list[Message]) -> str:
        await summarizer(messages)
        return "  "

    with pytest.raises(SummaryFailed, match="empty summary"):
        await summarize_history(_chat("u a u"), SummaryGoal(1, 100), count=count,
                                summarize=empty, cache=SummaryCache(8), key_for=key_for)


async def test_a_summary_too_long_raises_and_is_not_paid_for_twice() -> None:
    messages, cache, summarizer = _chat("s u a u a u"), SummaryCache(8), FakeSummarizer(words=500)
    with pytest.raises(SummaryFailed, match=r"the summary of the 4 oldest messages does not fit: 5\d\d tokens > 100") \
            as made:
        await _summarize(messages, cache, summarizer, target_tokens=100)
    with pytest.raises(SummaryFailed, match="the cached summary of the 4 oldest messages does not fit") as cached:
        await _summarize(messages, cache, summarizer, target_tokens=100)
    assert len(summarizer.calls) == 1
    assert made.value.reason == cached.value.reason == "no_fit"  # counted, though the second made no call


async def test_kept_turns_too_long_for_the_target_raise() -> None:
    with pytest.raises(SummaryFailed, match="does not fit"):
        await _summarize(_chat("u a u a u"), SummaryCache(8), FakeSummarizer(words=1), target_tokens=5)


# ---------------------------------------------------------------------------------------------------------------
# (e) nothing to summarize

@pytest.mark.parametrize(("specs", "keep"), [
    ("s u", 1),  # one turn: it is the newest
    ("s d", 1),  # no turn at all
    ("", 1),
    ("u a u", 2),  # two turns, both kept
    ("s u a>x u t<x a u", 2),  # the user message inside the call..result span opens no turn
])
async def test_none_when_no_turn_beyond_the_kept_ones(specs: str, keep: int) -> None:
    summarizer = FakeSummarizer()
    assert await _summarize(_chat(specs), SummaryCache(8), summarizer, keep_newest_turns=keep) is None
    assert summarizer.calls == []


async def test_keep_newest_turns_must_be_at_least_one() -> None:
    with pytest.raises(ValueError, match="keep_newest_turns"):
        await _summarize(_chat("u a u"), SummaryCache(8), FakeSummarizer(), keep_newest_turns=0)


# ---------------------------------------------------------------------------------------------------------------
# (f) incremental input

async def test_a_new_summary_builds_on_the_previous_one() -> None:
    cache, summarizer = SummaryCache(8), FakeSummarizer(words=5)
    grown = _chat("s u a u a u a d u a u")
    first = grown[:6]
    made = await _summarize(first, cache, summarizer, target_tokens=30)
    assert made is not None and _layout(first, made.messages) == "0 S 5"
    result = await _summarize(grown, cache, summarizer, target_tokens=30)
    assert result is not None and not result.cached and _layout(grown, result.messages) == "0 S 7 10"
    assert summarizer.calls[1] == [
        {"role": "user", "content": SUMMARY_PREFIX + "summary1 w w w w"},
        grown[5], grown[6], grown[8], grown[9],  # the developer message (7) stays in place, not summarized
    ]
    assert result.replaced == 8


async def test_without_a_previous_summary_every_replaced_message_is_summarized() -> None:
    messages, summarizer = _chat("s u a u a u a u"), FakeSummarizer()
    result = await _summarize(messages, SummaryCache(8), summarizer, keep_newest_turns=1)
    assert result is not None and summarizer.calls == [messages[1:7]]


# ---------------------------------------------------------------------------------------------------------------
# (f) every failure is counted, by reason, by the one object the admission step asks (Summaries)

async def test_summaries_count_every_failure_by_reason_called_or_not() -> None:
    """A summary model kvgate can't reach (error, after a call), a chat with no turn to spare (no_fit, without a
    call): both are counted, so kvgate_summary_failures_total moves whenever a summary falls back."""
    import aiohttp

    from gateway.domain import Dialect
    from gateway.fitting.policy import FitPolicy
    from gateway.fitting.summaries import Summaries
    from gateway.fitting.summary_writer import InternalCalls, Summarizer

    policy = FitPolicy(remedies=("summarize", "trim"), keep_newest_turns=1, summary_model="m", summary_backend=None,
                       summary_instructions="Summarize.", summary_max_tokens=16, summary_timeout_s=1.0)
    async with aiohttp.ClientSession() as session:
        summaries = Summaries(Summarizer(session, InternalCalls()), cache_entries=8)  # not listening: no url
        with pytest.raises(SummaryFailed, match="not listening") as unreachable:
            await summaries.fit(_chat("u a u a u"), Dialect.OPENAI, policy, target_tokens=10, count=count)
        with pytest.raises(SummaryFailed, match="no turn may be summarized") as nothing:
            await summaries.fit(_chat("s u"), Dialect.OPENAI, policy, target_tokens=1, count=count)
    assert (unreachable.value.reason, nothing.value.reason) == ("error", "no_fit")
    assert summaries.failures == {"error": 1, "no_fit": 1} and summaries.summarizer.calls == 1
