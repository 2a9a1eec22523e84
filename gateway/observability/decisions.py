"""The last few hundred admission decisions, for the status page: what kvgate did to each request, and why.

    proxy (the request's last step) --add--> DecisionLog (bounded, newest first) --snapshot--> /kvgate/status "recent"

One entry per request that admission decided on: admitted, queued (admitted after a wait), pinned (``num_ctx`` set
to the loaded context), clamped (an output limit lowered: ``max_tokens``...), trimmed, summarized, or refused by
kvgate itself (``refusal`` set), the most telling one named (the counts of each are ``outcomes.OutcomeTally``). A
request that never reached admission and was not refused (a model listing, a backend that failed) is no decision and
is left out. An entry holds kvgate's own words (the outcome's notes, the refusal's message) and names (tenant,
backend, model, request id), never message contents or keys; every string is safe text (``gateway.support.safe_text``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from gateway.admission.exchange import Exchange
from gateway.admission.outcome import AdmissionDecision, AdmissionOutcome
from gateway.support.safe_text import safe_text

RECENT_DECISIONS = 200
MAX_REASON_CHARS = 500
"""A refusal message names limits and values; anything longer is cut (the log line keeps the whole)."""
MAX_NAME_CHARS = 200
"""A model name may be the client's own string (a llama-server answers any): the log's memory stays bounded."""


@dataclass(frozen=True, slots=True)
class DecisionEvent:
    at_s: float  # wall clock, seconds since the epoch (the page shows it in the reader's time zone)
    request_id: str
    tenant: str
    backend: str
    model: str
    decision: str  # admitted | queued | pinned | clamped | trimmed | summarized | refused
    reason: str
    status: int
    reserved_tokens: int | None
    waited_s: float


def describe(outcome: AdmissionOutcome | None, refusal: str | None, error: str | None) -> tuple[str, str] | None:
    """(decision, reason) of one request, the most telling decision first; None when admission decided nothing."""
    if refusal is not None:
        return "refused", f"{refusal}: {error}" if error else refusal
    if outcome is None:
        return None
    parts = [f"{outcome.forwarded_count.tokens:,} prompt tokens ({outcome.forwarded_count.counter})"]
    decision = "admitted"
    if outcome.decision is AdmissionDecision.FORWARDED_WITHOUT_POOL:
        parts.append("forwarded without a pool (admission off, or no KV layout known)")
    if outcome.waited_s > 0:
        decision = "queued"
        parts.append(f"waited {outcome.waited_s:.2f} s")
    if outcome.rewrites:
        decision = "clamped" if outcome.clamped else "pinned"
        parts.append("; ".join(outcome.rewrites))
    if outcome.trim is not None:
        decision = "trimmed"
        parts.append(outcome.trim.describe())
    if outcome.summary is not None:
        decision = "summarized"
        parts.append(outcome.summary.describe())
    parts.extend(outcome.notes)
    return decision, "; ".join(parts)


_Ended = tuple[float, str, str, str, str, AdmissionOutcome | None, str | None, str | None, int]
"""What ``add`` keeps of a request: wall clock, request id, tenant, backend, model, outcome, refusal, error, status
(all immutable); its ``DecisionEvent`` is rendered only when the status page asks."""


class DecisionLog:
    """The last :data:`RECENT_DECISIONS` decisions, newest first; memory stays bounded whatever the traffic. A
    request's entry is rendered (its reason's words, safe text) when ``snapshot`` reads it, not on the request's
    path: most entries leave the log unread."""

    def __init__(self, keep: int = RECENT_DECISIONS, wall_clock: Callable[[], float] = time.time) -> None:
        self._recent: deque[_Ended] = deque(maxlen=keep)
        self._wall_clock = wall_clock

    def add(self, exchange: Exchange) -> bool:
        """Keep the decision of a request that ended; False for one admission had nothing to say about (no outcome
        and no refusal: ``describe`` gives None)."""
        outcome, refusal = exchange.outcome, exchange.refusal
        if outcome is None and refusal is None:
            return False
        model, error = "-" if exchange.model is None else exchange.model, exchange.error or None
        # cut now, not when rendered: a model name can be the client's own string, of any length, and the log
        # keeps 200 of them (the cuts are the ones _event makes, so the entry reads the same)
        self._recent.appendleft((self._wall_clock(), exchange.facts.request_id, exchange.tenant_label[:MAX_NAME_CHARS],
                                 exchange.backend_name, model[:MAX_NAME_CHARS], outcome, refusal,
                                 None if error is None else error[:MAX_REASON_CHARS], exchange.status))
        return True

    def snapshot(self) -> list[dict[str, Any]]:
        return [asdict(_event(*ended)) for ended in self._recent]


def _event(at_s: float, request_id: str, tenant: str, backend: str, model: str, outcome: AdmissionOutcome | None,
           refusal: str | None, error: str | None, status: int) -> DecisionEvent:
    described = describe(outcome, refusal, error)
    assert described is not None, "add keeps only requests with an outcome or a refusal"
    decision, reason = described
    reserved = outcome.reserved if outcome is not None else None
    if reserved is not None and model == "-":
        model = reserved.pool.model
    return DecisionEvent(
        round(at_s, 3), safe_text(request_id), safe_text(tenant[:MAX_NAME_CHARS]), safe_text(backend),
        safe_text(model[:MAX_NAME_CHARS]), decision, safe_text(reason[:MAX_REASON_CHARS]), status,
        reserved.tokens if reserved is not None else None,
        round(outcome.waited_s, 3) if outcome is not None else 0.0,
    )
