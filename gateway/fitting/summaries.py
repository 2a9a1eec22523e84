"""The summaries of one kvgate: the cache of ``summarize.SummaryCache`` and the ``Summarizer`` that writes new ones.

``Summaries.fit`` is what the admission step calls for a chat too long for its context under a policy that allows
summaries: ``summarize.summarize_history`` with the request's own counter, the policy's model and instructions in
the cache key, and the summary role its dialect allows (Anthropic's messages have no system role).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from gateway.domain import Dialect
from gateway.fitting.policy import FitPolicy
from gateway.fitting.summarize import Message, Summarized, SummaryCache, summarize_history, summary_key
from gateway.fitting.summarizer import Summarizer


class Summaries:
    def __init__(self, summarizer: Summarizer, *, cache_entries: int) -> None:
        self.summarizer = summarizer
        self.cache = SummaryCache(cache_entries)

    async def fit(
        self,
        messages: Sequence[Message],
        dialect: Dialect,
        policy: FitPolicy,
        *,
        target_tokens: int,
        count: Callable[[list[Message]], Awaitable[int]],
    ) -> Summarized | None:
        """The history with its oldest turns summarized, fitting ``target_tokens``; None when no turn may be
        summarized; ``SummaryFailed`` when the summary can't be had or does not fit."""
        model = policy.summary_model or ""
        instructions = policy.summary_instructions

        async def summarize(replaced: list[Message]) -> str:
            return await self.summarizer.summarize(replaced, policy)

        return await summarize_history(
            messages, keep_newest_turns=policy.keep_newest_turns, target_tokens=target_tokens, count=count,
            summarize=summarize, cache=self.cache,
            key_for=lambda replaced: summary_key(model, instructions, replaced),
            summary_role="user" if dialect is Dialect.ANTHROPIC else "system",
        )
