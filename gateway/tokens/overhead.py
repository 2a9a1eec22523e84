"""Learn a model's chat-template overhead from the prompt lengths its backend reports.

Ollama renders chats with its own Go templates, which the gateway does not run. It does know each message's content
tokens exactly (the model's GGUF tokenizer), and Ollama reports `prompt_eval_count` for every request, so

    prompt_tokens = content_tokens + per_message * n_messages + per_request

is fitted online by least squares over a window of recent requests. Until the fit has two distinct message counts
it stays conservative: a generous default per message, and per request the most any sample needed beyond that.
Predictions add the largest positive residual seen, so they never fall below a request already observed.
A sample whose reported count is below its content tokens (silent truncation) is ignored.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Overhead:
    """Template tokens per message and per request, and whether the fit reproduces every sample exactly."""

    per_message_tokens: float
    per_request_tokens: float
    exact: bool

    def tokens(self, n_messages: int) -> int:
        return max(0, round(self.per_message_tokens * n_messages + self.per_request_tokens))


class OverheadEstimator:
    """Online estimate of one model's per-message and per-request template tokens.

    The window holds (messages, tokens beyond the content) pairs; the fit runs over the distinct pairs with their
    counts, so a steady stream of alike requests costs O(1) each (the fit is not redone when the window's contents
    do not change).
    """

    def __init__(
        self,
        *,
        default_per_message_tokens: float = 10.0,
        default_per_request_tokens: float = 64.0,
        window: int = 64,
        exact_after: int = 3,
    ) -> None:
        if window < 1:
            raise ValueError(f"the overhead window must hold at least one sample, not {window}")
        self.default_per_message_tokens = default_per_message_tokens
        self.default_per_request_tokens = default_per_request_tokens
        self.exact_after = exact_after
        self._window: deque[tuple[int, int]] = deque(maxlen=window)
        self._pairs: Counter[tuple[int, int]] = Counter()
        self._current = Overhead(default_per_message_tokens, default_per_request_tokens, exact=False)

    @property
    def samples(self) -> int:
        return len(self._window)

    def current(self) -> Overhead:
        return self._current

    def observe(self, n_messages: int, content_tokens: int, observed_tokens: int) -> bool:
        """Add one request's reported prompt length; False when the sample was rejected (truncated)."""
        if observed_tokens < content_tokens or n_messages < 0:
            return False
        pair = (n_messages, observed_tokens - content_tokens)
        window = self._window
        evicted = window[0] if len(window) == window.maxlen else None
        window.append(pair)
        if evicted == pair:
            return True  # the same multiset of samples: the same fit
        if evicted is not None:
            self._pairs[evicted] -= 1
            if not self._pairs[evicted]:
                del self._pairs[evicted]
        self._pairs[pair] += 1
        self._current = self._fit()
        return True

    def _fit(self) -> Overhead:
        pairs = self._pairs
        if len({x for x, _ in pairs}) < 2:
            slope = self.default_per_message_tokens
            intercept = max(y - slope * x for x, y in pairs)
            return Overhead(slope, intercept, exact=False)
        n = sum(pairs.values())
        mean_x = sum(x * w for (x, _), w in pairs.items()) / n
        mean_y = sum(y * w for (_, y), w in pairs.items()) / n
        sxx = sum(w * (x - mean_x) ** 2 for (x, _), w in pairs.items())
        slope = sum(w * (x - mean_x) * (y - mean_y) for (x, y), w in pairs.items()) / sxx
        slope = max(0.0, slope)
        intercept = mean_y - slope * mean_x
        residuals = [y - (slope * x + intercept) for x, y in pairs]
        exact = n >= self.exact_after and all(abs(r) < 1e-6 for r in residuals) and _is_integral(slope, intercept)
        return Overhead(slope, intercept + max(0.0, max(residuals)), exact=exact)


def _is_integral(*values: float) -> bool:
    return all(abs(v - round(v)) < 1e-6 for v in values)
