"""The most characters a head-and-tail cut may keep and still fit the target (pure; head_tail.py, message_cut.py).

A cut's count grows with the characters it keeps, about linearly (a tokenizer averages a few characters a token).
A bisection over ``0 .. high`` costs ``log2(high)`` counts, the first ones of candidates far larger than the answer;
for a message of megabytes that is megabytes tokenized, and on llama-server or vLLM one HTTP round trip a count.
So the search guesses from what it has counted:

    first       4 characters a token (``CHARS_PER_TOKEN_GUESS``), the common case
    then        the secant: between the two ends of the bracket once there are two (aimed half a token past the
                target, into the last token that fits), else from 0 through the largest that fits so far, aimed a
                little past (``OVERSHOOT``) so that the next count closes the bracket around the answer instead of
                creeping up to it
    safeguard   after two steps in a row that did not halve the bracket, a halving: the search never takes more
                than about three times a bisection's counts (a count that grows in steps, not smoothly)

For a tokenizer's counts (near linear) it ends in about 6 counts, all of candidates near the answer. The answer is
the bisection's: the largest ``h`` in ``0 .. high`` whose count fits (for counts that grow with ``h``), one counted.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
CHARS_PER_TOKEN_GUESS = 4
OVERSHOOT = 1.02
STALLS_BEFORE_HALVING = 2


async def largest_fitting(
    high: int, keeping: Callable[[int], Awaitable[T]], tokens_of: Callable[[T], int], target_tokens: int
) -> T | None:
    """``keeping(h)`` for the largest ``h`` in ``0 .. high`` whose ``tokens_of`` is at most ``target_tokens``; None
    when even ``h = 0`` is over it."""
    best = await keeping(0)
    base = tokens_of(best)
    if base > target_tokens:
        return None
    low, low_tokens = 0, base  # keeping `low` fits, and `best` is that
    above, above_tokens = high + 1, -1  # keeping `above` does not fit (or is past `high`; -1: not counted)
    probe = (target_tokens - base) * CHARS_PER_TOKEN_GUESS // 2
    stalls = -1  # steps in a row that did not halve the bracket (the first guess does not count)
    while above - low > 1:
        width = above - low
        candidate = await keeping(min(max(probe, low + 1), above - 1))
        counted = tokens_of(candidate)
        if counted <= target_tokens:
            low, low_tokens, best = min(max(probe, low + 1), above - 1), counted, candidate
        else:
            above, above_tokens = min(max(probe, low + 1), above - 1), counted
        stalls = 0 if 2 * (above - low) <= width else stalls + 1
        if stalls >= STALLS_BEFORE_HALVING or (above_tokens <= low_tokens and low_tokens <= base):
            probe, stalls = (low + above) // 2, 0
        elif above_tokens > low_tokens:  # the secant between the bracket's ends, aimed mid-way into the last token
            probe = low + math.floor((target_tokens + 0.5 - low_tokens) * (above - low) / (above_tokens - low_tokens))
        else:  # only fitting points so far: from 0 through `low`, a little past where it aims
            probe = math.ceil(low * (target_tokens - base) / (low_tokens - base) * OVERSHOOT) + 1
    return best
