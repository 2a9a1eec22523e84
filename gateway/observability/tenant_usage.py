"""Who used what: per tenant, requests (by status class), prompt and output tokens, refusals (by reason) and time
spent in the queue, kept in process for ``GET /kvgate/tenants`` (the same figures as the ``kvgate_tenant_*``
counters, fed at the same place: ``metrics.record``).

    prompt_tokens   kvgate's count of the prompt it forwarded (``outcome.forwarded_count``): known for every
                    admitted request, the figure tenant caps and admission are applied to (a backend's own figure
                    is missing from OpenAI streams without ``include_usage``, and it is checked apart, as truncation)
    output_tokens   what the backend reported (eval_count, usage.completion_tokens, ...); nothing when it did not
    queue_seconds   the waits of admitted requests (a request refused after waiting is counted as a refusal)
    refusals        what kvgate refused itself, by a bounded reason (``refusal_reason``); a client without a valid
                    key is no tenant and is not counted here

Tenant names are bounded: configured names, ``anonymous``, ``kvgate-admin`` and ``kvgate-summarizer``; a request
refused before its tenant was known (``UNIDENTIFIED``) is left out. No I/O, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gateway.admission.exchange import UNIDENTIFIED as UNIDENTIFIED_TENANT
from gateway.admission.rejections import CLIENT_CLOSED, AdmissionRejected
from gateway.errors import BadRequest, GatewayError, LoadRefused, RateLimited, ServerBusy

UNIDENTIFIED = UNIDENTIFIED_TENANT
"""The tenant label of a request refused before its tenant was known (a bad key)."""
MAX_PROMPT_TOKENS = "max_prompt_tokens"
GPU_MEMORY = "gpu_memory"
SERVER_BUSY = "server_busy"
RATE_LIMITED = "rate_limited"


def refusal_reason(error: GatewayError, *, in_admission: bool) -> str | None:
    """The bounded reason kvgate refused a request for, or None when ``error`` is no refusal of kvgate's own (a bad
    body, a backend that failed, a client that left). ``in_admission``: raised by the admission step, whose only
    plain 400 is the tenant's prompt cap. Admission's own codes are constants of kvgate's (context_length_exceeded,
    too_many_sequences, queue_full, queue_timeout, ...), so the label stays bounded."""
    if isinstance(error, AdmissionRejected):
        return None if error.code == CLIENT_CLOSED else error.code
    if isinstance(error, LoadRefused):
        return GPU_MEMORY
    if isinstance(error, ServerBusy):
        return SERVER_BUSY
    if isinstance(error, RateLimited):
        return RATE_LIMITED
    if in_admission and type(error) is BadRequest:
        return MAX_PROMPT_TOKENS
    return None


def status_class(status: int) -> str:
    return f"{status // 100}xx" if 100 <= status <= 599 else "other"


@dataclass(slots=True)
class TenantTotals:
    requests: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0
    output_tokens: int = 0
    refusals: Counter[str] = field(default_factory=Counter)
    queue_seconds: float = 0.0


class TenantUsage:
    def __init__(self) -> None:
        self._totals: dict[str, TenantTotals] = {}

    def add(
        self, tenant: str, status: int, *, prompt_tokens: int = 0, output_tokens: int | None = None,
        queue_s: float = 0.0, refusal: str | None = None,
    ) -> None:
        if tenant == UNIDENTIFIED:
            return
        totals = self._totals.get(tenant)
        if totals is None:
            totals = self._totals[tenant] = TenantTotals()
        totals.requests[status_class(status)] += 1
        totals.prompt_tokens += prompt_tokens
        totals.output_tokens += output_tokens or 0
        totals.queue_seconds += queue_s
        if refusal is not None:
            totals.refusals[refusal] += 1

    def snapshot(self, configured: Iterable[str] = (), active: Mapping[str, int] | None = None) -> dict[str, object]:
        """JSON for ``/kvgate/tenants``: every configured tenant (zeros until it is seen) and every one seen;
        ``active``: the sequences each tenant holds in the KV pools now."""
        active = active or {}
        rows: dict[str, object] = {}
        for name in sorted({*configured, *self._totals, *active}):
            totals = self._totals.get(name) or TenantTotals()
            rows[name] = {
                "requests": dict(sorted(totals.requests.items())),
                "requests_total": sum(totals.requests.values()),
                "prompt_tokens": totals.prompt_tokens,
                "output_tokens": totals.output_tokens,
                "refusals": dict(sorted(totals.refusals.items())),
                "queue_seconds": round(totals.queue_seconds, 3),
                "active_sequences": active.get(name, 0),
            }
        return {"tenants": rows}
