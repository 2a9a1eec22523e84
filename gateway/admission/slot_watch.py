"""Elastic replies that are not streamed, followed through the server's slots (llama-server's ``GET /slots``).

A stream tells kvgate its length event by event (``elastic``); a reply that is not streamed says nothing until it
ends. On a server that reports what each slot holds (``Runtime.slot_use_path``), kvgate reads it every ``poll_s``
while such replies run on it (one reader per backend, none while nobody needs it) and feeds each reply the output
of the busy slot whose prompt is its own:

    GET /slots -> [{"is_processing": true, "n_prompt_tokens": 742, "next_token": [{"n_decoded": 230}]}, ...]
                  slot holds 742 cells: prompt 512 + 230 generated  ->  the reply of the 512-token prompt has 230

Replies with the same prompt length are fed the longest of their slots (never less than the truth); a reply whose
slot is not found (still in the server's queue, or done) keeps its last figure. It may generate a whole step
between two readings, so its hold keeps a step of slack (``Growth.lag_tokens``). When the slots can't be read, each
reply it follows grows to its limit where the pool has room: blind, it holds what a fixed reservation would.

Such a reply can't be ended with a normal final event; kvgate ends one only when no stream is left to end
(``ElasticPools._candidates``), and its client then gets a 503 ``reply_ended_by_kvgate`` before any byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from gateway.admission.elastic import Growth
from gateway.backends.client import BackendCallError
from gateway.backends.registry import Backend
from gateway.errors import ReplyEnded
from gateway.runtimes import runtime_for
from gateway.support.tasks import stop

log = logging.getLogger(__name__)

PROMPT_SLACK_TOKENS = 2
"""A slot's prompt may differ from kvgate's count by this much (a BOS kvgate's template left out) and still match."""


@dataclass(slots=True)
class _Reader:
    backend: Backend
    growths: set[Growth] = field(default_factory=set)
    task: asyncio.Task[None] | None = None


class SlotWatch:
    """One slot reader per backend while elastic replies that are not streamed run on it (module docstring)."""

    def __init__(self, poll_s: float = 0.1) -> None:
        self.poll_s = poll_s
        self._readers: dict[str, _Reader] = {}

    def follows(self, backend: Backend) -> bool:
        """Whether the backend's slots can be read (so a reply that is not streamed may be elastic there)."""
        return runtime_for(backend).slot_use_path is not None

    def follow(self, growth: Growth, backend: Backend) -> None:
        reader = self._readers.get(backend.name)
        if reader is None:
            reader = self._readers[backend.name] = _Reader(backend)
        reader.growths.add(growth)
        growth.read_at = (asyncio.get_running_loop().time(), 0)  # the first reading shows its rate too
        if reader.task is None or reader.task.done():
            reader.task = asyncio.get_running_loop().create_task(self._read(reader),
                                                                   name=f"kvgate slots of {backend.name}")

    def forget(self, growth: Growth) -> None:
        for reader in self._readers.values():
            reader.growths.discard(growth)

    async def close(self) -> None:
        """Stop every reader (the app is shutting down)."""
        for reader in self._readers.values():
            if reader.task is not None:
                await stop(reader.task)

    async def _read(self, reader: _Reader) -> None:
        runtime = runtime_for(reader.backend)
        path = runtime.slot_use_path
        assert path is not None
        while reader.growths:
            await asyncio.sleep(self.poll_s)
            if not reader.growths:
                break
            try:
                answer = await reader.backend.client.request_json("GET", path, timeout_s=max(1.0, 10 * self.poll_s))
            except BackendCallError as exc:  # the slots can't be read: the replies are followed blind
                log.debug("could not read the slots of %s: %s", reader.backend.name, exc)
                for growth in tuple(reader.growths):
                    _blind(growth)
                continue
            feed(tuple(reader.growths), runtime.slots_in_use(answer), asyncio.get_running_loop().time(),
                 self.poll_s)


def feed(growths: tuple[Growth, ...], slots: Sequence[tuple[int, int]], now_s: float, poll_s: float) -> None:
    """Each reply's output is the longest of the busy slots whose prompt is its own (module docstring); its slack is
    what it generates in two polls at the rate it showed since the last one (at least a step)."""
    for growth in growths:
        if growth.ended is not None:
            continue
        matched = [out for prompt, out in slots if abs(prompt - growth.prompt_tokens) <= PROMPT_SLACK_TOKENS]
        if not matched:
            continue
        output = max(growth.output_tokens, max(matched))
        last = growth.read_at
        if last is not None and now_s > last[0]:
            rate = (output - last[1]) / (now_s - last[0])
            growth.lag_tokens = max(growth.owner.step_tokens, math.ceil(rate * poll_s * 2))
        growth.read_at = (now_s, output)
        if not growth.seen(output) and growth.interrupt is not None:
            growth.interrupt()


def _blind(growth: Growth) -> None:
    """The slots can't be read: hold what a fixed reservation would, as far as the pool allows."""
    if growth.ended is None and growth.held_tokens < growth.limit_tokens:
        growth.owner.grow(growth.permit, growth.limit_tokens, growth.pool)


def ended_as_refusal(growth: Growth | None) -> contextlib.AbstractContextManager[None]:
    """Around the forward of a reply that is not streamed but elastic: kvgate may end it (``ElasticPools``) any time
    before its answer comes, by cancelling the forwarding task; that becomes ReplyEnded (503), as nothing has reached
    the client yet, and leaving the block closes the upstream connection, so the server stops the sequence."""
    return _NOT_ELASTIC if growth is None or growth.streamed else _ended_as_refusal(growth)


_NOT_ELASTIC: contextlib.nullcontext[None] = contextlib.nullcontext()


@contextlib.contextmanager
def _ended_as_refusal(growth: Growth) -> Iterator[None]:
    task = asyncio.current_task()
    assert task is not None
    growth.interrupt = task.cancel
    try:
        yield
    except asyncio.CancelledError:
        if growth.ended is None:
            raise
        task.uncancel()
        raise ReplyEnded(f"{growth.ended}; the reply was not streamed, so it could not be ended with a final "
                         "event: ask again, or stream it", retry_after_s=1.0) from None
    finally:
        growth.interrupt = None
