"""What every token counter returns and promises.

    Counter.count_chat(messages, tools) -> TokenCount    the prompt a chat request becomes (template included)
    Counter.count_text(text, add_special) -> TokenCount  a raw prompt (/api/generate, /completion, /v1/completions)

A counter that cannot answer raises CounterUnavailable with a reason (server unreachable, tokenizer missing or
unsupported); CounterChain then asks the next one. `exact` says whether the number is what the backend will count
(its own tokenizer and template) or an estimate that the planner should treat with a margin.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

Message = Mapping[str, Any]
Tool = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class TokenCount:
    """A prompt length in tokens, which counter produced it, and whether it is exact. ``per_prompt`` is each
    prompt's own length for a request the backend runs as several sequences (a multi-prompt batch, the inputs of an
    embedding, a rerank's documents), in order; ``tokens`` is then their sum. Empty for a request of one prompt."""

    tokens: int
    counter: str
    exact: bool
    per_prompt: tuple[int, ...] = ()
    content_tokens: int | None = None
    """For a chat counted as its contents plus the learned template overhead: the contents' own tokens, which
    calibration against the backend's reported length takes from here instead of counting them again."""


class CounterUnavailable(Exception):
    """Raised when a counter cannot count right now; the message names the counter, the model and why. ``quiet``: an
    expected absence (a server without a tokenize endpoint), logged at INFO rather than as a warning."""

    def __init__(self, counter: str, reason: str, *, quiet: bool = False) -> None:
        super().__init__(f"{counter}: {reason}")
        self.counter = counter
        self.reason = reason
        self.quiet = quiet


@runtime_checkable
class Counter(Protocol):
    """Counts the tokens of one model's prompts."""

    @property
    def name(self) -> str: ...

    async def count_chat(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> TokenCount: ...

    async def count_text(self, text: str | bytes, *, add_special: bool = True) -> TokenCount: ...


@runtime_checkable
class Calibrating(Protocol):
    """A counter that learns from the prompt lengths a backend reports (the chat-template overhead)."""

    async def calibrate(
        self, messages: Sequence[Message], tools: Sequence[Tool], observed_prompt_tokens: int,
        content_tokens: int | None = None,
    ) -> None:
        """``content_tokens``: the messages' and tools' own tokens, where this counter counted them already."""
