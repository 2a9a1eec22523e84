"""TokenizingBudget: the prompt bytes tokenized at once, first come first served, with a bounded wait."""

from __future__ import annotations

import asyncio

import pytest

from gateway.tokens.tokenizing_budget import TokenizingBudget


async def test_counts_that_fit_run_together_and_the_rest_wait_in_order() -> None:
    budget = TokenizingBudget(limit_bytes=100)
    assert await budget.acquire(60, wait_s=0)
    order: list[str] = []

    async def take(name: str, size: int) -> None:
        assert await budget.acquire(size, wait_s=5)
        order.append(name)

    big = asyncio.create_task(take("big", 70))
    await asyncio.sleep(0)
    small = asyncio.create_task(take("small", 10))  # would fit now, but waits behind the earlier one
    await asyncio.sleep(0.01)  # a moment in which neither gets in (the budget shows no count of its waiters)
    assert order == [] and budget.held_bytes == 60
    budget.release(60)
    await asyncio.gather(big, small)
    assert order == ["big", "small"]
    assert budget.held_bytes == 80 and budget.peak_bytes == 80


async def test_a_prompt_larger_than_the_budget_runs_alone() -> None:
    budget = TokenizingBudget(limit_bytes=100)
    assert await budget.acquire(500, wait_s=0)  # nothing else held: it runs, never estimated for its size alone
    assert not await budget.acquire(1, wait_s=0.01)
    budget.release(500)
    assert await budget.acquire(1, wait_s=0)


async def test_a_wait_that_runs_out_takes_nothing_and_lets_the_next_one_in() -> None:
    budget = TokenizingBudget(limit_bytes=100)
    assert await budget.acquire(50, wait_s=0)
    large = asyncio.create_task(budget.acquire(80, wait_s=0.05))
    await asyncio.sleep(0)
    small = asyncio.create_task(budget.acquire(30, wait_s=5))
    assert not await large  # gave up: the one behind it fits and goes in
    assert await small
    assert budget.held_bytes == 80


async def test_a_cancelled_waiter_holds_nothing() -> None:
    budget = TokenizingBudget(limit_bytes=100)
    assert await budget.acquire(100, wait_s=0)
    waiter = asyncio.create_task(budget.acquire(40, wait_s=5))
    await asyncio.sleep(0.01)  # it waits by now (the budget shows no count of its waiters)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    budget.release(100)
    assert budget.held_bytes == 0
    async with budget.held(100, wait_s=0) as got:
        assert got and budget.held_bytes == 100
    assert budget.held_bytes == 0
