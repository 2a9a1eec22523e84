"""The running distribution of answer lengths elastic reservations read: cold until enough answers, nearest-rank
quantiles, a tenant's own answers before its pool's, a window that follows change."""

from __future__ import annotations

import pytest

from gateway.admission.output_lengths import OutputLengths
from gateway.admission.types import PoolKey

POOL = PoolKey("cpp", "m")
OTHER = PoolKey("cpp", "n")


def test_a_pool_is_cold_until_it_has_min_samples_answers() -> None:
    lengths = OutputLengths(window=100, min_samples=3)
    for tokens in (10, 20):
        lengths.observe(POOL, "t", tokens)
        assert lengths.expected(POOL, "t", 0.95) is None
    lengths.observe(POOL, "t", 30)
    assert lengths.expected(POOL, "t", 0.95) == 30
    assert lengths.expected(OTHER, "t", 0.95) is None


@pytest.mark.parametrize(("quantile", "tokens"), [(0.05, 1), (0.5, 10), (0.95, 19), (1.0, 20)])
def test_the_quantile_is_the_nearest_rank_of_the_window(quantile: float, tokens: int) -> None:
    lengths = OutputLengths(window=100, min_samples=1)
    for value in range(20, 0, -1):  # 20, 19, ... 1: order does not matter
        lengths.observe(POOL, "t", value)
    assert lengths.expected(POOL, "t", quantile) == tokens


def test_a_tenant_with_answers_of_its_own_is_read_apart_from_its_pool() -> None:
    lengths = OutputLengths(window=100, min_samples=2)
    for _ in range(5):
        lengths.observe(POOL, "chat", 100)
    lengths.observe(POOL, "agent", 900)
    assert lengths.expected(POOL, "agent", 0.5) == 100  # one answer of its own: the pool's (five of 100, one 900)
    lengths.observe(POOL, "agent", 900)
    assert lengths.expected(POOL, "agent", 0.5) == 900
    assert lengths.expected(POOL, "chat", 0.5) == 100
    assert lengths.expected(POOL, "newcomer", 1.0) == 900  # no answers: the pool's, all of them


def test_the_window_follows_a_model_whose_answers_change() -> None:
    lengths = OutputLengths(window=4, min_samples=1)
    for tokens in (1000, 1000, 1000, 1000, 50, 50, 50, 50):
        lengths.observe(POOL, "t", tokens)
    assert lengths.expected(POOL, "t", 1.0) == 50
    lengths.observe(POOL, "t", 70)  # the cached quantile is recomputed after a new answer
    assert lengths.expected(POOL, "t", 1.0) == 70


def test_a_reload_resizes_the_windows_keeping_the_latest_and_ignores_non_lengths() -> None:
    lengths = OutputLengths(window=10, min_samples=1)
    for tokens in range(1, 11):
        lengths.observe(POOL, "t", tokens)
    lengths.observe(POOL, "t", -1)
    lengths.resize(window=3, min_samples=4)
    assert lengths.samples(POOL) == 3
    assert lengths.expected(POOL, "t", 1.0) is None  # 3 < min_samples
    lengths.resize(window=3, min_samples=3)
    assert lengths.expected(POOL, "t", 0.01) == 8
