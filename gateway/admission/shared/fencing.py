"""Fencing, the asynchronous part: ending the requests whose leases ``FenceBook`` says are due (``fence.py``).

``Fences`` keeps the book, one timer at the earliest deadline, and each running request's ``FenceSignal``. When a
lease is fenced, its signal cancels the task that forwards the request; that task turns the cancellation into the
fence's error: a stream gets a final error event in its dialect (``streaming.pump``), a reply not yet begun a 503 with
Retry-After (``fenced``). Closing the upstream connection stops the sequence at the backend, so the pool is free by
the time the lease may expire and the other replicas plan as if it were.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from gateway.admission.rejections import AdmissionRejected
from gateway.admission.shared.fence import FenceBook


class FenceSignal:
    """One running request's fence: ``fire`` cancels the task that forwards it; ``error`` says why it ended."""

    __slots__ = ("_task", "error")

    def __init__(self) -> None:
        self._task = asyncio.current_task()
        self.error: AdmissionRejected | None = None

    def fire(self, error: AdmissionRejected) -> None:
        if self.error is None:
            self.error = error
            if self._task is not None:
                self._task.cancel()

    def absorb(self) -> AdmissionRejected | None:
        """In the forwarding task's ``except CancelledError``: the fence's error (the cancellation is taken back),
        or None when the cancellation is someone else's."""
        if self.error is None or self._task is None:
            return None
        self._task.uncancel()
        return self.error


class Fences:
    """This replica's fenced leases (see the module docstring); ``on_due`` hears the ids whose deadline came."""

    def __init__(self, lease_ttl_s: float, fence_margin_s: float, on_due: Callable[[list[int]], None]) -> None:
        self.book = FenceBook(lease_ttl_s, fence_margin_s)
        self._on_due = on_due
        self._signals: dict[int, FenceSignal] = {}
        self._fenced: dict[int, AdmissionRejected] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._armed_s = 0.0  # when the timer fires (the loop's clock)
        self.fenced_total = 0

    def confirm(self, leases: Iterable[int], sent_s: float) -> None:
        """A commit or renewal sent at ``sent_s`` (the loop's clock) set these leases' expiry in Redis."""
        self.book.confirm([lease for lease in leases if lease not in self._fenced], sent_s)
        if self._timer is None or self._armed_s > sent_s + self.book.lease_ttl_s - self.book.fence_margin_s:
            self._arm()  # else the timer fires no later than these deadlines, and ``_due`` arms the next one

    def watch(self, lease: int) -> FenceSignal:
        """The running request's signal (the current task's); fired at once if its lease was fenced already."""
        signal = FenceSignal()
        fenced = self._fenced.get(lease)
        if fenced is not None:
            signal.fire(fenced)
        else:
            self._signals[lease] = signal
        return signal

    def unwatch(self, lease: int) -> None:
        self._signals.pop(lease, None)

    def forget(self, lease: int) -> None:
        """The lease ended (released): no deadline, no signal."""
        self.book.forget(lease)
        self._signals.pop(lease, None)
        self._fenced.pop(lease, None)
        if not self.book:  # else the timer may fire early (``_due`` finds nothing due and arms the next): per
            self.close()   # request, a release costs no new timer

    def is_fenced(self, lease: int) -> bool:
        return lease in self._fenced

    def fence(self, lease: int, error: AdmissionRejected) -> None:
        """End the lease's request (now, or as soon as it is watched); its lease is never renewed again."""
        if lease in self._fenced:
            return
        self.fenced_total += 1
        self.book.forget(lease)
        self._fenced[lease] = error
        signal = self._signals.pop(lease, None)
        if signal is not None:
            signal.fire(error)
        self._arm()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline_s = self.book.next_deadline_s()
        if deadline_s is not None:
            self._armed_s = deadline_s
            self._timer = asyncio.get_running_loop().call_at(deadline_s, self._due)

    def _due(self) -> None:
        self._timer = None
        due = self.book.due(asyncio.get_running_loop().time())
        if due:
            self._on_due(due)
            for lease in due:  # one ``on_due`` did not fence has no request any more: never due again (a deadline
                self.book.forget(lease)  # left behind would re-arm the timer at once, forever: a core spun)
        self._arm()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class _Watches(Protocol):
    def watch(self, lease: int) -> FenceSignal: ...

    def unwatch(self, lease: int) -> None: ...


_NOT_FENCED: contextlib.nullcontext[None] = contextlib.nullcontext()


def fenced(fences: _Watches | None, lease: int | None) -> contextlib.AbstractContextManager[FenceSignal | None]:
    """Around forwarding one admitted request: its ``FenceSignal`` (None without a shared ledger), and a fence that
    fired before its reply began raised as the fence's error (503 with Retry-After, in the route's format)."""
    return _NOT_FENCED if fences is None or lease is None else _fenced(fences, lease)


@contextlib.contextmanager
def _fenced(fences: _Watches, lease: int) -> Iterator[FenceSignal]:
    signal = fences.watch(lease)
    try:
        yield signal
    except asyncio.CancelledError:
        error = signal.absorb()
        if error is None:
            raise
        raise error from None
    finally:
        fences.unwatch(lease)
