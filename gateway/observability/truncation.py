"""Silent truncation: the backend evaluated fewer prompt tokens than kvgate counted (pure; no I/O, no clock).

Ollama cuts a prompt that does not fit ``num_ctx`` (oldest messages first, then tokens down to about half the
context) and still answers 200; only the smaller prompt length it reports (``prompt_eval_count``,
``usage.prompt_tokens``) shows it (facts/ollama.md section 4.6). Every reply that reports a prompt length is compared
with kvgate's count of the prompt it forwarded:

    counted    |==================================== kvgate's count ====|
    reported   |======== backend's figure ==|      .                   |
                                            |<-- shortfall ---------->|
                                                   |<-- tolerance --->|   shortfall > tolerance: truncated

The tolerance depends on how far the count itself can be off (see :func:`tolerance_tokens`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

EXACT_SLACK_TOKENS = 4
"""An exact count may still differ by a BOS/EOS or a generation prompt the template adds or drops."""
EXACT_SLACK_FRACTION = 0.01
INEXACT_SLACK_TOKENS = 128
"""Before a model's template overhead is learned, small chats are over-counted by tens of tokens."""
TOKENIZER_SLACK_FRACTION = 0.25
"""A tokenizer count that is not exact: the text was tokenized, but the template overhead is still a guess or the
vocabulary is borrowed (tiktoken for another model), which shifts long texts by up to a fifth."""
ESTIMATE_OVERCOUNT_FACTOR = 2.0
"""How far the byte estimate may run high before its margin: it assumes 3 bytes per token where English on large
vocabularies runs 4 to 6."""
BYTE_ESTIMATE_COUNTER = "estimate"
"""``EstimateCounter.name``, the counter that never tokenizes."""

TRUNCATED_HEADER = "X-Kvgate-Truncated"


def tolerance_tokens(counted_tokens: int, *, exact: bool, byte_estimate: bool, estimate_margin: float) -> int:
    """How many tokens the backend's figure may fall short of ``counted_tokens`` without it meaning truncation.

    A false alarm would teach operators to ignore the real one, so the tolerance is as wide as the count's own error
    can be, and no wider:

    - exact (the backend's tokenizer and template): ``max(4, 1%)``, for special tokens a template adds or drops;
    - a tokenizer count that is not exact: ``max(128, 25%)``, for the unlearned template overhead (tens of tokens
      per chat) or a borrowed vocabulary;
    - the byte estimate (``byte_estimate``), which leans high on purpose so admission never under-reserves: it adds
      ``estimate_margin`` to a bytes-per-token ratio up to :data:`ESTIMATE_OVERCOUNT_FACTOR` too pessimistic, so a
      figure down to ``counted / (factor * (1 + margin))`` is explained by the estimate itself (about 55%).

    Ollama's truncation keeps about half of ``num_ctx`` of a prompt longer than ``num_ctx``, so it shows beyond all
    three: a 6,078-token estimate reported as 2,051 is a truncation. (A byte estimate only a little over ``num_ctx``
    and cut to half of it can hide inside that 55%: the price of no false alarms on estimated counts.)
    """
    if counted_tokens <= 0:
        return 0
    if exact:
        return max(EXACT_SLACK_TOKENS, math.ceil(counted_tokens * EXACT_SLACK_FRACTION))
    if not byte_estimate:
        return max(INEXACT_SLACK_TOKENS, math.ceil(counted_tokens * TOKENIZER_SLACK_FRACTION))
    floor_tokens = counted_tokens / (ESTIMATE_OVERCOUNT_FACTOR * (1.0 + max(0.0, estimate_margin)))
    return max(INEXACT_SLACK_TOKENS, counted_tokens - math.floor(floor_tokens))


@dataclass(frozen=True, slots=True)
class Truncation:
    """A reply whose reported prompt length is short of kvgate's count by more than the tolerance."""

    counted_tokens: int
    reported_tokens: int
    exact: bool
    counter: str = ""

    @property
    def missing_tokens(self) -> int:
        return self.counted_tokens - self.reported_tokens

    def describe(self) -> str:
        """The value of :data:`TRUNCATED_HEADER`, also the log line's core."""
        kind = "" if self.exact else " (estimate)"
        return (f"backend reported {self.reported_tokens:,} prompt tokens; kvgate counted "
                f"{self.counted_tokens:,}{kind}")


def detect(
    counted_tokens: int, reported_tokens: int | None, *, exact: bool, estimate_margin: float, counter: str = ""
) -> Truncation | None:
    """The truncation a reply shows, or None (no figure, or a figure within the tolerance). ``counter`` names the
    counter that counted (:data:`BYTE_ESTIMATE_COUNTER` gets the estimate's tolerance)."""
    if reported_tokens is None or reported_tokens < 0:
        return None
    tolerance = tolerance_tokens(counted_tokens, exact=exact, byte_estimate=counter == BYTE_ESTIMATE_COUNTER,
                                 estimate_margin=estimate_margin)
    if counted_tokens - reported_tokens <= tolerance:
        return None
    return Truncation(counted_tokens, reported_tokens, exact, counter)
