"""Per-tenant rates as token buckets (issue 14, point 3): pure, with the time passed in."""

from __future__ import annotations

import math

import pytest

from gateway.admission.rates import RateLimit, RateLimiter


def test_requests_per_minute_refuse_the_next_and_say_when_to_retry() -> None:
    limiter, limit = RateLimiter(), RateLimit(requests_per_minute=2)
    assert limiter.take("t", limit, 10, 0.0) is None
    assert limiter.take("t", limit, 10, 0.0) is None
    refused = limiter.take("t", limit, 10, 0.0)
    assert refused is not None and refused.retry_after_s == pytest.approx(30.0)  # one request refills in 60 / 2 s
    assert "2 requests per minute" in refused.reason
    assert limiter.take("t", limit, 10, 29.9) is not None
    assert limiter.take("t", limit, 10, 30.0) is None
    assert limiter.take("other", limit, 10, 30.0) is None  # each tenant has its own buckets


def test_tokens_per_minute_count_prompts_then_the_reported_output() -> None:
    limiter, limit = RateLimiter(), RateLimit(tokens_per_minute=600)  # 10 tokens a second
    assert limiter.take("t", limit, 400, 0.0) is None
    limiter.settle("t", limit, 300, 0.0)  # the reply's output: 700 taken of 600, the bucket is 100 below zero
    refused = limiter.take("t", limit, 50, 0.0)
    assert refused is not None and refused.retry_after_s == pytest.approx(15.0)  # 150 missing at 10 a second
    assert limiter.take("t", limit, 50, 15.0) is None


def test_both_buckets_or_neither() -> None:
    limiter, limit = RateLimiter(), RateLimit(tokens_per_minute=100, requests_per_minute=10)
    assert limiter.take("t", limit, 90, 0.0) is None
    refused = limiter.take("t", limit, 50, 0.0)  # tokens lack: the request bucket is not charged either
    assert refused is not None and "100 tokens per minute" in refused.reason
    for _ in range(9):
        assert limiter.take("t", limit, 0, 0.0) is None  # the 9 requests left, none taken by the refusal


def test_a_prompt_larger_than_a_minute_is_never_admitted() -> None:
    refused = RateLimiter().take("t", RateLimit(tokens_per_minute=100), 101, 0.0)
    assert refused is not None and math.isinf(refused.retry_after_s) and "more than tenant 't'" in refused.reason


def test_no_limit_takes_nothing_and_a_new_rate_starts_full() -> None:
    limiter = RateLimiter()
    for _ in range(1000):
        assert limiter.take("t", RateLimit(), 10**6, 0.0) is None
    assert limiter.take("t", RateLimit(requests_per_minute=1), 0, 0.0) is None
    assert limiter.take("t", RateLimit(requests_per_minute=5), 0, 0.0) is None  # changed rate: a full bucket
