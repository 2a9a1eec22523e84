"""The shared ledger's pipelined script connection (script_line.py) against a real redis-server: answers go to their
own calls whatever arrives at once or is cancelled, scripts Redis forgot are sent whole, a password and a database
are used, and a silent, dying or refusing Redis fails the calls on it (never a late answer read as another's)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.admission.shared.script_line import ReplyError, ScriptLine, pack, script_sha
from gateway.admission.shared.store import SharedStore
from gateway.admission.types import PoolKey
from tests.support.redis_server import RunningRedis, running_redis
from tests.support.tcp_cut import CuttableProxy

ECHO = "return {KEYS[1], ARGV[1], tonumber(ARGV[2]) * 2}"


def _line(port: int, **kwargs: object) -> ScriptLine:
    return ScriptLine("127.0.0.1", port, **kwargs)  # type: ignore[arg-type]


def test_commands_are_written_as_redis_reads_them() -> None:
    assert pack(("SET", "k", 5)) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n5\r\n"
    assert pack(("X", 0.5, b"\x00\xff", "é")) == b"*4\r\n$1\r\nX\r\n$3\r\n0.5\r\n$2\r\n\x00\xff\r\n$2\r\n\xc3\xa9\r\n"


async def test_calls_made_at_once_each_get_their_own_answer(redis_url: str, redis_server: RunningRedis) -> None:
    line = _line(redis_server.port)
    try:
        await asyncio.gather(*(line.call("SET", f"k{index}", index) for index in range(300)))
        answers = await asyncio.gather(*(line.call("GET", f"k{index}") for index in range(300)))
        assert answers == [str(index).encode() for index in range(300)]
    finally:
        await line.close()


async def test_a_cancelled_call_does_not_shift_the_answers_of_the_others(redis_url: str,
                                                                        redis_server: RunningRedis) -> None:
    line = _line(redis_server.port)
    try:
        await line.call("SET", "a", "A")
        await line.call("SET", "b", "B")
        slow = asyncio.ensure_future(line.call("EVAL", "local t = redis.call('TIME') return 'slow'", 0))
        first = asyncio.ensure_future(line.call("GET", "a"))
        await asyncio.sleep(0)  # both written
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first
        assert await slow == b"slow"
        assert await line.call("GET", "b") == b"B"  # not "A", the cancelled call's answer
    finally:
        await line.close()


async def test_a_script_redis_does_not_know_is_sent_whole_then_called_by_its_sha(
    redis_url: str, redis_server: RunningRedis,
) -> None:
    line, sha = _line(redis_server.port), script_sha(ECHO)
    direct = aioredis.Redis.from_url(redis_url)
    try:
        await direct.script_flush()
        assert await line.evalsha(sha, ECHO, ["key"], ["arg", 21]) == [b"key", b"arg", 42]
        assert (await direct.script_exists(sha)) == [True]  # EVAL cached it: the next call goes by sha
        before = (await direct.info("commandstats")).get("cmdstat_eval", {}).get("calls", 0)
        assert await line.evalsha(sha, ECHO, ["key"], ["x", 1]) == [b"key", b"x", 2]
        assert (await direct.info("commandstats")).get("cmdstat_eval", {}).get("calls", 0) == before
    finally:
        await direct.aclose()
        await line.close()


async def test_an_error_answer_is_raised_and_the_line_goes_on(redis_url: str, redis_server: RunningRedis) -> None:
    line = _line(redis_server.port)
    try:
        with pytest.raises(ReplyError, match="ERR"):
            await line.call("EVAL", "return redis.error_reply('ERR made up')", 0)
        with pytest.raises(ReplyError):
            await line.call("NOT-A-COMMAND")
        assert await line.call("PING") == b"PONG"
    finally:
        await line.close()


async def test_a_password_and_a_database_from_the_url_are_used() -> None:
    with running_redis(extra_args=("--requirepass", "s3cret-pass")) as server:
        url = f"redis://:s3cret-pass@127.0.0.1:{server.port}/3"
        store = SharedStore.from_url(url, prefix="t", timeout_s=1.0)
        line = ScriptLine.for_pool(store.client.connection_pool)
        assert line is not None and "s3cret" not in repr(line)
        await line.call("SET", "where", "db3")
        direct = aioredis.Redis.from_url(url)
        assert await direct.get("where") == b"db3"
        await direct.aclose()
        assert (await store.totals(PoolKey("b", "m"))).verdict == "0"  # the store's scripts, on its own line
        wrong = _line(server.port, password="wrong", timeout_s=1.0)
        with pytest.raises(ConnectionError, match="refused"):
            await wrong.call("PING")
        await wrong.close()
        await line.close()
        await store.close()


async def test_a_silent_redis_fails_every_waiting_call_within_the_timeout_then_the_line_reopens(
    redis_url: str, redis_server: RunningRedis,
) -> None:
    async with CuttableProxy(redis_server.port) as path:
        line = _line(path.port, timeout_s=0.3)
        try:
            assert await line.call("PING") == b"PONG"
            path.pause()
            loop = asyncio.get_running_loop()
            started_s = loop.time()
            results = await asyncio.gather(*(line.call("PING") for _ in range(5)), return_exceptions=True)
            waited_s = loop.time() - started_s
            print(f"\n  Redis silent: 5 calls failed after {waited_s:.2f} s (timeout_s 0.3): "
                  f"{sorted({type(r).__name__ for r in results})}")
            assert all(isinstance(r, TimeoutError) for r in results) and 0.25 <= waited_s < 0.9
            path.resume()
            assert await line.call("PING") == b"PONG"  # a new connection: the late PONGs are never read
        finally:
            await line.close()


async def test_a_redis_that_goes_away_fails_the_calls_on_it_and_a_refusing_one_fails_at_once() -> None:
    with running_redis() as server:
        line = _line(server.port, timeout_s=2.0)
        assert await line.call("PING") == b"PONG"
        waiting = asyncio.ensure_future(line.call("EVAL", "local n = 0 for i = 1, 3e7 do n = n + 1 end return n", 0))
        await asyncio.sleep(0.1)
        server.process.kill()
        with pytest.raises(ConnectionError):
            await waiting
        with pytest.raises(ConnectionError):
            await line.call("PING")  # nobody listens: refused, not waited for
        await line.close()


def test_only_plain_tcp_urls_get_a_line() -> None:
    def pool(url: str) -> aioredis.ConnectionPool:
        return aioredis.ConnectionPool.from_url(url)

    tcp = ScriptLine.for_pool(pool("redis://user:pw@10.0.0.9:6390/2"))
    assert tcp is not None and repr(tcp) == "ScriptLine(10.0.0.9:6390/2)"
    assert ScriptLine.for_pool(pool("rediss://10.0.0.9:6390/0")) is None  # TLS: redis-py's calls
    assert ScriptLine.for_pool(pool("unix:///run/redis.sock")) is None


async def test_a_store_on_a_unix_socket_keeps_redis_pys_own_calls(tmp_path: Path) -> None:
    sock = tmp_path / "redis.sock"
    with running_redis(extra_args=("--unixsocket", str(sock))):
        store = SharedStore.from_url(f"unix://{sock}", prefix="t", timeout_s=1.0)
        assert ScriptLine.for_pool(store.client.connection_pool) is None
        await store.learn_epoch()
        assert store.epoch and (await store.totals(PoolKey("b", "m"))).verdict == "0"
        await store.close()


async def test_a_peer_that_does_not_speak_resp_fails_the_calls_at_once() -> None:
    done = asyncio.Event()

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.read(100)
            writer.write(b"?not resp at all\r\n")
            await writer.drain()
            with contextlib.suppress(ConnectionError):
                await reader.read()  # until the line closes the connection
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            done.set()

    server = await asyncio.start_server(garbage, "127.0.0.1", 0)
    line = _line(server.sockets[0].getsockname()[1], timeout_s=3.0)
    try:
        started_s = asyncio.get_running_loop().time()
        with pytest.raises(ConnectionError, match="not RESP"):
            await line.call("PING")
        assert asyncio.get_running_loop().time() - started_s < 1.0  # not left to the timeout
    finally:
        await line.close()
        await asyncio.wait_for(done.wait(), timeout=5)
        server.close()
        await server.wait_closed()
