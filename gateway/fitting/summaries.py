"""The summaries of one kvgate: the cache of ``summarize.SummaryCache`` and the ``Summarizer`` that writes new ones.

``Summaries.fit`` is what the admission step calls for a chat too long for its context under a policy that allows
summaries: ``summarize.summarize_history`` with the request's own counter, the policy's model and instructions in
the cache key, and the summary role its dialect allows (Anthropic's messages have no system role).

Every summary that was tried and failed is counted here, by reason (``failures``: the summary call timed out or
failed, the conversation was too long for the summary model, or no summary makes the prompt fit, including a chat
with no turn to spare), whether the summary model was called or not: each such request is then trimmed or refused.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Sequence

from gateway.domain import Dialect
from gateway.fitting.policy import FitPolicy
from gateway.fitting.summary_fit import (
    SUMMARY_NO_FIT,
    Message,
    Summarized,
    SummaryCache,
    SummaryFailed,
    SummaryGoal,
    summarize_history,
    summary_key,
)
from gateway.fitting.summary_writer import Summarizer


class Summaries:
    def __init__(self, summarizer: Summarizer, *, cache_entries: int) -> None:
        self.summarizer = summarizer
        self.cache = SummaryCache(cache_entries)
        self.failures: Counter[str] = Counter()
        """Summaries tried that failed, by ``SummaryFailed.reason``."""

    async def fit(
        self,
        messages: Sequence[Message],
        dialect: Dialect,
        policy: FitPolicy,
        *,
        target_tokens: int,
        count: Callable[[list[Message]], Awaitable[int]],
    ) -> Summarized:
        """The history with its oldest turns summarized, fitting ``target_tokens``; ``SummaryFailed`` when the
        summary can't be had or does not fit, or no turn may be summarized (counted in ``failures``)."""
        model = policy.summary_model or ""
        instructions = policy.summary_instructions

        async def summarize(replaced: list[Message]) -> str:
            return await self.summarizer.summarize(replaced, policy)

        try:
            goal = SummaryGoal(policy.keep_newest_turns, target_tokens,
                               summary_role="user" if dialect is Dialect.ANTHROPIC else "system")
            done = await summarize_history(
                messages, goal, count=count, summarize=summarize, cache=self.cache,
                key_for=lambda replaced: summary_key(model, instructions, replaced),
            )
            if done is None:
                raise SummaryFailed(f"no turn may be summarized: the newest {policy.keep_newest_turns} turn(s) stay "
                                    "verbatim (keep_newest_turns)", SUMMARY_NO_FIT)
        except SummaryFailed as exc:
            self.failures[exc.reason] += 1
            raise
        return done
