"""One pipelined connection that carries every ledger script call of a replica (issue 26: the shared ledger at one
round trip, and that round trip cheap).

redis-py runs each call on a connection of its own, taken from the pool and given back, through its retry, health
check, timeout and event layers: most of the ~470 us of CPU the shared ledger added to a small chat (1,063 -> 1,536
us, measured), far more than Redis spends running the script. A script call needs none of that. ``ScriptLine``
writes the calls on one connection and reads the answers in order (Redis answers the commands of a connection in the
order they came): the calls made in one turn of the event loop go out in one write, their answers come back in one
read, and each call costs a future and its share of one parse (hiredis, the C parser redis-py uses too). Measured
(wrk, small chats, a kvgate with the shared ledger on a local Redis against one without, alternating 2 s rounds,
medians of 8): 0.69x the unshared requests/s with redis-py's calls, 0.89x on the line at 16 connections; 0.47x and
0.81x at 64.

    call(*parts)      one command; its answer, or ReplyError (Redis's error answer, raised as it came)
    evalsha(...)      a script by its SHA1; sent whole once when Redis does not know it (NOSCRIPT: a new or
                      restarted Redis), as redis-py's Script does
    ConnectionError   the connection broke or could not be opened: every call on it fails; the next call opens a
                      new one
    TimeoutError      no answer within ``timeout_s``: the connection is closed, with every call on it (a late
                      answer must never be read as the answer to a later call)

Opening sends AUTH (with the URL's user and password) and SELECT (its database) first. Only plain TCP is spoken
here: for a ``rediss://`` (TLS) or ``unix://`` URL ``for_pool`` says None and the store keeps redis-py's own calls.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from collections.abc import Sequence
from typing import Any, cast

import hiredis
import redis.asyncio as aioredis

Part = str | int | float | bytes


class ReplyError(Exception):
    """Redis answered the command with an error (a script's error, NOSCRIPT, WRONGPASS, ...)."""


def script_sha(source: str) -> str:
    """The SHA1 Redis names a script by (EVALSHA)."""
    return hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()


def pack(parts: Sequence[Part]) -> bytes:
    """A command in RESP: an array of bulk strings (numbers as redis-py writes them: ints in decimal, floats by
    repr)."""
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        if isinstance(part, bytes):
            data = part
        elif isinstance(part, str):
            data = part.encode()
        elif isinstance(part, float):
            data = repr(part).encode()
        else:
            data = b"%d" % part
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class _Protocol(asyncio.Protocol):
    """The connection's reading side: each answer goes to the oldest call still waiting for one."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiting: deque[tuple[asyncio.Future[Any], float]] = deque()
        """Each call sent and not yet answered, with when it was sent (the loop's clock)."""
        self.lost: BaseException | None = None
        self._reader = hiredis.Reader(replyError=ReplyError)
        self._outgoing: list[bytes] = []
        """Commands of this turn of the loop not written yet (``queue``), in the order of ``waiting``."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass

    def data_received(self, data: bytes) -> None:
        reader, waiting = self._reader, self.waiting
        reader.feed(data)
        while True:
            try:
                answer = reader.gets()
            except hiredis.ProtocolError as exc:  # not RESP: nothing more on this connection can be trusted
                self.fail(ConnectionError(f"Redis sent something that is not RESP: {exc}"))
                return
            if answer is False:
                break
            if not waiting:  # an answer nobody asked for: the stream can't be trusted any more
                self.fail(ConnectionError("Redis sent an answer to no command"))
                return
            future, _ = waiting.popleft()
            if future.done():  # its caller was cancelled: the answer is read and dropped, the order kept
                continue
            if isinstance(answer, ReplyError):
                future.set_exception(answer)
            else:
                future.set_result(answer)

    def queue(self, command: bytes, loop: asyncio.AbstractEventLoop) -> None:
        """Write ``command`` with the others of this turn of the loop: calls made together cost one write."""
        if not self._outgoing:
            loop.call_soon(self._flush)
        self._outgoing.append(command)

    def _flush(self) -> None:
        outgoing, self._outgoing = self._outgoing, []
        if self.transport is not None and self.lost is None:
            self.transport.write(b"".join(outgoing))

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail_waiting(exc if exc is not None else ConnectionError("Redis closed the connection"))

    def fail(self, exc: BaseException) -> None:
        """Close the connection: every call waiting on it fails with ``exc``."""
        self._fail_waiting(exc)
        if self.transport is not None:
            self.transport.abort()

    def _fail_waiting(self, exc: BaseException) -> None:
        if self.lost is None:
            self.lost = exc
        while self.waiting:
            future, _ = self.waiting.popleft()
            if not future.done():
                future.set_exception(_fresh(exc))


def _fresh(exc: BaseException) -> BaseException:
    """A new exception of the same kind for each waiting call (one instance raised in many tasks would collect
    all their tracebacks)."""
    if isinstance(exc, TimeoutError):
        return TimeoutError(str(exc))
    return ConnectionError(str(exc) or type(exc).__name__)


class ScriptLine:
    """See the module docstring. One per store; opened on the first call, again after a failure."""

    def __init__(self, host: str, port: int, *, db: int = 0, username: str | None = None,
                 password: str | None = None, timeout_s: float = 1.0) -> None:
        self._host, self._port, self._db = host, port, db
        self._username, self._password = username, password
        self._timeout_s = timeout_s
        self._protocol: _Protocol | None = None
        self._opening: asyncio.Lock | None = None
        self._watchdog: asyncio.TimerHandle | None = None

    @classmethod
    def for_pool(cls, pool: aioredis.ConnectionPool) -> ScriptLine | None:
        """A line to the Redis of redis-py's ``pool`` (same host, port, database, user and password, its socket
        timeout); None where the pool speaks TLS or a Unix socket (those stay with redis-py)."""
        if pool.connection_class is not aioredis.Connection:
            return None
        kwargs = pool.connection_kwargs
        timeout_s = kwargs.get("socket_timeout") or kwargs.get("socket_connect_timeout") or 5.0
        return cls(str(kwargs.get("host", "localhost")), int(kwargs.get("port", 6379)), db=int(kwargs.get("db") or 0),
                   username=kwargs.get("username"), password=kwargs.get("password"), timeout_s=float(timeout_s))

    def __repr__(self) -> str:  # never the password
        return f"ScriptLine({self._host}:{self._port}/{self._db})"

    async def call(self, *parts: Part) -> Any:
        protocol = self._protocol
        if protocol is None or protocol.lost is not None:
            protocol = await self._open()
        return await self._send(protocol, pack(parts))

    async def evalsha(self, sha: str, source: str, keys: Sequence[str], args: Sequence[Part]) -> Any:
        """The script by its SHA1; sent whole (EVAL) when Redis answers NOSCRIPT."""
        try:
            return await self.call("EVALSHA", sha, len(keys), *keys, *args)
        except ReplyError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                raise
        return await self.call("EVAL", source, len(keys), *keys, *args)

    async def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.transport is not None:
            protocol.fail(ConnectionError("the script line was closed"))

    def _send(self, protocol: _Protocol, command: bytes) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        protocol.waiting.append((future, loop.time()))
        protocol.queue(command, loop)
        if self._watchdog is None:
            self._watchdog = loop.call_at(loop.time() + self._timeout_s, self._watch)
        return future

    def _watch(self) -> None:
        """Every ``timeout_s`` while calls wait: a call waiting longer than that closes the line."""
        self._watchdog = None
        protocol = self._protocol
        if protocol is None or not protocol.waiting:
            return
        loop = asyncio.get_running_loop()
        oldest_s = protocol.waiting[0][1]
        if loop.time() - oldest_s >= self._timeout_s:
            protocol.fail(TimeoutError(f"Redis did not answer within {self._timeout_s:g} s"))
            return
        self._watchdog = loop.call_at(oldest_s + self._timeout_s, self._watch)

    async def _open(self) -> _Protocol:
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:  # one connection for all: the calls that came meanwhile use it too
            protocol = self._protocol
            if protocol is not None and protocol.lost is None:
                return protocol
            loop = asyncio.get_running_loop()
            try:
                async with asyncio.timeout(self._timeout_s):
                    transport, made = await loop.create_connection(_Protocol, self._host, self._port)
                made.transport = transport  # uvloop calls connection_made only later
            except TimeoutError:
                raise
            except OSError as exc:  # refused, unreachable
                raise ConnectionError(str(exc) or type(exc).__name__) from exc
            try:
                async with asyncio.timeout(self._timeout_s):
                    await self._hello(made)
            except BaseException as exc:
                made.fail(ConnectionError("the connection was not set up"))
                if isinstance(exc, ReplyError):  # a wrong password or database: Redis is there, but not usable
                    raise ConnectionError(f"Redis refused the connection: {exc}") from exc
                raise
            self._protocol = made
            return made

    async def _hello(self, made: _Protocol) -> None:
        """AUTH and SELECT, as the URL says, pipelined."""
        hello: list[asyncio.Future[Any]] = []
        if self._password is not None:
            auth = (self._username, self._password) if self._username else (self._password,)
            hello.append(self._send(made, pack(("AUTH", *auth))))
        if self._db:
            hello.append(self._send(made, pack(("SELECT", self._db))))
        for answer in hello:
            await answer
