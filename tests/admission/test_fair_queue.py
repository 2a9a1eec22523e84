"""Weighted fair queueing between tenants (issue 14, point 1), through the real waiting room on virtual time.

The scenarios (``bench/fair_sim.py``): one tenant floods a 32,768-token unified pool with long requests (8,000
tokens held 8 s each) while two others send steady work. Tolerances, stated once:

- a tenant gets at least ``SHARE_TOLERANCE`` (95%) of its fair share of the tokens served while every tenant still
  has work: its weighted share, or all it asked when it asked for less (max-min fair);
- a trickle's median wait does not grow with the flood: with 200 flood requests it is within ``WAIT_SLACK_S`` of
  its median with 50, and below one flood request's hold time. In arrival order it grows with the flood.
"""

from __future__ import annotations

import pytest

from bench.fair_sim import (
    FLOOD_HOLD_S,
    Result,
    Stream,
    backlogged,
    flood,
    max_min_fair,
    mixed,
    render,
    simulate,
    trickle,
)
from gateway.admission.fair_share import FairClock

SHARE_TOLERANCE = 0.95
WAIT_SLACK_S = 1.0


def assert_fair(result: Result, tenants: tuple[str, ...]) -> None:
    for tenant in tenants:
        got, fair = result.share(tenant), result.fair_share(tenant)
        assert got >= SHARE_TOLERANCE * fair, f"{tenant}: {got:.1%} of the tokens, fair share {fair:.1%}"


@pytest.mark.parametrize(("name", "others"), [("trickle", trickle), ("backlogged", backlogged), ("mixed", mixed)])
async def test_every_tenant_gets_its_weighted_share_while_one_floods(name: str, others: object) -> None:
    streams = flood(200) + others()  # type: ignore[operator]
    fair = await simulate(streams, order="fair")
    arrival = await simulate(streams, order="arrival")
    print("\n" + render(f"{name}: 200-request flood", fair) + "\n" + render(f"{name}: 200-request flood", arrival))
    assert fair.window_s > 60  # the flood really contends for a while
    assert_fair(fair, ("a", "b"))
    assert fair.share("flood") >= SHARE_TOLERANCE * fair.fair_share("flood")  # the flood keeps its own share too
    assert arrival.share("a") + arrival.share("b") < 0.5 * (arrival.fair_share("a") + arrival.fair_share("b"))


async def test_a_trickles_median_wait_does_not_grow_with_the_flood() -> None:
    rows = []
    waits: dict[tuple[str, int], float] = {}
    for order in ("fair", "arrival"):
        for count in (0, 50, 200):
            result = await simulate(flood(count) + trickle(), order=order)
            for tenant in ("a", "b"):
                waits[(order, count)] = max(waits.get((order, count), 0.0), result.tenants[tenant].median_wait_s)
            rows.append(f"  {order:<8} flood {count:>3}: median wait a {result.tenants['a'].median_wait_s:6.2f} s, "
                        f"b {result.tenants['b'].median_wait_s:6.2f} s")
    print("\n" + "\n".join(rows))
    assert waits[("fair", 200)] <= waits[("fair", 50)] + WAIT_SLACK_S
    assert waits[("fair", 200)] < FLOOD_HOLD_S
    assert waits[("arrival", 200)] > 10 * FLOOD_HOLD_S  # what the fair order prevents: the wait grows with the flood
    assert waits[("arrival", 200)] > 2 * waits[("arrival", 50)]


async def test_priorities_stay_strict_above_the_fair_order() -> None:
    streams = [Stream("flood", 1, 8000, FLOOD_HOLD_S, 40), Stream("low", 100, 2000, 2.0, 40, start_s=1.0, every_s=0)]
    result = await simulate(streams, order="fair", priorities={"flood": 1})
    assert result.tenants["low"].median_wait_s > result.tenants["flood"].median_wait_s  # weight never beats priority


def test_the_fair_clock_tags_by_tokens_over_weight() -> None:
    clock = FairClock()
    first = clock.tag("flood", 8000, 1.0)
    second = clock.tag("flood", 8000, 1.0)
    trickle_tag = clock.tag("a", 1000, 1.0)
    heavy = clock.tag("b", 2000, 2.0)
    assert (first.start, second.start, trickle_tag.start, heavy.finish) == (0.0, 8000.0, 0.0, 1000.0)
    clock.served(second)
    assert clock.tag("a", 1000, 1.0).start == 8000.0  # an idle tenant restarts at virtual time, with no credit
    assert clock.tag("b", 2000, 2.0).start == 8000.0


def test_a_withdrawn_request_gives_its_tag_back_only_when_it_was_the_last() -> None:
    clock = FairClock()
    one = clock.tag("a", 1000, 1.0)
    two = clock.tag("a", 1000, 1.0)
    clock.withdrawn(one)  # not the last: tags behind it keep their places
    assert clock.finish_of("a") == 2000.0
    clock.withdrawn(two)
    assert clock.finish_of("a") == 1000.0
    with pytest.raises(ValueError, match="positive"):
        clock.tag("a", 1, 0.0)


def test_max_min_fair_gives_the_small_asker_all_and_splits_the_rest_by_weight() -> None:
    fair = max_min_fair({"flood": 1e9, "a": 10.0, "b": 1e9}, {"flood": 1.0, "a": 1.0, "b": 2.0}, 310.0)
    assert fair == pytest.approx({"flood": 100.0, "a": 10.0, "b": 200.0})
