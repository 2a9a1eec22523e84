"""read_body (gateway/edge/body/reader.py) inside a real aiohttp handler on loopback: plain, chunked, gzip and deflate
bodies, the size limit (declared, counted, decoded), and the lease that holds the body's bytes until released."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from gateway.edge.body.budget import BodyBudget
from gateway.edge.body.reader import read_body
from gateway.errors import GatewayError
from tests.support.fake_backend import serve
from tests.support.poll import until

MAX_BODY_BYTES = 64 * 1024
BUDGET_BYTES = 1024 * 1024
TEXT = b'{"model":"m","prompt":"' + b"hello world " * 2000 + b'"}'  # 24,025 bytes
assert len(TEXT) < MAX_BODY_BYTES


@dataclass
class Reader:
    """An application whose one handler reads the body under a lease of ``budget``, answers what it read (or the
    error), and releases the lease when the response is done; ``gate``, when set, holds the handler after reading."""

    budget: BodyBudget
    gate: asyncio.Event | None = None
    held_bytes: list[int] = field(default_factory=list)
    """What the lease held once the body was read (or refused), per request."""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/read", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        lease = self.budget.lease()
        try:
            body = await read_body(request, lease, max_bytes=MAX_BODY_BYTES)
            self.held_bytes.append(lease.held_bytes)
            if self.gate is not None:
                await self.gate.wait()
            return web.json_response({"bytes": len(body), "same": body == TEXT})
        except GatewayError as exc:
            self.held_bytes.append(lease.held_bytes)
            return web.json_response({"code": exc.code, "message": exc.message}, status=exc.status)
        finally:
            lease.release()


@contextlib.asynccontextmanager
async def reading(budget: BodyBudget | None = None) -> AsyncIterator[tuple[Reader, aiohttp.ClientSession, str]]:
    reader = Reader(budget or BodyBudget(BUDGET_BYTES, wait_s=0.0))
    async with serve(reader.app()) as url, aiohttp.ClientSession() as session:
        yield reader, session, f"{url}/read"


async def post(session: aiohttp.ClientSession, url: str, data: Any, headers: dict[str, str]) -> tuple[int, Any]:
    async with session.post(url, data=data, headers=headers) as response:
        return response.status, await response.json()


def chunked(data: bytes, chunk_bytes: int = 8192) -> Any:
    """The body as an async iterator: aiohttp sends it chunked, with no Content-Length."""

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(data), chunk_bytes):
            yield data[start:start + chunk_bytes]

    return chunks()


def raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


@dataclass(frozen=True)
class Case:
    name: str
    data: bytes
    encoding: str | None = None
    chunked: bool = False


READ = [
    Case("plain, with Content-Length", TEXT),
    Case("plain, chunked", TEXT, chunked=True),
    Case("gzip", gzip.compress(TEXT), "gzip"),
    Case("x-gzip, chunked", gzip.compress(TEXT), "x-gzip", chunked=True),
    Case("gzip in two members", gzip.compress(TEXT[:10_000]) + gzip.compress(TEXT[10_000:]), "gzip"),
    Case("deflate, zlib-wrapped", zlib.compress(TEXT), "deflate"),
    Case("deflate, raw", raw_deflate(TEXT), "deflate", chunked=True),
    Case("identity", TEXT, "identity"),
]


@pytest.mark.parametrize("case", READ, ids=lambda c: c.name)
async def test_a_body_is_read_whole_and_decoded(case: Case) -> None:
    headers = {"Content-Encoding": case.encoding} if case.encoding else {}
    async with reading() as (reader, session, url):
        status, answer = await post(session, url, chunked(case.data) if case.chunked else case.data, headers)
        assert (status, answer) == (200, {"bytes": len(TEXT), "same": True})
        assert reader.held_bytes == [len(TEXT)]  # the decoded bytes, under the lease
        assert reader.budget.held_bytes == 0


async def test_an_empty_body_is_empty() -> None:
    async with reading() as (reader, session, url):
        status, answer = await post(session, url, b"", {})
    assert (status, answer["bytes"], reader.held_bytes) == (200, 0, [0])


@dataclass(frozen=True)
class TooLargeCase:
    name: str
    data: bytes
    encoding: str | None
    chunked: bool
    message: str


ZEROS = b"\0" * (16 * 1024 * 1024)
TOO_LARGE = [
    TooLargeCase("declared Content-Length over the limit", b"x" * (MAX_BODY_BYTES + 1), None, False,
                 "request body is 65,537 bytes; the limit (server.max_body_bytes) is 65,536"),
    TooLargeCase("chunked, over the limit once counted", b"x" * (MAX_BODY_BYTES + 1), None, True,
                 "request body is over 65,536 bytes, the limit (server.max_body_bytes)"),
    TooLargeCase("a gzip bomb", gzip.compress(ZEROS), "gzip", False,
                 "request body decodes (gzip) to over 65,536 bytes, the limit (server.max_body_bytes)"),
    TooLargeCase("a deflate bomb, chunked", zlib.compress(ZEROS), "deflate", True,
                 "request body decodes (deflate) to over 65,536 bytes"),
]


@pytest.mark.parametrize("case", TOO_LARGE, ids=lambda c: c.name)
async def test_a_body_over_the_limit_is_refused_holding_at_most_the_limit(case: TooLargeCase) -> None:
    assert len(case.data) < 1024 * 1024  # bombs are small on the wire
    headers = {"Content-Encoding": case.encoding} if case.encoding else {}
    async with reading() as (reader, session, url):
        status, answer = await post(session, url, chunked(case.data) if case.chunked else case.data, headers)
        assert (status, answer["code"]) == (413, "payload_too_large")
        assert case.message in answer["message"]
        assert reader.held_bytes[0] <= MAX_BODY_BYTES
        assert reader.budget.held_bytes == 0


async def test_a_body_exactly_at_the_limit_is_read() -> None:
    async with reading() as (reader, session, url):
        status, answer = await post(session, url, chunked(b"x" * MAX_BODY_BYTES), {})
    assert (status, answer["bytes"], reader.held_bytes) == (200, MAX_BODY_BYTES, [MAX_BODY_BYTES])


@pytest.mark.parametrize(("encoding", "data", "status", "words"), [
    ("br", TEXT, 415, "Content-Encoding 'br'"),
    ("gzip, deflate", TEXT, 415, "gzip or deflate (one of them)"),
    ("gzip", b"this is not gzip", 400, "is not valid gzip data"),
    ("gzip", gzip.compress(TEXT)[:-20], 400, "truncated"),
], ids=["unsupported", "two codings", "not gzip", "truncated gzip"])
async def test_a_body_kvgate_can_not_decode_is_refused(encoding: str, data: bytes, status: int, words: str) -> None:
    async with reading() as (reader, session, url):
        answered, answer = await post(session, url, data, {"Content-Encoding": encoding})
        assert answered == status and words in answer["message"], answer
        assert reader.budget.held_bytes == 0


# --- the lease ------------------------------------------------------------------------------------------------------


async def test_the_lease_holds_the_body_while_the_handler_runs_and_gives_it_back_after() -> None:
    budget = BodyBudget(BUDGET_BYTES, wait_s=0.0)
    async with reading(budget) as (reader, session, url):
        reader.gate = asyncio.Event()
        answering = asyncio.create_task(post(session, url, gzip.compress(TEXT), {"Content-Encoding": "gzip"}))
        await until(lambda: budget.held_bytes == len(TEXT))
        assert not answering.done()
        reader.gate.set()
        status, _ = await asyncio.wait_for(answering, timeout=5)
        assert status == 200
        await until(lambda: budget.held_bytes == 0)


async def test_a_body_that_does_not_fit_beside_the_others_is_server_busy() -> None:
    budget = BodyBudget(len(TEXT) + 100, wait_s=0.0)
    other = budget.lease()
    await other.take(200)  # another request holds 200 bytes
    async with reading(budget) as (reader, session, url):
        status, answer = await post(session, url, TEXT, {})
        assert (status, answer["code"]) == (503, "server_busy")
        assert "server.max_held_body_bytes" in answer["message"] and reader.held_bytes == [0]
        other.release()
        status, answer = await post(session, url, TEXT, {})
        assert (status, answer["bytes"]) == (200, len(TEXT))
    assert budget.held_bytes == 0


async def test_a_body_larger_than_the_whole_budget_is_too_large() -> None:
    budget = BodyBudget(1000, wait_s=0.0)
    async with reading(budget) as (_, session, url):
        status, answer = await post(session, url, TEXT, {})
    assert (status, answer["code"]) == (413, "payload_too_large")
    assert "all kvgate holds for all requests together (server.max_held_body_bytes)" in answer["message"]


# --- a body that came whole with its headers (read without awaiting) or in pieces ------------------------------------


async def _raw(url: str, pieces: list[bytes]) -> tuple[int, bytes]:
    """Send ``pieces`` on one connection, each in a write of its own, 50 ms apart; the status and the body."""
    host, port = url.removeprefix("http://").split("/")[0].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        for index, piece in enumerate(pieces):
            if index:
                await asyncio.sleep(0.05)
            writer.write(piece)
            await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout=5)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def _head(extra: str) -> bytes:
    return f"POST /read HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}\r\n".encode()


OVER = b"x" * (MAX_BODY_BYTES + 1)
CHUNKED = "Transfer-Encoding: chunked\r\n"
WHOLE_OR_IN_PIECES = [
    ("Content-Length, in the headers' write", [_head(f"Content-Length: {len(TEXT)}\r\n") + TEXT], 200),
    ("Content-Length, in three writes", [_head(f"Content-Length: {len(TEXT)}\r\n"), TEXT[:10], TEXT[10:]], 200),
    ("chunked, in the headers' write", [_head(CHUNKED) + b"%x\r\n%s\r\n0\r\n\r\n" % (len(TEXT), TEXT)], 200),
    ("chunked over the limit, in the headers' write",
     [_head(CHUNKED) + b"%x\r\n%s\r\n0\r\n\r\n" % (len(OVER), OVER)], 413),
    ("chunked over the limit, in two writes", [_head(CHUNKED) + b"%x\r\n" % len(OVER), OVER + b"\r\n0\r\n\r\n"], 413),
]


@pytest.mark.parametrize(("pieces", "status"), [(p, s) for _, p, s in WHOLE_OR_IN_PIECES],
                         ids=[name for name, _, _ in WHOLE_OR_IN_PIECES])
async def test_a_body_reads_the_same_whether_it_came_with_its_headers_or_in_pieces(pieces: list[bytes],
                                                                                   status: int) -> None:
    async with reading() as (reader, _, url):
        answered, body = await _raw(url, pieces)
        print(f"{len(pieces)} writes: {answered} {body[:100]!r}; held {reader.held_bytes}")
        assert answered == status
        if status == 200:
            assert orjson.loads(body) == {"bytes": len(TEXT), "same": True} and reader.held_bytes == [len(TEXT)]
        else:
            assert b"the limit (server.max_body_bytes)" in body and reader.held_bytes[0] <= MAX_BODY_BYTES
        await until(lambda: reader.budget.held_bytes == 0)
