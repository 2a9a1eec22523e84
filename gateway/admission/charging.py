"""The tenant's tokens and requests per minute around one request: taken up front, settled when it ends
(the rules: rate_charge.py; the buckets, here or in Redis: shared/rates.py)."""

from __future__ import annotations

import logging
import math
import time
from typing import Protocol

from gateway.admission.rate_charge import RateCharge, settlement, upfront
from gateway.admission.shared.shared_rates import TenantRates
from gateway.admission.tenant_keys import Tenant
from gateway.domain import NO_OUTPUT_OPERATIONS, ParsedRequest
from gateway.errors import BadRequest, RateLimited
from gateway.tokens import TokenCount

log = logging.getLogger(__name__)


class ReportedUsage(Protocol):
    """What the response said of its own size, read once it has ended (``observability.usage.UsageObserver`` is
    one; admission sits below observability, so it names only what it reads)."""

    streamed_chunks: int

    def output_tokens(self) -> int | None: ...


def reserved_output(parsed: ParsedRequest, tenant: Tenant, default_output_tokens: int) -> int:
    """The output a request may generate, as it is charged up front: its limit, lowered to the tenant's cap, else
    the default; none for an embedding or a rerank."""
    if parsed.operation in NO_OUTPUT_OPERATIONS:
        return 0
    limit = parsed.output.tokens or default_output_tokens
    return min(limit, tenant.max_output_tokens or limit)


async def take_rate(rates: TenantRates, tenant: Tenant, count: TokenCount | None, output_tokens: int) -> RateCharge:
    """The prompt and the reserved output taken from the tenant's buckets (rate_charge.py): 429 with Retry-After
    when over; 400 for a counted prompt larger than a whole minute's tokens (waiting would not help). An estimate
    never refuses: it is charged at most a whole minute's tokens (it may wait for a full bucket)."""
    prompt_tokens, output_tokens = upfront(count.tokens if count is not None else 0, count is None or count.exact,
                                           output_tokens, tenant.rate.tokens_per_minute)
    refused = await rates.take(tenant.name, tenant.rate, prompt_tokens + output_tokens, time.monotonic())
    if refused is None:
        return RateCharge(tenant.name, tenant.rate, prompt_tokens, output_tokens)
    if math.isinf(refused.retry_after_s):
        raise BadRequest(f"{refused.reason}; shorten the prompt or ask for a higher rate")
    asked = "" if not output_tokens else (f" (this request takes {prompt_tokens + output_tokens:,}: its prompt and "
                                          f"the {output_tokens:,} output tokens it may generate)")
    raise RateLimited(f"{refused.reason}{asked}; retry in {math.ceil(refused.retry_after_s)} s",
                      retry_after_s=max(1.0, math.ceil(refused.retry_after_s)))


async def settle_rate(rates: TenantRates, charge: RateCharge | None, usage: ReportedUsage | None,
                      status: int) -> None:
    """Charge what the request really generated, giving back the unused part of what was taken up front."""
    if charge is None or not charge.counts_tokens:
        return
    reported = usage.output_tokens() if usage is not None else None
    delta = settlement(charge, reported, usage.streamed_chunks if usage is not None else 0, status)
    try:
        await rates.settle(charge.tenant, charge.limit, delta, time.monotonic())
    except Exception:  # the request is over: a failed settlement is logged, never the client's error
        log.exception("could not settle tenant '%s''s tokens per minute", charge.tenant)
