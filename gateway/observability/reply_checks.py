"""After a reply whose prompt kvgate counted (the proxy's "release + observe" step): the prompt length the backend
reported is checked against kvgate's count of what it forwarded (a silent truncation is logged, counted, kept for the
status page, and named in a header when the reply is held whole), and an Ollama model's template overhead is learned
from it (``PromptCounter.calibrate``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from gateway.admission.outcome import AdmissionOutcome
from gateway.backends import Backend
from gateway.config.reload import LiveSettings
from gateway.domain import NO_OUTPUT_OPERATIONS, Operation, ParsedRequest
from gateway.observability import truncation
from gateway.observability.logs import ClientText, request_id_var
from gateway.observability.metrics import Metrics, record_truncation
from gateway.observability.truncations import model_label
from gateway.observability.usage import UsageObserver
from gateway.runtimes import runtime_for
from gateway.support.safe_text import sanitize
from gateway.tokens import TokenCount
from gateway.tokens.prompt_counter import ESTIMATE_COUNTER, PromptCounter

log = logging.getLogger("gateway.proxy")  # the request path's logger, as before this left proxy.py


def usage_counts_prompt(parsed: ParsedRequest, count: TokenCount | None) -> bool:
    """Whether the reply's usage reports the whole prompt kvgate counted (checked for a silent truncation): not for
    a multi-prompt completion (llama-server reports its first prompt's usage) nor a rerank (llama-server wraps each
    pair in tokens kvgate does not see)."""
    if count is None or parsed.operation is Operation.RERANK:
        return False
    return parsed.operation in NO_OUTPUT_OPERATIONS or len(count.per_prompt) <= 1


class ReplyChecks:
    def __init__(self, live: LiveSettings[Any], counter: PromptCounter, metrics: Metrics) -> None:
        self._live = live
        self._counter = counter
        self._metrics = metrics

    async def observe(
        self, parsed: ParsedRequest, backend: Backend, outcome: AdmissionOutcome, seen: int | None, model: str,
    ) -> None:
        """Check the prompt length the backend reported against kvgate's count of the prompt it forwarded (a silent
        truncation is logged, counted and shown on the status page), then, for Ollama with a real count, learn the
        model's template overhead from it (the estimator ignores samples below the content's own tokens: those
        prompts were cut)."""
        if seen is None:
            return
        margin = self._live.settings.counting.estimate_safety_margin
        forwarded = outcome.forwarded_count
        found = truncation.detect(forwarded.tokens, seen, exact=forwarded.exact, estimate_margin=margin,
                                  counter=forwarded.counter)
        if found is not None and found.counter == ESTIMATE_COUNTER:
            # a byte estimate can run high by more than any tolerance: count the prompt for real before calling the
            # backend's figure a truncation (the client is served; the tokenizer has had time to load)
            recounted = await self._counter.count(parsed, backend, model,
                                                   budget_s=self._live.settings.counting.refusal_count_wait_s)
            if recounted.counter != ESTIMATE_COUNTER and outcome.trim is None:
                found = truncation.detect(recounted.tokens, seen, exact=recounted.exact, estimate_margin=margin,
                                          counter=recounted.counter)
        if found is not None:
            self.report(parsed, backend, model, found)
        count = outcome.count
        if count.counter != ESTIMATE_COUNTER and not count.exact and runtime_for(backend).calibrates_estimates:
            # an exact count has nothing to learn; the count's contents' tokens are not counted again
            await self._counter.calibrate(parsed, backend, model, seen, count)

    def report(
        self, parsed: ParsedRequest, backend: Backend, model: str, found: truncation.Truncation
    ) -> None:
        """Log, count and keep for the status page; the metric's model label is bounded by the backend's list."""
        request_id = request_id_var.get()
        label = model_label(backend.models, model or parsed.model)
        log.warning("silent truncation: %s; backend '%s', model '%s' (asked as %s): it cut the prompt",
                    found.describe(), backend.name, label, ClientText(sanitize(parsed.model or "")),
                    extra={"request_id": request_id, "backend": backend.name, "model": label,
                           "counted_tokens": found.counted_tokens, "reported_tokens": found.reported_tokens})
        record_truncation(self._metrics, request_id, backend.name, label, found)


@dataclass(frozen=True, slots=True)
class TruncationCheck:
    """What a reply held whole is checked against: the prompt kvgate forwarded, as counted."""

    forwarded: TokenCount
    estimate_margin: float
    """``counting.estimate_safety_margin``."""


def truncation_header(observer: UsageObserver, check: TruncationCheck, status: int) -> dict[str, str]:
    """For a reply held whole before its headers go out: name a silent truncation in a header."""
    if status != 200:
        return {}
    forwarded = check.forwarded
    found = truncation.detect(forwarded.tokens, observer.prompt_tokens(), exact=forwarded.exact,
                              estimate_margin=check.estimate_margin, counter=forwarded.counter)
    if found is None or found.counter == ESTIMATE_COUNTER:  # an estimate is checked by a recount, later
        return {}
    return {truncation.TRUNCATED_HEADER: found.describe()}
