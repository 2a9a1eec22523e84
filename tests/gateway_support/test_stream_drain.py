"""take_buffered and read_any against aiohttp's own read_nowait and readany, on the installed aiohttp: the same bytes,
the same reader state afterwards (size, cursor, chunk splits, end), the same flow control (a reader paused over its
high water is resumed), the same errors; and the fallbacks where the reader is not the shape take_buffered knows."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from aiohttp import StreamReader
from aiohttp.streams import EmptyStreamReader

from gateway.support.stream_drain import read_any, take_buffered

LIMIT = 2**16


class FakeProtocol:
    """What a StreamReader asks of its protocol: pause and resume (counted), and whether it is connected."""

    def __init__(self) -> None:
        self.connected = True
        self._reading_paused = False
        self.pauses = 0
        self.resumes = 0

    def pause_reading(self) -> None:
        self._reading_paused = True
        self.pauses += 1

    def resume_reading(self, resume_parser: bool = True) -> None:
        self._reading_paused = False
        self.resumes += 1


def _reader(loop: asyncio.AbstractEventLoop) -> tuple[StreamReader, FakeProtocol]:
    protocol = FakeProtocol()
    return StreamReader(protocol, LIMIT, loop=loop), protocol  # type: ignore[arg-type]


def _chunks(count: int, size: int = 120) -> Callable[[StreamReader], None]:
    def feed(reader: StreamReader) -> None:
        for index in range(count):
            reader.begin_http_chunk_receiving()
            reader.feed_data(bytes([48 + index % 10]) * size)
            reader.end_http_chunk_receiving()
    return feed


def _plain(count: int) -> Callable[[StreamReader], None]:
    def feed(reader: StreamReader) -> None:  # a body without chunked encoding: no chunk splits
        for index in range(count):
            reader.feed_data(b"line %d\n" % index)
    return feed


def _then(*steps: Callable[[StreamReader], object]) -> Callable[[StreamReader], None]:
    def feed(reader: StreamReader) -> None:
        for step in steps:
            step(reader)
    return feed


CASES: dict[str, Callable[[StreamReader], None]] = {
    "nothing buffered": _chunks(0),
    "one chunk": _chunks(1),
    "two chunks": _chunks(2),
    "three chunks": _chunks(3),
    "500 NDJSON-sized chunks": _chunks(500),
    "500 plain feeds (no chunked encoding)": _plain(500),
    "over the high water (paused)": _chunks(40, 4096),
    "over the high water, plain": _plain(20_000),
    "first chunk partly read": _then(_chunks(50), lambda reader: reader.read_nowait(7)),
    "chunks, then the body's end": _then(_chunks(30), lambda reader: reader.feed_eof()),
}


def _state(reader: StreamReader, protocol: FakeProtocol) -> tuple[object, ...]:
    splits = reader._http_chunk_splits
    return (reader._size, reader._cursor, None if splits is None else list(splits), len(reader._buffer),
            reader.is_eof(), reader.at_eof(), protocol._reading_paused)


@pytest.mark.parametrize("case", CASES)
def test_take_buffered_leaves_what_read_nowait_leaves(case: str) -> None:
    loop = asyncio.new_event_loop()
    try:
        (ours, our_protocol), (theirs, their_protocol) = _reader(loop), _reader(loop)
        CASES[case](ours)
        CASES[case](theirs)
        paused_before = our_protocol._reading_paused
        taken, read = take_buffered(ours), theirs.read_nowait()
        print(f"{case:<40} {len(read):>9} bytes  paused before {paused_before!s:<5} after "
              f"{our_protocol._reading_paused}")
        assert taken == read
        assert _state(ours, our_protocol) == _state(theirs, their_protocol)
        assert take_buffered(ours) == theirs.read_nowait() == b""
    finally:
        loop.close()


def test_a_paused_reader_is_resumed_once_when_its_buffer_is_taken() -> None:
    loop = asyncio.new_event_loop()
    try:
        reader, protocol = _reader(loop)
        _chunks(40, 4096)(reader)
        assert protocol._reading_paused
        resumes = protocol.resumes
        assert len(take_buffered(reader)) == 40 * 4096
        assert not protocol._reading_paused
        assert 1 <= protocol.resumes - resumes <= 2  # read_nowait resumes for each chunk it drains: 40 here
    finally:
        loop.close()


def test_a_stored_error_is_raised_and_nothing_is_taken() -> None:
    loop = asyncio.new_event_loop()
    try:
        reader, _ = _reader(loop)
        _chunks(10)(reader)
        reader.set_exception(ConnectionResetError("backend went away"))
        with pytest.raises(ConnectionResetError, match="backend went away"):
            take_buffered(reader)
        assert len(reader._buffer) == 10  # as read_nowait leaves it
    finally:
        loop.close()


def test_an_empty_reader_gives_nothing() -> None:
    loop = asyncio.new_event_loop()
    try:
        empty = EmptyStreamReader()
        assert take_buffered(empty) == b""
        assert loop.run_until_complete(read_any(empty)) == b""
    finally:
        loop.close()


async def test_read_any_waits_for_data_and_ends_at_the_body_end() -> None:
    reader, _ = _reader(asyncio.get_running_loop())
    waiting = asyncio.create_task(read_any(reader))
    await asyncio.sleep(0)
    assert not waiting.done()
    _chunks(5)(reader)
    assert await waiting == b"".join(bytes([48 + index]) * 120 for index in range(5))
    _chunks(3)(reader)
    reader.feed_eof()
    assert len(await read_any(reader)) == 3 * 120
    assert await read_any(reader) == b""


async def test_read_any_wakes_on_an_end_with_nothing_in_it() -> None:
    reader, _ = _reader(asyncio.get_running_loop())
    waiting = asyncio.create_task(read_any(reader))
    await asyncio.sleep(0)
    reader.feed_eof()
    assert await asyncio.wait_for(waiting, 1) == b""


async def test_read_any_raises_an_error_that_comes_while_it_waits() -> None:
    reader, _ = _reader(asyncio.get_running_loop())
    waiting = asyncio.create_task(read_any(reader))
    await asyncio.sleep(0)
    reader.set_exception(ConnectionResetError("cut"))
    with pytest.raises(ConnectionResetError, match="cut"):
        await asyncio.wait_for(waiting, 1)


async def test_read_any_refuses_a_second_reader_as_readany_does() -> None:
    reader, _ = _reader(asyncio.get_running_loop())
    first = asyncio.create_task(read_any(reader))
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="waiting for incoming data"):
        await read_any(reader)
    reader.feed_eof()
    assert await first == b""
