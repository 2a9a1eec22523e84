"""Stopping a background task for good, even where Python 3.11 loses the cancellation.

On Python 3.11, ``asyncio.wait_for`` returns the inner result and drops a cancellation that arrives as the inner
awaitable completes (gh-86296, fixed in 3.12); redis-py reconnects through such a path, so after a Redis restart
the shared ledger's runner could swallow the ``cancel()`` of shutdown and loop for ever, and ``kvgate serve`` never
exited. ``stop`` cancels again until the task has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

RECANCEL_S = 0.1


async def stop(task: asyncio.Future[Any] | None, *, recancel_s: float = RECANCEL_S) -> None:
    """Cancel ``task`` and wait until it has ended, cancelling again every ``recancel_s`` while it runs on; its
    exception, if it ended with one, is retrieved and dropped (it was being stopped)."""
    if task is None:
        return
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=recancel_s)
    with contextlib.suppress(asyncio.CancelledError, Exception):
        task.result()
