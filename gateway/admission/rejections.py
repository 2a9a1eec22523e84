"""The one exception admission raises, and the rejections only the waiting room can make.

    GatewayError (gateway.errors)
    └── AdmissionRejected      the Reject it carries decides status and code:
          400 context_length_exceeded   the planner: prompt (or prompt + output) can't fit one sequence
          503 queue_full                the pool's queue already holds ``max_queue`` waiters
          503 queue_timeout             waited ``queue_timeout_s`` without the request fitting
          499 client_closed_request     the client left while waiting (nobody reads it; for logs and metrics)

Queue timeouts are 503, not 504: nothing upstream was slow, the gateway is at capacity and says so, like Ollama's own
503 ``server busy``; 504 stays reserved for a backend that did not answer (``BackendTimeout``).
"""

from __future__ import annotations

from gateway.admission.types import PoolKey, Reject
from gateway.errors import GatewayError

QUEUE_FULL = "queue_full"
QUEUE_TIMEOUT = "queue_timeout"
CLIENT_CLOSED = "client_closed_request"
RETRY_AFTER_S = 1.0
"""A full pool frees up as soon as one sequence ends: a 503 from admission asks the client back after a second."""


class AdmissionRejected(GatewayError):
    """Raised by the waiting room when a request is refused; ``reject`` is the decision, rendered by the proxy."""

    summary_failure: str | None = None
    """Set by the admission step when a summary was tried first and failed (``SummaryFailed.reason``)."""

    def __init__(self, reject: Reject) -> None:
        super().__init__(reject.message)
        self.reject = reject
        self.status = reject.status
        self.code = reject.code
        if reject.status == 503:
            self.retry_after_s = RETRY_AFTER_S


def queue_full(key: PoolKey, queued: int, max_queue: int, model: str = "") -> Reject:
    return Reject(
        503,
        QUEUE_FULL,
        f"{queued:,} requests are already waiting for {_where(key, model)}, the limit (max_queue) is {max_queue:,}; "
        "retry later, or ask the operator to raise max_queue or add capacity",
    )


def tenant_queue_full(key: PoolKey, tenant: str, queued: int, setting: str, model: str = "") -> Reject:
    return Reject(
        503,
        QUEUE_FULL,
        f"tenant '{tenant}' already has {queued:,} requests waiting for {_where(key, model)}, all of {setting}; "
        "retry once some of them are served, or ask the operator for a larger share of the queue",
    )


def queue_timeout(
    key: PoolKey, waited_s: float, timeout_s: float, reason: str, limit_name: str = "queue_timeout_s",
    model: str = "",
) -> Reject:
    return Reject(
        503,
        QUEUE_TIMEOUT,
        f"waited {waited_s:.1f} s for {_where(key, model)}, the limit ({limit_name}) is {timeout_s:g} s; still waiting "
        f"because {reason}; retry later or with a smaller request",
    )


def client_closed(key: PoolKey, waited_s: float, model: str = "") -> Reject:
    return Reject(499, CLIENT_CLOSED, f"the client left after waiting {waited_s:.1f} s for {_where(key, model)}")


def _where(key: PoolKey, model: str = "") -> str:
    """The pool in words: its model, or (a server's one pool, keyed "") the model the client asked for."""
    named = key.model or model
    return f"model '{named}' on backend '{key.backend}'" if named else f"backend '{key.backend}'"


LEDGER_UNAVAILABLE = "ledger_unavailable"


def ledger_unavailable(key: PoolKey, cause: str) -> Reject:
    return Reject(
        503,
        LEDGER_UNAVAILABLE,
        f"the shared ledger (Redis) is unreachable ({cause}), and shared_ledger.on_unreachable = 'refuse': no "
        f"request for {_where(key)} is admitted until it is back; retry later",
    )


LEDGER_FENCED = "ledger_fenced"


def ledger_fenced(key: PoolKey, why: str) -> Reject:
    """A running request ended by fencing (``shared/fence.py``): its lease in the shared ledger could not be kept."""
    return Reject(
        503,
        LEDGER_FENCED,
        f"this replica of kvgate ended the request on {_where(key)}: {why}; other replicas may now use its room "
        f"in the pool, so it was stopped at the backend before it could overrun it; retry",
    )
