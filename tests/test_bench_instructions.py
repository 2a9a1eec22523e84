"""bench/instructions.py: a callgrind dump read right, the table and its ratios, and the claim the benchmark rests on
(the same code and requests give the same count, whatever else the machine does) checked on a real kvgate."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.instructions import count, dump_instructions, missing_tools, render
from tests.support.child_env import CACHE_ENV

DUMP = b"""# callgrind format
version: 1
creator: callgrind-3.19.0
cmd:  python -m gateway serve --port 1
part: 2

events: Ir
summary: 0

fl=(1) ceval.c
fn=(1) _PyEval_EvalFrameDefault
0 12

totals: 685728011
"""


def test_a_dump_gives_its_total_and_anything_else_is_refused() -> None:
    assert dump_instructions(DUMP) == 685_728_011
    with pytest.raises(ValueError, match="not a callgrind dump"):
        dump_instructions(b"summary: 12\n")


def test_the_table_gives_each_round_the_median_and_the_ratio_to_the_baseline() -> None:
    table = render([("kvgate", [2_100_000, 2_200_000, 2_000_000]),
                    ("kvgate before", [2_500_000, 2_500_000, 2_600_000])])
    print(table)
    assert "2,100,000 2,200,000 2,000,000" in table and "2,100,000\n" in table  # rounds, then the median
    assert "this / baseline by round: 0.840, 0.880, 0.769; median 0.840" in table
    assert "this / baseline" not in render([("kvgate", [1.0])])


@pytest.mark.skipif(bool(missing_tools()) and not os.environ.get("CI"), reason="valgrind is not installed")
def test_a_kvgate_under_callgrind_costs_the_same_instructions_each_round() -> None:
    cache = {CACHE_ENV: os.environ[CACHE_ENV]} if CACHE_ENV in os.environ else {}  # the run's tokenizer cache
    (counted,) = count([("kvgate", Path(__file__).resolve().parents[1])], rounds=2, requests=100, warmup=10,
                       extra_env=cache)
    first, second = counted.per_request
    print(f"instructions a small chat: {first:,.0f} and {second:,.0f} ({second / first:.3f})")
    assert 200_000 < first < 50_000_000  # a request's work, not the start-up's (counting was off for it)
    assert abs(second / first - 1) < 0.05
