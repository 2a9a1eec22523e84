"""Keeping a prompt's head and tail: equal halves, the most characters that fit, found in O(log n) counts, the
omission always marked."""

from __future__ import annotations

import math
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.fitting.head_tail import HeadTail, head_and_tail, keep_head_and_tail, omission_marker

MARKER_WORDS = 7  # "[...", "5,400", "characters", "omitted", "by", "kvgate", "...]"


class WordCounter:
    """A fake count: whitespace-separated words, plus a fixed template cost; records how often it was asked."""

    def __init__(self, template_tokens: int = 0) -> None:
        self.template_tokens = template_tokens
        self.calls = 0

    async def __call__(self, text: str) -> int:
        self.calls += 1
        return self.template_tokens + len(text.split())


def _prompt(words: int) -> str:
    return " ".join(f"w{i}" for i in range(words))


def _run(coroutine: Coroutine[Any, Any, HeadTail | None]) -> HeadTail | None:
    """Drive a coroutine that never really suspends (the counts here are plain arithmetic)."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    raise AssertionError("keep_head_and_tail suspended on something other than the count")


def test_the_marker_and_the_header_say_what_was_omitted() -> None:
    assert omission_marker(5400) == "\n[... 5,400 characters omitted by kvgate ...]\n"
    assert HeadTail("", 2400, 5400, 3000).describe(9000) == (
        "kept the first 1,200 and last 1,200 characters of the prompt, 5,400 omitted; prompt 9,000 -> 3,000 tokens")


async def test_the_most_characters_that_fit_are_kept_head_and_tail_in_equal_halves() -> None:
    prompt, count = _prompt(1000), WordCounter(template_tokens=5)
    kept = await keep_head_and_tail(prompt, target_tokens=100, count=count)
    assert kept is not None
    half_chars = kept.kept_chars // 2
    assert kept.kept_chars == 2 * half_chars and kept.kept_chars + kept.omitted_chars == len(prompt)
    assert kept.prompt == prompt[:half_chars] + omission_marker(kept.omitted_chars) + prompt[-half_chars:]
    assert kept.prompt.startswith("w0 w1 ") and kept.prompt.endswith(" w998 w999")
    assert kept.prompt_tokens == 5 + len(kept.prompt.split()) <= 100
    one_more = head_and_tail(prompt, half_chars + 1)
    assert 5 + len(one_more.split()) > 100, "the most characters that fit"


async def test_the_search_is_a_bisection() -> None:
    prompt, count = _prompt(20_000), WordCounter()
    await keep_head_and_tail(prompt, target_tokens=1_000, count=count)
    half_max = (len(prompt) - 1) // 2
    assert count.calls <= 1 + math.ceil(math.log2(half_max + 1)), f"{count.calls} counts for {len(prompt):,} chars"


async def test_at_least_one_character_is_omitted_even_when_everything_would_fit() -> None:
    kept = await keep_head_and_tail("abcde", target_tokens=1_000, count=WordCounter())
    assert kept is not None and (kept.kept_chars, kept.omitted_chars) == (4, 1)
    assert kept.prompt == "ab" + omission_marker(1) + "de"


@pytest.mark.parametrize(("prompt", "target_tokens"), [
    ("", 1_000),  # nothing to keep
    (_prompt(50), MARKER_WORDS - 1),  # even the marker alone is too long
])
async def test_none_when_nothing_can_be_kept(prompt: str, target_tokens: int) -> None:
    assert await keep_head_and_tail(prompt, target_tokens=target_tokens, count=WordCounter()) is None


async def test_the_marker_alone_when_no_character_fits() -> None:
    kept = await keep_head_and_tail(_prompt(50), target_tokens=MARKER_WORDS, count=WordCounter())
    assert kept is not None and kept.kept_chars == 0 and kept.prompt == omission_marker(len(_prompt(50)))


COUNTS: dict[str, Callable[[str], int]] = {
    "words": lambda text: len(text.split()),
    "chars/4": lambda text: len(text) // 4 + 1,
    "bytes/3": lambda text: len(text.encode("utf-8", "surrogatepass")) // 3,
}


@pytest.mark.parametrize("count_name", sorted(COUNTS))
@settings(max_examples=100, deadline=None, database=None)
@given(prompt=st.text(max_size=400), target_tokens=st.integers(0, 120))
def test_the_result_always_fits(prompt: str, target_tokens: int, count_name: str) -> None:
    measure = COUNTS[count_name]
    calls = 0

    async def count(text: str) -> int:
        nonlocal calls
        calls += 1
        return measure(text)

    kept = _run(keep_head_and_tail(prompt, target_tokens=target_tokens, count=count))
    if kept is None:
        assert not prompt or measure(omission_marker(len(prompt))) > target_tokens
        return
    half_chars = kept.kept_chars // 2
    assert kept.prompt == head_and_tail(prompt, half_chars)
    assert kept.omitted_chars >= 1 and kept.kept_chars + kept.omitted_chars == len(prompt)
    assert kept.prompt_tokens == measure(kept.prompt) <= target_tokens
    assert calls <= 3 + 3 * math.ceil(math.log2((len(prompt) - 1) // 2 + 2))  # at most ~3 times a bisection
