"""The overhead estimator's incremental fit equals a plain least-squares fit over the last `window` samples."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.tokens.overhead import Overhead, OverheadEstimator

WINDOW = 8
DEFAULT_PER_MESSAGE = 10.0


def reference_fit(samples: list[tuple[int, int]]) -> Overhead:
    """The estimator's rules, written the plain way: every sample of the window, one by one."""
    xs = [x for x, _ in samples]
    ys = [y for _, y in samples]
    if len(set(xs)) < 2:
        return Overhead(DEFAULT_PER_MESSAGE, max(y - DEFAULT_PER_MESSAGE * x for x, y in samples), exact=False)
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    slope = sum((x - mean_x) * (y - mean_y) for x, y in samples) / sum((x - mean_x) ** 2 for x in xs)
    slope = max(0.0, slope)
    intercept = mean_y - slope * mean_x
    residuals = [y - (slope * x + intercept) for x, y in samples]
    exact = n >= 3 and all(abs(r) < 1e-6 for r in residuals) and all(
        abs(v - round(v)) < 1e-6 for v in (slope, intercept))
    return Overhead(slope, intercept + max(0.0, max(residuals)), exact=exact)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 50), st.integers(0, 80)), min_size=1, max_size=40))
def test_incremental_fit_matches_the_plain_fit(observations: list[tuple[int, int, int]]) -> None:
    estimator = OverheadEstimator(default_per_message_tokens=DEFAULT_PER_MESSAGE, window=WINDOW, exact_after=3)
    kept: list[tuple[int, int]] = []
    for n_messages, content, observed in observations:
        accepted = estimator.observe(n_messages, content, observed)
        assert accepted == (observed >= content)
        if accepted:
            kept = [*kept, (n_messages, observed - content)][-WINDOW:]
        if kept:
            got, want = estimator.current(), reference_fit(kept)
            assert abs(got.per_message_tokens - want.per_message_tokens) < 1e-6
            assert abs(got.per_request_tokens - want.per_request_tokens) < 1e-6
            assert got.exact == want.exact
