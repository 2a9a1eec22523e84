"""Giving freed heap back to the system after a large count.

A tokenizer working on megabytes allocates in its worker threads' malloc arenas; once the count is done, glibc keeps
the freed pages in those arenas, so RSS stays near the peak (8 chats of 3.9 MiB left 1.8 GB held after the
attack). ``malloc_trim(0)`` returns them. It walks every arena (a few milliseconds), so it runs in a thread, once
the tokenizing budget is idle after a large count. Other C libraries (musl, macOS) have no such call: nothing to do.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


def trim_heap() -> bool:
    """Give the heap's free pages back to the system; False where the C library cannot."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
