"""Ask counters in order of preference; the first that can answer wins.

    llama-server backend:  llama-server's own count -> GGUF (template) -> tokenizer.json -> tiktoken -> estimate
    Ollama backend:        GGUF from /api/show (content + learned overhead) -> tokenizer.json -> tiktoken -> estimate
    OpenAI-compatible:     the server's own /tokenize (vLLM, llama-server) -> GGUF -> tokenizer.json -> tiktoken ->
                           estimate

A counter that raises CounterUnavailable is skipped with a warning naming the model and the reason; the warning is
logged once per (counter, reason) so a dead backend does not flood the log, and again after the counter recovered
and failed anew. With an EstimateCounter last the chain always answers.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from gateway.tokens.count import Calibrating, Counter, CounterUnavailable, Message, TokenCount, Tool

log = logging.getLogger(__name__)


class CounterChain:
    """A Counter that delegates to the first available counter of a list."""

    def __init__(self, model: str, counters: Sequence[Counter], *, logger: logging.Logger = log) -> None:
        if not counters:
            raise ValueError("a counter chain needs at least one counter")
        self.model = model
        self.counters = tuple(counters)
        self._calibrating = tuple(c for c in self.counters if isinstance(c, Calibrating))
        self._log = logger
        self._reported: dict[str, str] = {}

    @property
    def name(self) -> str:
        return "chain(" + ",".join(c.name for c in self.counters) + ")"

    async def count_chat(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> TokenCount:
        return await self._first(lambda c: c.count_chat(messages, tools))

    async def count_text(self, text: str | bytes, *, add_special: bool = True) -> TokenCount:
        return await self._first(lambda c: c.count_text(text, add_special=add_special))

    async def _first(self, ask: Callable[[Counter], Awaitable[TokenCount]]) -> TokenCount:
        reasons = []
        for index, counter in enumerate(self.counters):
            try:
                result = await ask(counter)
            except CounterUnavailable as exc:
                reasons.append(f"{counter.name}: {exc.reason}")
                self._warn(counter, exc.reason, self.counters[index + 1 :], quiet=exc.quiet)
                continue
            self._reported.pop(counter.name, None)
            return result
        raise CounterUnavailable(self.name, f"no counter could count for model {self.model!r}: {'; '.join(reasons)}")

    async def calibrate(self, messages: Sequence[Message], tools: Sequence[Tool], observed_prompt_tokens: int,
                        counted: TokenCount | None = None) -> None:
        """Pass a backend-reported prompt length (Ollama `prompt_eval_count`, OpenAI `usage.prompt_tokens`) to
        every counter that learns from it; counters that cannot load now are skipped. ``counted``: the request's
        count, whose contents' tokens (if any) the counter that produced it reuses."""
        for counter in self._calibrating:
            known = None
            if counted is not None and counted.counter == getattr(counter, "name", None):
                known = counted.content_tokens
            try:
                await counter.calibrate(messages, tools, observed_prompt_tokens, known)
            except CounterUnavailable:
                continue

    def _warn(self, counter: Counter, reason: str, rest: Sequence[Counter], *, quiet: bool = False) -> None:
        if self._reported.get(counter.name) == reason:
            return
        self._reported[counter.name] = reason
        fallback = rest[0].name if rest else "nothing"
        self._log.log(
            logging.INFO if quiet else logging.WARNING,
            "token counter %s unavailable for model %r: %s; falling back to %s",
            counter.name,
            self.model,
            reason,
            fallback,
        )
