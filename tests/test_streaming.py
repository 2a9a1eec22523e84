"""The relay writes a chunk that follows a quiet gap at once, and merges chunks that arrive faster than
``coalesce_s`` into one write per interval, never holding the end of a body back (gateway/streaming.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import cast

import aiohttp
from aiohttp import web

from gateway.domain import Dialect
from gateway.errors import BackendUnavailable
from gateway.streaming import RelayPlan, pump
from tests.support.fake_backend import serve


class RecordingResponse:
    """Stands in for the client's StreamResponse: records each write and when it happened."""

    def __init__(self) -> None:
        self.writes: list[tuple[float, bytes]] = []
        self.ended = False

    async def write(self, data: bytes) -> None:
        assert not self.ended, "a write after the end of the body"
        self.writes.append((time.monotonic(), bytes(data)))

    async def write_eof(self, data: bytes = b"") -> None:
        if data:
            await self.write(data)
        self.ended = True

    @property
    def body(self) -> bytes:
        return b"".join(data for _, data in self.writes)


@asynccontextmanager
async def upstream(frames: list[tuple[float, bytes]], *, break_off: bool = False) -> AsyncIterator[str]:
    """A backend that sends each frame after its delay, then ends the body (or drops the connection)."""
    sent: list[float] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        for delay_s, frame in frames:
            if delay_s:
                await asyncio.sleep(delay_s)  # the backend's pace between frames
            await response.write(frame)
            sent.append(time.monotonic())
        if break_off:
            assert request.transport is not None
            request.transport.close()
            return response
        await response.write_eof()
        return response

    async with serve({("POST", "/api/chat"): handle}) as url:
        yield f"{url}/api/chat"


async def relay_through(url: str, coalesce_s: float) -> tuple[RecordingResponse, object, float]:
    recorder = RecordingResponse()
    async with aiohttp.ClientSession() as http, http.post(url, data=b"{}") as response:
        started = time.monotonic()
        error = await pump(response, cast(web.StreamResponse, recorder),
                           RelayPlan(Dialect.OLLAMA, "r", "fake", idle_s=30, coalesce_s=coalesce_s))
    return recorder, error, time.monotonic() - started


def lines(n: int) -> list[bytes]:
    return [b'{"n":%d}\n' % i for i in range(n)]


async def test_a_burst_is_written_in_one_piece_and_its_end_is_not_held_back() -> None:
    frames = [(0.0, frame) for frame in lines(200)]
    async with upstream(frames) as url:
        recorder, error, elapsed_s = await relay_through(url, coalesce_s=10.0)
    assert error is None
    assert recorder.body == b"".join(lines(200))
    assert 1 <= len(recorder.writes) <= 2  # the first read at once; everything after it in one piece
    assert elapsed_s < 5.0  # the body's end woke the relay: it did not sit out the 10 s interval
    assert recorder.ended  # and the end of the body went out with the last data, in the same write


async def test_chunks_after_quiet_gaps_are_each_written_at_once() -> None:
    frames = [(0.0 if i == 0 else 0.25, frame) for i, frame in enumerate(lines(4))]
    async with upstream(frames) as url:
        recorder, error, _ = await relay_through(url, coalesce_s=0.05)
    assert error is None
    assert [data for _, data in recorder.writes] == lines(4)  # one write per chunk: none was held for another


async def test_a_chunk_soon_after_a_write_waits_at_most_the_interval() -> None:
    frames = [(0.0, b'{"n":0}\n'), (0.4, b'{"n":1}\n'), (0.0, b'{"n":2}\n'), (0.4, b'{"n":3}\n')]
    async with upstream(frames) as url:
        recorder, error, _ = await relay_through(url, coalesce_s=0.1)
    assert error is None
    assert recorder.body == b"".join(frame for _, frame in frames)
    # n=1 goes at once after its quiet gap; n=2, right behind it, waits out the interval (or joins n=1's write);
    # n=3 comes after another gap and goes at once.
    assert recorder.writes[-1][1] == b'{"n":3}\n'
    assert len(recorder.writes) in (3, 4)


async def test_what_came_before_a_broken_connection_is_written_before_the_error() -> None:
    frames = [(0.0, frame) for frame in lines(50)]
    async with upstream(frames, break_off=True) as url:
        recorder, error, _ = await relay_through(url, coalesce_s=10.0)
    assert isinstance(error, BackendUnavailable)
    assert recorder.body == b"".join(lines(50))


async def test_zero_turns_coalescing_off() -> None:
    frames = [(0.0 if i == 0 else 0.05, frame) for i, frame in enumerate(lines(3))]
    async with upstream(frames) as url:
        recorder, error, _ = await relay_through(url, coalesce_s=0.0)
    assert error is None
    assert [data for _, data in recorder.writes] == lines(3)
