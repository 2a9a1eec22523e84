"""A loopback TCP proxy a test can cut or pause: one replica's path to Redis, without touching Redis itself.

    async with CuttableProxy(6379) as path:          # path.url: redis://127.0.0.1:<its port>/0
        path.pause()    # bytes stop flowing both ways (a partition that drops packets): calls time out
        path.cut()      # every connection is closed and new ones are refused at once (a reset)
        path.resume()   # new connections go through again (those cut or paused are closed, their bytes dropped)
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType


class CuttableProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self._target = (target_host, target_port)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._refusing = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def __aenter__(self) -> CuttableProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in tuple(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def pause(self) -> None:
        self._flowing.clear()

    def cut(self) -> None:
        self._refusing = True
        self._flowing.set()
        for writer in tuple(self._writers):
            writer.transport.abort()
        self._writers.clear()

    def resume(self) -> None:
        for writer in tuple(self._writers):  # what was held while paused is never delivered late
            writer.transport.abort()
        self._writers.clear()
        self._refusing = False
        self._flowing.set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refusing:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._copy(source, sink))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _copy(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while chunk := await source.read(65536):
                await self._flowing.wait()
                if sink.transport.is_closing():
                    return
                sink.write(chunk)
                await sink.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            sink.transport.abort()
            self._writers.discard(sink)
