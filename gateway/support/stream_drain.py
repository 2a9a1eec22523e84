"""Take everything an aiohttp ``StreamReader`` holds in one piece, at the cost of one chunk.

A streamed reply reaches kvgate as many small HTTP chunks (an NDJSON line or an SSE event each), and aiohttp keeps
each as an entry of the reader's buffer. Its ``readany()`` and ``read_nowait()`` drain the entries one at a time,
and since aiohttp 3.14 each one asks the protocol to resume reading, which re-feeds the parser an empty read: about
a microsecond an entry, 15% of kvgate's CPU relaying a 500-chunk stream (py-spy, ``bench.overhead``'s stream).
``take_buffered`` moves all entries but the last with one join and lets ``read_nowait`` take the last, so
aiohttp's own bookkeeping (chunk splits, flow control, the read timer, a stored error) runs once, as for one chunk;
``read_any`` is ``readany()`` on top of it (it waits as ``readany`` does, with the reader's own ``_wait``).

It touches the reader's private buffer, so it works only on the shape it was written against (a plain
``StreamReader`` with a ``deque`` buffer, nothing consumed from its first entry, no error stored) and otherwise
leaves everything to ``read_nowait``. tests/gateway_support/test_stream_drain.py pins the bytes, the counters and the
flow control against ``read_nowait`` on the installed aiohttp.
"""

from __future__ import annotations

from collections import deque

from aiohttp import StreamReader


async def read_any(content: StreamReader) -> bytes:
    """``content.readany()``, the buffer taken by ``take_buffered``: what came, at least one byte, or b"" at the
    body's end; a stored error is raised."""
    if type(content) is not StreamReader:
        return await content.readany()
    while True:
        data = take_buffered(content)
        if data or content.is_eof():
            return data
        await content._wait("readany")


def take_buffered(content: StreamReader) -> bytes:
    """All the bytes ``content`` holds now (b"" when none), as ``content.read_nowait()`` returns them."""
    buffer = getattr(content, "_buffer", None)
    if (type(content) is not StreamReader or type(buffer) is not deque or len(buffer) < 3
            or content._buffer_offset or content.exception() is not None):
        return content.read_nowait()
    head = [buffer.popleft() for _ in range(len(buffer) - 1)]
    taken = sum(map(len, head))
    content._size -= taken
    content._cursor += taken
    head.append(content.read_nowait())
    return b"".join(head)
