"""gateway.support.tasks.stop: a background task that swallows its cancellation (as Python 3.11's wait_for can, inside
redis-py's reconnect) is cancelled again until it ends, so shutdown never hangs."""

from __future__ import annotations

import asyncio

from gateway.support.tasks import stop


async def test_a_task_that_swallows_its_first_cancellations_is_stopped() -> None:
    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(10)  # idles until cancelled
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed >= 3:
                    raise
                asyncio.current_task().uncancel()  # type: ignore[union-attr]  # what the lost cancellation looks like

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    await asyncio.wait_for(stop(task, recancel_s=0.01), timeout=5)
    assert task.cancelled() and swallowed == 3


async def test_stop_takes_none_a_finished_task_and_a_failed_one() -> None:
    await stop(None)

    async def fails() -> None:
        raise RuntimeError("boom")

    failed = asyncio.create_task(fails())
    await asyncio.sleep(0)
    await stop(failed)  # its exception is retrieved: no "never retrieved" warning
    assert failed.done()
