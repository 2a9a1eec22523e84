"""Fit a plain prompt (no turns to summarize or drop) by keeping its head and tail and omitting the middle.

```
 prompt    | head: first h characters | ........ middle ........ | tail: last h characters |
 kept      | head | \\n[... 5,400 characters omitted by kvgate ...]\\n | tail |
```
The start of a prompt usually says what to do and the end what to do it to (or the question), so both halves are
kept, equal in length. The number of characters kept ``h`` is the largest whose prompt, marker included, counts at
most the target; it is searched for over ``0 .. min((len - 1) // 2, target * MAX_CHARS_PER_TOKEN)`` (at least one
character is omitted: the caller comes here when the whole prompt does not fit) by ``search.largest_fitting``, in a
handful of counts of candidates near the answer. A tokenizer's count need not grow strictly with ``h``, but the
result is always one that was counted and fits.
Python strings index code points, so a cut never splits a UTF-16 surrogate pair. The marker says how much was
omitted, to the model and the reader; nothing is omitted silently. Pure: the counter is the caller's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gateway.fitting.search import largest_fitting

TextCountFn = Callable[[str], Awaitable[int]]
"""Counts the prompt of a request whose prompt is the given text (template included)."""
MAX_CHARS_PER_TOKEN = 16
"""The search never tries to keep more than this many characters per target token on each side: no tokenizer
packs that many into its average token (English runs about 4 characters a token, code 3), so nothing that could
fit is missed, and each count's work is bounded by the target, not by the size of what the client sent (a 5 MiB
message costs counts of at most ``2 * 16 * target`` characters, never of megabytes)."""


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

    high = min((len(prompt) - 1) // 2, max(0, target_tokens) * MAX_CHARS_PER_TOKEN)
    return await largest_fitting(high, keeping, lambda kept: kept.prompt_tokens, target_tokens)
