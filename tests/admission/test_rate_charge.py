"""Issue 23, point 3b, the pure part: what a request is charged against its tenant's tokens per minute up front
(prompt + reserved output) and how it is settled once it ends (usage, else the chunks it streamed)."""

from __future__ import annotations

import pytest

from gateway.admission.rate_charge import RateCharge, output_used, settlement, upfront
from gateway.admission.rates import RateLimit, RateLimiter


@pytest.mark.parametrize(("prompt", "exact", "output", "per_minute", "expected"), [
    (10, True, 1000, 3000, (10, 1000)),     # prompt + the output it may generate
    (10, True, 5000, 3000, (10, 2990)),     # at most a minute: it waits for a full bucket, never refused for it
    (4000, True, 100, 3000, (4000, 0)),     # a counted prompt over a minute: the bucket refuses it for good (400)
    (4000, False, 100, 3000, (3000, 0)),    # an estimate: charged at most the minute
    (10, True, 1000, None, (10, 0)),        # no token rate: nothing to reserve
    (10, True, 0, 3000, (10, 0)),           # an embedding generates nothing
])  # fmt: skip
def test_upfront(prompt: int, exact: bool, output: int, per_minute: int | None, expected: tuple[int, int]) -> None:
    assert upfront(prompt, exact, output, per_minute) == expected


CHARGE = RateCharge("t", RateLimit(tokens_per_minute=3000), 10, 1000)


@pytest.mark.parametrize(("reported", "streamed", "status", "used"), [
    (3, 0, 200, 3),            # usage reported: that
    (1200, 0, 200, 1200),      # more than reserved (n > 1, a backend past the limit): charged too
    (None, 60, 200, 60),       # a stream cut before its usage: one token per chunk it sent
    (None, 60, 499, 60),       # ... the client left mid-stream
    (None, 0, 200, 1000),      # a 200 without usage, nothing streamed: the reservation stays charged
    (None, 0, 499, 1000),      # the client left before the first byte: the backend may have generated it all
    (None, 0, 503, 0),         # refused or failed: the output is given back
    (None, 0, 429, 0),
])  # fmt: skip
def test_output_used(reported: int | None, streamed: int, status: int, used: int) -> None:
    assert output_used(CHARGE, reported, streamed, status) == used
    assert settlement(CHARGE, reported, streamed, status) == used - 1000


def test_a_refund_gives_back_the_unused_output_but_never_above_capacity() -> None:
    limiter, limit = RateLimiter(), RateLimit(tokens_per_minute=3000)
    assert limiter.take("t", limit, 1010, 0.0) is None
    assert limiter.take("t", limit, 1010, 0.0) is None
    refused = limiter.take("t", limit, 1010, 0.0)  # 980 left
    assert refused is not None
    limiter.settle("t", limit, settlement(CHARGE, 3, 0, 200), 0.0)  # 997 back
    assert limiter.take("t", limit, 1010, 0.0) is None  # 1,977 - 1,010
    for _ in range(3):
        limiter.settle("t", limit, -1000, 0.0)  # more refunds than were taken: capped at the bucket's capacity
    assert limiter.take("t", limit, 3000, 0.0) is None
    assert limiter.take("t", limit, 1, 0.0) is not None
