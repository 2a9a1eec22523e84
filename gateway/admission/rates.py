"""Per-tenant rates: tokens per minute and requests per minute, as token buckets (pure; the caller passes the time).

    bucket   capacity = the per-minute rate; it refills continuously at rate / 60 per second, up to capacity
    request  takes 1 from the tenant's request bucket and its tokens from its token bucket, both or neither;
             when either lacks what it needs, the request is refused (429) with ``Retry-After`` = the seconds until
             both would hold enough
    settle   the caller takes the reserved output up front with the prompt (rate_charge.py); after the response, the
             difference to what was used is taken (the bucket may go below zero: the tenant's next requests wait
             for the refill) or given back (never above capacity)

A request bigger than a whole minute's tokens is refused for good (a 429 would be retried in vain): the caller names
the rate. ``RateLimiter`` keeps one pair of buckets per tenant with a rate; single-threaded (the event loop's).

    reload   a tenant's buckets outlive a configuration reload (``retain`` drops only those of tenants, or rates,
             that are gone); a changed rate keeps what was used (a raised rate gives the difference at once, a
             lowered one may leave the tenant below zero, waiting) and refills at the new rate from the next
             request; an in-flight request settles into the bucket as it is
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(slots=True)
class Bucket:
    capacity: float
    level: float
    updated_s: float

    @property
    def refill_per_s(self) -> float:
        return self.capacity / 60.0

    def refill(self, now_s: float) -> None:
        elapsed_s = max(0.0, now_s - self.updated_s)
        self.level = min(self.capacity, self.level + elapsed_s * self.refill_per_s)
        self.updated_s = max(self.updated_s, now_s)

    def wait_s(self, amount: float) -> float:
        """Seconds until the bucket holds ``amount`` (0 when it does now); infinite when it never will."""
        if amount > self.capacity:
            return math.inf
        missing = amount - self.level
        return 0.0 if missing <= 0 else missing / self.refill_per_s


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A tenant's rates (None: unlimited)."""

    tokens_per_minute: int | None = None
    requests_per_minute: int | None = None


@dataclass(frozen=True, slots=True)
class RateRefusal:
    """Why a request may not run now: ``retry_after_s`` (infinite: never, at this rate) and the words."""

    retry_after_s: float
    reason: str


class RateLimiter:
    def __init__(self) -> None:
        self._tokens: dict[str, Bucket] = {}
        self._requests: dict[str, Bucket] = {}

    def _bucket(self, buckets: dict[str, Bucket], tenant: str, per_minute: int, now_s: float) -> Bucket:
        bucket = buckets.get(tenant)
        if bucket is None:  # a new tenant, or a new rate, starts full
            bucket = buckets[tenant] = Bucket(float(per_minute), float(per_minute), now_s)
        elif bucket.capacity != per_minute:  # changed by a reload: what was used (refilled until now) stays used
            bucket.refill(now_s)
            used = bucket.capacity - bucket.level
            bucket.capacity = float(per_minute)
            bucket.level = bucket.capacity - used
        bucket.refill(now_s)
        return bucket

    def take(self, tenant: str, limit: RateLimit, prompt_tokens: int, now_s: float) -> RateRefusal | None:
        """Take one request and ``prompt_tokens`` from the tenant's buckets, or neither and say why not."""
        waits: list[tuple[float, str]] = []
        requests = tokens = None
        if limit.requests_per_minute is not None:
            requests = self._bucket(self._requests, tenant, limit.requests_per_minute, now_s)
            waits.append((requests.wait_s(1), f"{limit.requests_per_minute:,} requests per minute"))
        if limit.tokens_per_minute is not None:
            tokens = self._bucket(self._tokens, tenant, limit.tokens_per_minute, now_s)
            waits.append((tokens.wait_s(prompt_tokens), f"{limit.tokens_per_minute:,} tokens per minute"))
        longest = max(waits, default=(0.0, ""))
        if longest[0] > 0:
            if math.isinf(longest[0]):
                return RateRefusal(math.inf, f"the prompt is {prompt_tokens:,} tokens, more than tenant "
                                   f"'{tenant}' may send in a minute ({longest[1]})")
            return RateRefusal(longest[0], f"tenant '{tenant}' is over its rate of {longest[1]}")
        if requests is not None:
            requests.level -= 1
        if tokens is not None:
            tokens.level -= prompt_tokens
        return None

    def settle(self, tenant: str, limit: RateLimit, output_tokens: int, now_s: float) -> None:
        """Charge ``output_tokens`` more (the bucket may go below zero), or give back as many when negative (the
        unused part of what was taken up front, rate_charge.py; never above the bucket's capacity)."""
        if limit.tokens_per_minute is None or output_tokens == 0:
            return
        bucket = self._tokens.get(tenant)
        if bucket is None:  # a reload removed the tenant or its rate while the request ran
            return
        bucket.refill(now_s)  # at the bucket's rate, which a reload may have changed since ``limit`` was read
        bucket.level = min(bucket.capacity, bucket.level - output_tokens)

    def retain(self, limits: Mapping[str, RateLimit]) -> None:
        """After a reload: keep the buckets of the tenants in ``limits`` that still have that rate; drop the rest."""
        for name in [name for name in self._tokens if (limits.get(name) or RateLimit()).tokens_per_minute is None]:
            del self._tokens[name]
        for name in [name for name in self._requests
                     if (limits.get(name) or RateLimit()).requests_per_minute is None]:
            del self._requests[name]
