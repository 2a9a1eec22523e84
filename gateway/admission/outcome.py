"""What the admission step did to one request, as data, and the small pure renderers that show it.

    Admitter.admit(...) -> Granted(body, outcome, permit)
                                      |
              +-----------------------+-------------------------+
              v                       v                         v
    response_headers(outcome)   log_fields(outcome)   decision_labels(outcome)
    (X-Kvgate-* to the client)  (the request's log)   (kvgate_decisions_total, via metrics.record)

Nothing reads a header back: every consumer renders the outcome it needs. No I/O, no clock, no asyncio here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gateway.admission.elastic import Growth
from gateway.admission.permit import Permit
from gateway.admission.types import PoolKey
from gateway.fitting.trim import describe_trim
from gateway.tokens.count import TokenCount

PROMPT_TOKENS_HEADER = "X-Kvgate-Prompt-Tokens"
COUNTER_HEADER = "X-Kvgate-Counter"
TRIMMED_HEADER = "X-Kvgate-Trimmed"
SUMMARIZED_HEADER = "X-Kvgate-Summarized"
RESERVED_TOKENS_HEADER = "X-Kvgate-Reserved-Tokens"
QUEUE_WAIT_HEADER = "X-Kvgate-Queue-Wait"
REWRITE_HEADER = "X-Kvgate-Rewrite"
CONTEXT_LOWERED_HEADER = "X-Kvgate-Context-Lowered"
OFFLOAD_HEADER = "X-Kvgate-Offload"


class AdmissionDecision(StrEnum):
    """How a request that was not refused went through."""

    ADMITTED = "admitted"
    """Reserved in its pool at once."""
    ADMITTED_AFTER_WAIT = "admitted_after_wait"
    """Reserved in its pool after waiting in the queue."""
    FORWARDED_WITHOUT_POOL = "forwarded_without_pool"
    """No pool to plan against (admission off, or a backend that reports no KV layout): only the tenant's output
    cap applied."""


@dataclass(frozen=True, slots=True)
class Trim:
    """The oldest history dropped so the prompt fits the context (``text``: a prompt's head and tail kept instead);
    ``reason``: why a summary was not used first, when the policy tried one."""

    dropped_messages: int
    of_messages: int
    before_tokens: int
    after_tokens: int
    reason: str | None = None
    text: str | None = None
    summary_failure: str | None = None
    """The bounded reason (``summarize.SummaryFailed.reason``) of the summary tried first, when one failed."""

    def describe(self) -> str:
        said = self.text or describe_trim(self.dropped_messages, self.of_messages, self.before_tokens,
                                          self.after_tokens)
        return said if self.reason is None else f"{said}; {self.reason}"


@dataclass(frozen=True, slots=True)
class SummaryNote:
    """The oldest turns replaced by one summary so the prompt fits the context."""

    replaced_messages: int
    of_messages: int
    before_tokens: int
    after_tokens: int
    cached: bool

    def describe(self) -> str:
        said = (f"replaced the {self.replaced_messages} oldest of {self.of_messages} messages with a summary; "
                f"prompt {self.before_tokens:,} -> {self.after_tokens:,} tokens")
        return f"{said}; cached" if self.cached else said


@dataclass(frozen=True, slots=True)
class Reserved:
    """What the request holds in its pool until its response ends."""

    pool: PoolKey
    tokens: int
    sequences: int
    limit_tokens: int | None = None
    """An elastic reservation: the most ``tokens`` may grow to as the reply streams (``elastic``); None: fixed."""


@dataclass(frozen=True, slots=True)
class AdmissionOutcome:
    """One admitted request: its count (and the recount that replaced it), what was rewritten or trimmed, how long
    it waited, what it holds, and the notes of the planner and the pool directory, for operators."""

    count: TokenCount
    recount: TokenCount | None = None
    """A later count the request was admitted on (a real count of a prompt that looked too long)."""
    rewrites: tuple[str, ...] = ()
    """The changes made to the body, as the rewriter describes them ("options.num_ctx=8192 (was 16384)")."""
    trim: Trim | None = None
    summary: SummaryNote | None = None
    waited_s: float = 0.0
    reserved: Reserved | None = None
    notes: tuple[str, ...] = ()
    context_lowered: tuple[int, int] | None = None
    """(asked, loaded): kvgate loaded the model at a smaller context than asked, to fit GPU memory."""
    offload: str | None = None
    """What of the model runs on the CPU (it did not fit the GPU: ``residency.when_gpu_full = 'offload'``)."""

    @property
    def summary_failure(self) -> str | None:
        """Why a summary tried before the trim failed (a bounded label), or None."""
        return self.trim.summary_failure if self.trim is not None else None

    @property
    def pinned(self) -> bool:
        """Whether the context the request asked for (``num_ctx``) was rewritten to the loaded one."""
        return any(rewrite_kind(change) == "context" for change in self.rewrites)

    @property
    def clamped(self) -> bool:
        """Whether an output limit was lowered (or one written where the client set none)."""
        return any(rewrite_kind(change) == "output" for change in self.rewrites)

    @property
    def decision(self) -> AdmissionDecision:
        if self.reserved is None:
            return AdmissionDecision.FORWARDED_WITHOUT_POOL
        if self.waited_s > 0:
            return AdmissionDecision.ADMITTED_AFTER_WAIT
        return AdmissionDecision.ADMITTED

    @property
    def counted(self) -> TokenCount:
        """The count the request was admitted on: the recount if there was one."""
        return self.count if self.recount is None else self.recount

    @property
    def forwarded_count(self) -> TokenCount:
        """The count of the prompt the backend gets: after a trim, the trimmed prompt's (by the same counter)."""
        counted = self.counted
        changed = self.trim or self.summary
        if changed is None:
            return counted
        return TokenCount(changed.after_tokens, counted.counter, counted.exact)


@dataclass(slots=True)
class Granted:
    """A request the admission step let through: the body to forward (rewritten, or the client's own bytes), what
    happened, and the permit holding its reservation (None without a pool), released exactly once."""

    body: bytes
    outcome: AdmissionOutcome
    permit: Permit | None = None
    growth: Growth | None = None
    """The reply's elastic reservation, followed as it streams (``elastic``); None: a fixed one, or none."""

    @property
    def lease(self) -> int | None:
        """The reservation's id (its lease's, with a shared ledger), None without a pool."""
        return None if self.permit is None else self.permit.reservation.id

    def release(self) -> None:
        if self.permit is not None:
            self.permit.release()


def count_headers(count: TokenCount) -> dict[str, str]:
    return {
        PROMPT_TOKENS_HEADER: str(count.tokens),
        COUNTER_HEADER: f"{count.counter}; {'exact' if count.exact else 'estimate'}",
    }


def response_headers(outcome: AdmissionOutcome) -> dict[str, str]:
    """The X-Kvgate-* headers that tell the client what admission did (in the order they have always been sent)."""
    headers = count_headers(outcome.forwarded_count)
    if outcome.trim is not None:
        headers[TRIMMED_HEADER] = outcome.trim.describe()
    if outcome.summary is not None:
        headers[SUMMARIZED_HEADER] = outcome.summary.describe()
    if outcome.reserved is not None:
        headers[RESERVED_TOKENS_HEADER] = str(outcome.reserved.tokens)
        headers[QUEUE_WAIT_HEADER] = f"{outcome.waited_s:.3f}"
    if outcome.rewrites:
        headers[REWRITE_HEADER] = "; ".join(outcome.rewrites)
    if outcome.context_lowered is not None:
        asked, loaded = outcome.context_lowered
        headers[CONTEXT_LOWERED_HEADER] = f"{loaded} (asked {asked}; GPU memory)"
    if outcome.offload is not None:
        headers[OFFLOAD_HEADER] = outcome.offload
    return headers


def log_fields(outcome: AdmissionOutcome) -> dict[str, object]:
    """Fields for the request's log line."""
    count = outcome.forwarded_count
    fields: dict[str, object] = {
        "decision": outcome.decision.value, "prompt_tokens": count.tokens, "counter": count.counter,
        "exact": count.exact,
    }
    if outcome.reserved is not None:
        fields["reserved_tokens"] = outcome.reserved.tokens
        fields["queue_wait_s"] = round(outcome.waited_s, 3)
    if outcome.trim is not None:
        fields["trimmed_messages"] = outcome.trim.dropped_messages
        if outcome.trim.reason:
            fields["summary_failed"] = outcome.trim.reason
    if outcome.summary is not None:
        fields["summarized_messages"] = outcome.summary.replaced_messages
        fields["summary_cached"] = outcome.summary.cached
    if outcome.context_lowered is not None:
        fields["context_lowered_from"], fields["context_tokens"] = outcome.context_lowered
    if outcome.offload is not None:
        fields["offload"] = outcome.offload
    return fields


def rewrite_kind(change: str) -> str:
    """Which limit one change of ``fitting.rewrite.apply_rewrites`` (``"FIELD=VALUE (was ...)"``) rewrote:
    "context" for the context a dialect carries (Ollama's ``options.num_ctx``, its only one), else "output"."""
    field = change.split("=", 1)[0]
    return "context" if field.rsplit(".", 1)[-1] == "num_ctx" else "output"


def decision_labels(outcome: AdmissionOutcome) -> tuple[str, ...]:
    """The ``decision`` labels of ``kvgate_decisions_total`` an admitted request counts in (one request may count in
    several): admitted (reserved in its pool) and queued (after a wait), or forwarded_without_pool; rewritten (any
    field), and apart: clamped (an output limit lowered), pinned (``num_ctx`` set to the loaded context),
    context_lowered (the model loaded at a smaller context than asked); trimmed, summarized, summary_failed (a
    summary tried first failed, and the request was trimmed instead). A refusal is counted by the proxy
    (``observability.outcomes``)."""
    labels: list[str] = []
    if outcome.reserved is not None:
        labels.append("admitted")
        if outcome.decision is AdmissionDecision.ADMITTED_AFTER_WAIT:
            labels.append("queued")
        if outcome.reserved.limit_tokens is not None:
            labels.append("elastic")
    else:
        labels.append("forwarded_without_pool")
    if outcome.rewrites:
        labels.append("rewritten")
    if outcome.clamped:
        labels.append("clamped")
    if outcome.pinned:
        labels.append("pinned")
    if outcome.context_lowered is not None:
        labels.append("context_lowered")
    if outcome.trim is not None:
        labels.append("trimmed")
    if outcome.summary is not None:
        labels.append("summarized")
    if outcome.summary_failure is not None:
        labels.append("summary_failed")
    return tuple(labels)
