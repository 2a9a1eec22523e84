"""Logs cannot be forged, and malformed requests are one quiet line (issue 10, points 4 and 6).

A real ``kvgate serve`` process, in text and in JSON log format, in front of a fake Ollama, gets requests whose model
names, X-Request-ID, paths, header values and bodies carry newlines, CR LF, ANSI escapes, U+2028, NUL, DEL, C1 codes
and non-UTF-8 bytes, and requests aiohttp can't parse (a bad request line, a bad header, a broken chunked body).
Its whole stderr must be records of exactly one line each (JSON lines parse), with no raw control byte, no forged
record, no traceback, and one WARNING line per malformed request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import sys

import pytest
from aiohttp.http_exceptions import BadHttpMessage

from gateway.observability.logs import (
    TRACEBACK_INDENT,
    JsonFormatter,
    TextFormatter,
    escape,
    quiet_malformed_requests,
)
from gateway.support.safe_text import sanitize
from tests.support.fake_backend import FakeLLM, running

FORGED = "FORGED 2026-01-01 00:00:00,000 ERROR [x] gateway.proxy: pwned"
NASTIES = ("\n", "\r\n", "\x1b[31m", "\u2028", "\u2029", "\x00", "\x7f", "\x85", "\u202e", "\x9b")
TEXT_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) \[[^\]]*\] \S+: ")
RAW_CONTROL = re.compile(rb"[\x00-\x09\x0b-\x1f\x7f]|\xc2[\x80-\x9f]|\xe2\x80[\xa8-\xae]|\xe2\x81[\xa6-\xa9]")


def _json_body(model: str, content: str = "hi") -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": content}], "stream": False}).encode()


def _http(method: str, target: bytes, body: bytes = b"", headers: bytes = b"") -> bytes:
    return (method.encode() + b" " + target + b" HTTP/1.1\r\nHost: kvgate\r\nConnection: close\r\n" + headers
            + b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def hostile_requests() -> list[bytes]:
    requests = []
    for nasty in NASTIES:
        wrapped = f"llama3.1:8b{nasty}{FORGED}{nasty}"
        requests.append(_http("POST", b"/api/chat", _json_body(wrapped)))
        requests.append(_http("POST", b"/v1/chat/completions", _json_body(wrapped, content=wrapped)))
        requests.append(_http("GET", f"/kvgate/fit?model={wrapped}".encode("utf-8", "surrogatepass")
                              .replace(b"\n", b"%0A").replace(b"\r", b"%0D").replace(b" ", b"%20")))
        encoded = "".join(f"%{b:02X}" for b in nasty.encode("utf-8", "surrogatepass"))
        requests.append(_http("POST", f"/api/chat{encoded}{FORGED.replace(' ', '%20')}".encode(), _json_body("m")))
        requests.append(_http("POST", f"/api/show{encoded}".encode(), _json_body("m")))
        safe = nasty.encode("utf-8").replace(b"\r", b"").replace(b"\n", b"")  # a raw CR or LF ends a header line
        requests.append(_http("POST", b"/api/chat", _json_body("llama3.1:8b"),
                              b"X-Request-ID: id" + safe + b"-" + FORGED.encode() + b"\r\n"
                              + b"User-Agent: ua" + safe + b"\r\nX-Api-Key: k" + safe + b"\r\n"))
    non_utf8 = b'{"model": "llama3.1:8b\xff\xfe\n' + FORGED.encode() + b'", "messages": [], "stream": false}'
    requests.append(_http("POST", b"/api/chat", non_utf8))
    requests.append(_http("POST", b"/api/generate", b'{"model": "x\\u001b[31m\\ud83d\\n' + FORGED.encode() + b'"}'))
    requests.append(_http("POST", b"/api/chat", _json_body("llama3.1:8b"), b"X-Request-ID: \xff\xfe\x1b[2J\r\n"))
    requests.append(_http("POST", b"/api/chat\xff\x1b[31m", _json_body("m")))
    return requests


MALFORMED = [
    b"GARBAGE\x1b[31m /x HTTP/1.1\r\n\r\n",  # a bad request line (the first of its connection)
    b"GET /api/tags HTTP/1.1\r\nHost: k\r\n\r\nGE\x00T / HTTP/1.1\r\n\r\n",  # a bad request line after a good one
    b"GET /api/tags HTTP/1.1\r\nHost: k\r\nBad Header\x1b[31m: v\r\n\r\n",  # a bad header name
    b"POST /api/chat HTTP/1.1\r\nHost: k\r\nTransfer-Encoding: chunked\r\n\r\nzz\x1b[31m\r\n\r\n",  # broken chunks
    b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: k\r\n\r\n",  # a request line too long
]


async def _send(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout=10)
    except ConnectionError:
        return b""
    finally:
        writer.close()


async def _kvgate_log(log_format: str, backend_url: str) -> tuple[bytes, list[bytes]]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "KVGATE_SERVER__LOG_FORMAT": log_format,
           "KVGATE_COUNTING__CACHE_DIR": os.environ.get("TMPDIR", "/tmp") + "/kvgate-log-forging-cache"}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--port", "0", "--backend", f"ollama={backend_url}",
        stderr=asyncio.subprocess.PIPE, env=env,
    )
    assert process.stderr is not None
    try:
        first = await asyncio.wait_for(process.stderr.readline(), timeout=20)
        match = re.search(rb"listening on http://127\.0\.0\.1:(\d+)", first)
        assert match, first
        port = int(match.group(1))
        replies = [await _send(port, request) for request in hostile_requests()]
        replies += [await _send(port, request) for request in MALFORMED]
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), timeout=10) == 0
        return first + await process.stderr.read(), replies
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_client_strings_never_forge_a_log_line(log_format: str) -> None:
    async with running(FakeLLM()) as fake:
        log, replies = await _kvgate_log(log_format, fake.url)
    assert sum(reply.startswith(b"HTTP/1.1 ") for reply in replies) > len(replies) // 2  # most reach kvgate itself
    assert not RAW_CONTROL.search(log), RAW_CONTROL.search(log)
    lines = log.decode("utf-8").split("\n")
    assert lines[-1] == ""
    lines = lines[:-1]
    if log_format == "json":
        records = [json.loads(line) for line in lines]
        assert all({"ts", "level", "msg"} <= record.keys() for record in records)
        levels = [record["level"] for record in records]
        messages = [record["msg"] for record in records]
        assert not any("exc" in record for record in records)
    else:
        assert all(TEXT_RECORD.match(line) for line in lines), [line for line in lines if not TEXT_RECORD.match(line)]
        levels = [TEXT_RECORD.match(line).group(1).lower() for line in lines]  # type: ignore[union-attr]
        messages = lines
    assert "Traceback" not in log.decode()
    errors = [m for m, level in zip(messages, levels, strict=True) if level in ("error", "critical")]
    assert not errors
    malformed = [m for m, level in zip(messages, levels, strict=True) if "malformed request" in m]
    assert len(malformed) >= len(MALFORMED) - 1 and all(
        level == "warning" for m, level in zip(messages, levels, strict=True) if "malformed request" in m)
    forged_in = [line for line in lines if "pwned" in line]
    assert forged_in, "the hostile strings reached no log line: the test tests nothing"
    print(f"\n{log_format}: {len(lines)} log lines, {len(forged_in)} carry an escaped hostile string, "
          f"{len(malformed)} malformed-request warnings; e.g.\n  {forged_in[0][:300]}\n  {malformed[0][:300]}")


def _record(msg: str, *args: object, exc: BaseException | None = None, **extra: object) -> logging.LogRecord:
    record = logging.makeLogRecord({"name": "gateway.proxy", "levelno": logging.ERROR, "levelname": "ERROR",
                                    "msg": msg, "args": args, **extra})
    if exc is not None:
        record.exc_info = (type(exc), exc, exc.__traceback__)
    return record


def test_formatters_escape_message_and_extras_and_indent_kvgate_tracebacks() -> None:
    hostile = "m\n" + FORGED + "\r\x1b[31m\u2028\x00\x7f\x85\udcff"
    try:
        raise ValueError("bad model " + hostile)
    except ValueError as exc:
        error = exc
    record = _record("model %s", hostile, exc=error, request_id="id\n" + FORGED, model=hostile,
                     detail={"k\n": [hostile, 1, None]}, raw=b"\xff\n")
    text = TextFormatter().format(record)
    head, *trace = text.split("\n")
    assert TEXT_RECORD.match(head) and "m\\n" + FORGED + "\\r\\x1b[31m\\u2028\\x00\\x7f\\x85\\udcff" in head
    assert trace[0] == TRACEBACK_INDENT + "Traceback (most recent call last):"
    # a newline in an exception's message splits the traceback's last line, but every line of it stays indented
    assert all(line.startswith(TRACEBACK_INDENT) for line in trace) and trace[-1].startswith(TRACEBACK_INDENT + FORGED)
    entry = json.loads(JsonFormatter().format(record))
    assert "\n" not in JsonFormatter().format(record)
    assert entry["msg"] == "model " + escape(hostile) and entry["model"] == escape(hostile)
    assert entry["detail"] == {"k\\n": [escape(hostile), 1, None]} and entry["raw"] == "\\xff\\n"
    assert entry["exc"].startswith("Traceback") and entry["exc"].count("\n") == len(trace) - 1
    assert not RAW_CONTROL.search(text.replace("\n", "").encode("utf-8", "backslashreplace"))
    assert sanitize("a\nb\x1b") == "a?b?"


def test_a_handler_bug_stays_an_error_with_its_traceback() -> None:
    """Only requests aiohttp could not parse are quietened; a 500 from kvgate's own code keeps ERROR and traceback."""
    quiet_malformed_requests()
    server = logging.getLogger("aiohttp.server")
    root = logging.getLogger()
    saved_level = root.level
    root.setLevel(logging.INFO)  # whatever level an earlier test left: the filter follows the root's
    try:
        _check_handler_bug_and_malformed(server)
    finally:
        root.setLevel(saved_level)


def _check_handler_bug_and_malformed(server: logging.Logger) -> None:
    try:
        raise RuntimeError("kvgate bug")
    except RuntimeError as exc:
        bug = _record("Error handling request from %s", "127.0.0.1", exc=exc)
    bad = _record("Error handling request from %s", "127.0.0.1", exc=BadHttpMessage("Invalid header\n\n  b'x'\n   ^"))
    assert server.filter(bug) and bug.levelno == logging.ERROR and bug.exc_info is not None
    assert server.filter(bad) and bad.levelno == logging.WARNING and bad.exc_info is None
    assert bad.getMessage() == "malformed request from 127.0.0.1: HTTP 400, BadHttpMessage: Invalid header b'x'"
