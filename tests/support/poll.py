"""Wait for a condition with a deadline, instead of sleeping a guessed time and hoping it was long enough."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")


@overload
async def until(predicate: Callable[[], Awaitable[T]], timeout_s: float = ..., interval_s: float = ...) -> T: ...


@overload
async def until(predicate: Callable[[], T], timeout_s: float = ..., interval_s: float = ...) -> T: ...


async def until(predicate: Callable[[], Any], timeout_s: float = 5.0, interval_s: float = 0.01) -> Any:
    """Call ``predicate`` (plain or async) every ``interval_s`` until it returns something truthy, and return that;
    raise AssertionError, naming the predicate, after ``timeout_s`` without one."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{getattr(predicate, '__qualname__', predicate)} still false after {timeout_s} s")
        await asyncio.sleep(interval_s)


def until_sync(predicate: Callable[[], T], timeout_s: float = 5.0, interval_s: float = 0.01) -> T:
    """``until`` outside the event loop (a fixture starting a server process): the same loop, blocking."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{getattr(predicate, '__qualname__', predicate)} still false after {timeout_s} s")
        time.sleep(interval_s)
