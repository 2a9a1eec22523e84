"""Tenants' rate buckets, in this process or shared across replicas through Redis.

With a shared ledger, a tenant's tokens-per-minute and requests-per-minute buckets live in Redis (one atomic script
takes a request and its prompt's tokens from both, or neither), so three replicas do not each allow the whole rate.
While Redis is unreachable the buckets fall back to this replica's own (``RateLimiter``): a tenant may then get up to
its rate from each replica, which the shared ledger's ERROR line says.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.admission.rates import RateLimit, RateLimiter, RateRefusal
from gateway.admission.shared.shared_pools import SharedPools
from gateway.admission.shared.store import StoreUnreachable


class TenantRates:
    """The proxy's one door to rate limits; see the module docstring."""

    def __init__(self, shared: SharedPools | None = None) -> None:
        self._local = RateLimiter()
        self._shared = shared

    async def take(self, tenant: str, limit: RateLimit, prompt_tokens: int, now_s: float) -> RateRefusal | None:
        if limit == RateLimit():
            return None
        shared = self._shared
        if shared is not None and shared.up:
            try:
                return await shared.store.take_rate(tenant, limit, prompt_tokens)
            except StoreUnreachable as exc:
                shared.went_down(str(exc))
        return self._local.take(tenant, limit, prompt_tokens, now_s)

    async def settle(self, tenant: str, limit: RateLimit, output_tokens: int, now_s: float) -> None:
        shared = self._shared
        if shared is not None and shared.up:
            try:
                await shared.store.settle_rate(tenant, limit, output_tokens)
                return
            except StoreUnreachable as exc:
                shared.went_down(str(exc))
        self._local.settle(tenant, limit, output_tokens, now_s)

    def retain(self, limits: Mapping[str, RateLimit]) -> None:
        self._local.retain(limits)  # shared buckets expire on their own two minutes after their last use
