"""The search for the most characters a cut may keep (gateway/fitting/search.py): the bisection's answer, in fewer
counts, for any count that grows with what is kept."""

from __future__ import annotations

import asyncio
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.fitting.search import largest_fitting


def _search(high: int, counts: list[int], target: int) -> tuple[int | None, int]:
    found, asked = _asked(high, counts, target)
    return found, len(asked)


def _asked(high: int, counts: list[int], target: int) -> tuple[int | None, list[int]]:
    """What ``largest_fitting`` finds over ``counts``, and the candidates it had counted, in order."""
    asked: list[int] = []

    async def keeping(h: int) -> int:
        asked.append(h)
        return h

    def tokens(h: int) -> int:
        return counts[h]

    async def search() -> int | None:
        found: int | None = await largest_fitting(high, keeping, tokens, target)
        return found

    return asyncio.run(search()), asked


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=0, max_value=5000),
    st.integers(min_value=0, max_value=500),
    st.floats(min_value=0.5, max_value=12.0),
    st.integers(min_value=0, max_value=3000),
    st.integers(min_value=0, max_value=2**31),
)
def test_the_answer_is_the_largest_that_fits_in_few_counts(
    high: int, base: int, chars_per_token: float, target: int, seed: int
) -> None:
    """Counts that grow with h, with the steps of a real tokenizer (a jitter that never makes them shrink)."""
    counts, level = [], float(base)
    for h in range(high + 1):
        counts.append(math.floor(level))
        level += 2 / chars_per_token * (1 + ((seed >> (h % 31)) & 1) * 0.5)
    found, asked = _search(high, counts, target)
    fitting = [h for h in range(high + 1) if counts[h] <= target]
    assert found == (max(fitting) if fitting else None)
    assert asked <= 3 * math.ceil(math.log2(high + 2)) + 3  # never more than about three times a bisection


def test_a_typical_cut_takes_a_handful_of_counts() -> None:
    """100,000 characters a side, 4.3 characters a token, a target of 4,000 tokens: the bisection would count 17
    candidates, most of them megabyte-sized; the search counts a few near the answer."""
    high = 100_000
    counts = [20 + math.ceil(2 * h / 4.3) for h in range(high + 1)]
    found, asked = _search(high, counts, 4000)
    assert found == max(h for h in range(high + 1) if counts[h] <= 4000)
    assert asked <= 6, asked
    assert all(abs(h - found) <= found // 10 for h in _asked(high, counts, 4000)[1][1:])  # each near the answer
