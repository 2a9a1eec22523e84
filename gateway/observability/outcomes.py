"""What happened to each request, counted once, where the request ends: the one source of kvgate's outcome counts.

    proxy (the request's last step: its trace) --metrics.record--> OutcomeTally --+--> /kvgate/status pools[].*_total,
                                                                                   |    pools[].refused, outcomes
                                                                                   +--> kvgate_pool_refusals_total,
                                                                                        kvgate_queue_rejected_total
    the same labels (request_decisions) ------------------------------------------> kvgate_decisions_total

A request is counted when it is over, from what admission did (``AdmissionOutcome``) or why kvgate refused it
(``tenant_usage.refusal_reason``), never from a layer that may still change its mind: the waiting room's first
"too long" for a chat that is then trimmed and admitted is no refusal. One request may count in several decisions:

    admitted                reserved in its pool (at once, or after a wait) and forwarded
    queued                  admitted after waiting in the queue
    elastic                 reserved its prompt plus its model's usual answer, growing as it streamed (planner rule 7)
    ended_by_kvgate         an elastic reply kvgate ended (``finish_reason: length``): its pool had no room to grow
    forwarded_without_pool  forwarded with no pool to plan against (admission off, no KV layout known)
    rewritten               any field rewritten; apart:
      clamped               an output limit lowered (or written where the client set none)
      pinned                Ollama's ``num_ctx`` set to the loaded context
    context_lowered         the model was loaded at a smaller context than asked, to fit GPU memory
    trimmed                 history dropped (a prompt: its middle) to fit the context
    summarized              the oldest turns replaced by a summary
    summary_failed          a summary was tried and failed; the request was then trimmed, or refused
    refused                 refused by kvgate itself, once, with one reason (context_length_exceeded after a failed
                            trim or summary, queue_full, queue_timeout, ...); a client that left is no refusal

Counts per pool (the pool the request was planned in), and in total (requests refused before a pool was known, such
as a load refused for GPU memory, count only there). No I/O, no clock.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gateway.admission.outcome import AdmissionOutcome, decision_labels
from gateway.admission.types import PoolKey

DECISIONS = ("admitted", "queued", "elastic", "ended_by_kvgate", "forwarded_without_pool", "rewritten", "clamped",
             "pinned", "context_lowered", "trimmed", "summarized", "summary_failed", "refused")
"""Every decision label, in the order the status shows them."""
QUEUE_REASONS = {"queue_full": "queue_full", "queue_timeout": "queue_timeout", "context_length_exceeded": "context"}
"""The refusals ``kvgate_queue_rejected_total`` counts, by its ``reason`` label (what it has always named)."""


def request_decisions(outcome: AdmissionOutcome | None, refusal: str | None,
                      summary_failure: str | None = None, ended_by_kvgate: bool = False) -> tuple[str, ...]:
    """The decision labels one finished request counts in (see the module docstring). ``summary_failure``: the
    reason of a summary that failed before the request was refused (an admitted one carries it in its outcome)."""
    labels = list(decision_labels(outcome)) if outcome is not None and refusal is None else []
    if summary_failure is not None and "summary_failed" not in labels:
        labels.append("summary_failed")
    if refusal is not None:
        labels.append("refused")
    if ended_by_kvgate:
        labels.append("ended_by_kvgate")
    return tuple(labels)


@dataclass(slots=True)
class Outcomes:
    """The counts of one pool (or of every request)."""

    decisions: Counter[str] = field(default_factory=Counter)
    refusals: Counter[str] = field(default_factory=Counter)

    def add(self, decisions: tuple[str, ...], refusal: str | None) -> None:
        self.decisions.update(decisions)
        if refusal is not None:
            self.refusals[refusal] += 1

    def to_json(self) -> dict[str, Any]:
        """``<decision>_total`` for every decision, and ``refused`` by reason."""
        out: dict[str, Any] = {f"{name}_total": self.decisions.get(name, 0) for name in DECISIONS}
        out["refused"] = dict(sorted(self.refusals.items()))
        return out


class OutcomeTally:
    """Requests by outcome since start, per pool and in total; fed once per request by ``metrics.record``."""

    def __init__(self) -> None:
        self._pools: dict[PoolKey, Outcomes] = {}
        self.total = Outcomes()

    def add(self, pool: PoolKey | None, decisions: tuple[str, ...], refusal: str | None) -> None:
        if not decisions:
            return
        self.total.add(decisions, refusal)
        if pool is not None:
            counts = self._pools.get(pool)
            if counts is None:
                counts = self._pools[pool] = Outcomes()
            counts.add(decisions, refusal)

    def pool(self, key: PoolKey) -> Outcomes:
        return self._pools.get(key) or Outcomes()

    def keys(self) -> tuple[PoolKey, ...]:
        return tuple(self._pools)
