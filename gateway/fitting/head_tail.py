"""Fit a plain prompt (no turns to summarize or drop) by keeping its head and tail and omitting the middle.

```
 prompt    | head: first h characters | ........ middle ........ | tail: last h characters |
 kept      | head | \\n[... 5,400 characters omitted by kvgate ...]\\n | tail |
```
The start of a prompt usually says what to do and the end what to do it to (or the question), so both halves are
kept, equal in length. The number of characters kept ``h`` is the largest whose prompt, marker included, counts at
most the target; it is found by bisection over ``0 .. (len - 1) // 2`` (at least one character is omitted: the
caller comes here when the whole prompt does not fit), so it costs ``1 + ceil(log2(h_max + 1))`` counts. A
tokenizer's count need not grow strictly with ``h``, but the result is always one that was counted and fits.
Python strings index code points, so a cut never splits a UTF-16 surrogate pair. The marker says how much was
omitted, to the model and the reader; nothing is omitted silently. Pure: the counter is the caller's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

TextCountFn = Callable[[str], Awaitable[int]]
"""Counts the prompt of a request whose prompt is the given text (template included)."""


@dataclass(frozen=True, slots=True)
class HeadTail:
    prompt: str
    kept_chars: int  # head and tail together, equal halves
    omitted_chars: int
    prompt_tokens: int

    def describe(self, before_tokens: int) -> str:
        """What was kept, in words (the header that tells the client)."""
        half_chars = self.kept_chars // 2
        return (f"kept the first {half_chars:,} and last {half_chars:,} characters of the prompt, "
                f"{self.omitted_chars:,} omitted; prompt {before_tokens:,} -> {self.prompt_tokens:,} tokens")


def omission_marker(omitted_chars: int) -> str:
    return f"\n[... {omitted_chars:,} characters omitted by kvgate ...]\n"


def head_and_tail(prompt: str, half_chars: int) -> str:
    """The first and last ``half_chars`` characters of ``prompt`` around the marker for what is left out."""
    omitted_chars = len(prompt) - 2 * half_chars
    return prompt[:half_chars] + omission_marker(omitted_chars) + prompt[len(prompt) - half_chars:]


async def keep_head_and_tail(prompt: str, *, target_tokens: int, count: TextCountFn) -> HeadTail | None:
    """The head-and-tail prompt keeping the most characters that counts at most ``target_tokens``.

    None when the prompt is empty or even the marker alone does not fit.
    """
    if not prompt:
        return None

    async def keeping(half_chars: int) -> HeadTail:
        text = head_and_tail(prompt, half_chars)
        return HeadTail(text, 2 * half_chars, len(prompt) - 2 * half_chars, await count(text))

    best = await keeping(0)
    if best.prompt_tokens > target_tokens:
        return None
    low, high = 0, (len(prompt) - 1) // 2  # invariant: keeping `low` each side fits, and `best` is that
    while low < high:
        middle = (low + high + 1) // 2
        candidate = await keeping(middle)
        if candidate.prompt_tokens <= target_tokens:
            low, best = middle, candidate
        else:
            high = middle - 1
    return best
