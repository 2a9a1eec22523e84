"""Issue 10, point 2: deadlines on the client side (gateway/edge/serving.py, gateway/streaming.py).

- Slowloris: ``kvgate serve`` in a process limited to 512 open files, 250 connections (past the default cap of
  192) or 500 (past the file limit, without a cap) sending their headers a byte at a time (a client whose SYN the
  full listen backlog drops tries again at once rather than wait a second for the kernel's retransmission, for a
  few seconds at most); with the default connection cap (which
  closes the longest-waiting connection to make room) 20 legitimate requests sent during the attack are all
  answered; with no cap (the header deadline alone) some fail during the attack, and all are answered once the
  deadline has closed the slow connections, which it does within about the header deadline.
- A body that trickles past ``server.body_timeout_s``: 408 in the route's dialect, nothing forwarded or reserved.
- A client that stops reading a long stream: the response ends after ``server.client_write_timeout_s``, the ledger is
  back to zero, and the log and the metric name the client, not the backend.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import re
import resource
import signal
import socket
import sys
import time

import aiohttp
import pytest

from tests.support.child_env import child_env
from tests.support.fake_backend import FakeLLM, Script, running
from tests.support.gateway_server import running_gateway
from tests.support.poll import until

SLOW_CONNECTIONS = {"default cap": 250, "no cap": 500}
"""Slow clients per case: past the default cap (half the gateway's 512 files, less 64: 192), and past the file limit
(500 connections and kvgate's own files)."""
LEGIT_REQUESTS = 20
HEADER_TIMEOUT_S = 0.3
"""The header (and body) deadline every test here runs kvgate with."""
TRICKLE_S = 0.25
"""A slow client's pause between header bytes: several bytes go out before the header deadline, none completes."""
CONNECT_TIMEOUT_S = 0.9
"""A slow client whose connection is not up by then drops the attempt: its SYN was dropped (kvgate's listen backlog
was full, or kvgate's loop or the test's stalled for a moment) and would be sent again only after a second (Linux's
initial retransmission timeout)."""
ATTACK_WINDOW_S = 3.0
"""A slow client that could not connect tries again, as an attacker would, until this long after the attack began;
a moment's stall of either process on a loaded machine then cannot leave the attack at a handful of connections."""
CHAT = {"model": "llama3.1:8b", "messages": [{"role": "user", "content": "hi"}], "stream": False}


GATEWAY_FILES = 512
"""The gateway's RLIMIT_NOFILE in the slowloris test: its default connection cap is half of it less 64 (192)."""


def _gateway_nofile_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (GATEWAY_FILES, GATEWAY_FILES))


def _raise_own_nofile(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed, hard) if hard != resource.RLIM_INFINITY else needed,
                                                    hard))
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        pytest.skip(f"needs {needed} open files in the test process; the hard limit allows {soft}")


class Attack:
    """What the slow clients saw: when each connection opened, how long kvgate held it, and each failed attempt to
    connect (by kind), until every client has connected or its window has passed."""

    def __init__(self, clients: int) -> None:
        self.clients = clients
        self.began = time.monotonic()
        self.opened: list[float] = []
        self.closed_after: list[float] = []
        self.failed_connects: dict[str, int] = {}
        self.gave_up = 0

    def in_place(self) -> bool:
        return len(self.opened) + self.gave_up >= self.clients

    def __str__(self) -> str:
        return (f"{len(self.opened)} of {self.clients} slow clients connected, {self.gave_up} gave up after "
                f"{ATTACK_WINDOW_S:g} s; failed attempts: {self.failed_connects or 'none'}")


async def _connect(port: int, attack: Attack) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    while time.monotonic() - attack.began < ATTACK_WINDOW_S:
        try:
            return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout=CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            kind = type(exc).__name__ if exc.errno is None else errno.errorcode.get(exc.errno, str(exc.errno))
            attack.failed_connects[kind] = attack.failed_connects.get(kind, 0) + 1
            await asyncio.sleep(0.05)  # an attacker's retry, not a tight loop against a full backlog
    attack.gave_up += 1
    return None


async def _slow_client(port: int, attack: Attack, stop: asyncio.Event) -> None:
    """Send a request's headers a byte every ``TRICKLE_S``; note how long the gateway kept the connection."""
    connection = await _connect(port, attack)
    if connection is None:
        return
    reader, writer = connection
    opened, closed_after = attack.opened, attack.closed_after
    start = time.monotonic()
    opened.append(start)
    header = b"GET /kvgate/health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Slow: " + b"a" * 200
    try:
        for byte in header:
            if stop.is_set():
                return
            writer.write(bytes([byte]))
            try:
                data = await asyncio.wait_for(reader.read(1024), timeout=TRICKLE_S)
            except TimeoutError:
                continue
            if not data:
                closed_after.append(time.monotonic() - start)
                return
    except ConnectionError:
        closed_after.append(time.monotonic() - start)
    finally:
        writer.close()


async def _healthy(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.get(f"{url}/kvgate/health") as response:
            return response.status == 200
    except aiohttp.ClientError:
        return False


async def _legit(http: aiohttp.ClientSession, url: str, index: int) -> int | str:
    """The status, or the client's error by name when no answer came (the failure message says which)."""
    try:
        if index % 2:
            async with http.post(f"{url}/api/chat", json=CHAT) as response:
                await response.read()
                return response.status
        async with http.get(f"{url}/api/tags") as response:
            await response.read()
            return response.status
    except aiohttp.ClientError as exc:
        return f"{type(exc).__name__}: {exc}"[:120]


async def _attack_in_place(attack: Attack) -> None:
    """Until every slow client has connected (some wait in the kernel for accept() to resume: no cap, past the file
    limit) or given up after the attack's window."""
    await until(attack.in_place, timeout_s=ATTACK_WINDOW_S + CONNECT_TIMEOUT_S + 5, interval_s=0.02)


async def _drain(stream: asyncio.StreamReader, lines: list[str]) -> None:
    while line := await stream.readline():
        lines.append(line.decode(errors="replace"))


@pytest.mark.parametrize("cap", ["default cap", "no cap"])
async def test_slowloris_past_the_file_limit_leaves_legitimate_requests_answered(cap: str) -> None:
    attackers = SLOW_CONNECTIONS[cap]
    _raise_own_nofile(attackers + 200)
    env = child_env({"KVGATE_SERVER__HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
                     "KVGATE_SERVER__BODY_TIMEOUT_S": str(HEADER_TIMEOUT_S),
                     "KVGATE_SERVER__MAX_CONNECTIONS_PER_PEER": "100000"})  # every client here is 127.0.0.1
    if cap == "no cap":  # the header deadline alone, past the file limit (accept() then fails for a while)
        env["KVGATE_SERVER__MAX_CONNECTIONS"] = "100000"
    async with running(FakeLLM()) as fake:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "serve", "--port", "0", "--backend", f"ollama={fake.url}",
            stderr=asyncio.subprocess.PIPE, env=env, preexec_fn=_gateway_nofile_limit,
        )
        assert process.stderr is not None
        lines: list[str] = []
        drain: asyncio.Task[None] | None = None
        stop = asyncio.Event()
        try:
            port = 0
            while not port:  # the lines before "listening" (warnings, if any) are kept for the log's checks
                line = (await asyncio.wait_for(process.stderr.readline(), timeout=20)).decode()
                assert line, "kvgate exited: " + "".join(lines)
                lines.append(line)
                if match := re.search(r"listening on http://127\.0\.0\.1:(\d+)", line):
                    port = int(match.group(1))
            url = f"http://127.0.0.1:{port}"
            drain = asyncio.create_task(_drain(process.stderr, lines))

            async with aiohttp.ClientSession() as http:  # serving before the attack begins
                await until(lambda: _healthy(http, url), timeout_s=10, interval_s=0.05)
            attack = Attack(attackers)
            slow = [asyncio.create_task(_slow_client(port, attack, stop)) for _ in range(attackers)]
            await _attack_in_place(attack)  # open (or queued) and trickling
            opened, closed_after = attack.opened, attack.closed_after
            started = time.monotonic()
            connector = aiohttp.TCPConnector(force_close=True, limit=0)
            async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as http:
                statuses = await asyncio.gather(*(_legit(http, url, i) for i in range(LEGIT_REQUESTS)))
            took_s = time.monotonic() - started
            answered = statuses.count(200)
            await asyncio.wait_for(asyncio.gather(*slow), timeout=HEADER_TIMEOUT_S + 15)
            longest_s = max(closed_after, default=0.0)
            print(f"\nslowloris ({cap}, gateway RLIMIT_NOFILE {GATEWAY_FILES}, header_timeout_s {HEADER_TIMEOUT_S:g}): "
                  f"{answered}/{LEGIT_REQUESTS} legitimate requests answered 200 in {took_s:.2f} s; "
                  f"{len(opened)} slow connections opened, {len(closed_after)} closed by kvgate, "
                  f"the longest held {longest_s:.2f} s; {attack}")
            assert len(closed_after) == len(opened) >= attackers // 2, attack
            assert longest_s < HEADER_TIMEOUT_S + 3
            if cap == "no cap":
                # Past the file limit, requests during the attack can fail (no descriptor for the upstream
                # connection: 502); the header deadline ends the attack's hold, and everything is answered after it.
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True, limit=0)) as http:
                    statuses = await asyncio.gather(*(_legit(http, url, i) for i in range(LEGIT_REQUESTS)))
                print(f"after the header deadline: {statuses.count(200)}/{LEGIT_REQUESTS} answered 200")
            assert statuses.count(200) == LEGIT_REQUESTS, (statuses, "kvgate's last log lines:", lines[-15:])
            assert took_s < HEADER_TIMEOUT_S + 10
            async with aiohttp.ClientSession() as http, http.get(f"{url}/kvgate/metrics") as response:
                metrics = await response.text()
            assert re.search(r'kvgate_client_closes_total\{reason="(header_timeout|evicted)"\} [1-9]', metrics)
            process.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(process.wait(), timeout=10) == 0
            await asyncio.wait_for(drain, timeout=5)
            log = "".join(lines)
            assert "closed a client connection" in log
            assert "Traceback" not in log
            assert sum("closed" in line and "client connection" in line for line in lines) <= 3  # rate-limited
        finally:
            stop.set()
            if process.returncode is None:
                process.kill()
                await process.wait()
            if drain is not None:
                drain.cancel()


async def _raw_exchange(port: int, head: bytes, trickle: bytes, every_s: float) -> tuple[bytes, float]:
    """Send ``head`` then ``trickle`` a byte every ``every_s``; what came back and when the connection closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.monotonic()
    writer.write(head)
    received = b""

    async def read_all() -> None:
        nonlocal received
        while data := await reader.read(65536):
            received += data

    reading = asyncio.create_task(read_all())
    try:
        for byte in trickle:
            if reading.done():
                break
            writer.write(bytes([byte]))
            await asyncio.sleep(every_s)  # the slow client itself: one byte every every_s
        await asyncio.wait_for(reading, timeout=10)
    except ConnectionError:
        pass
    finally:
        writer.close()
    return received, time.monotonic() - start


async def _reserved_tokens(url: str) -> int:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/kvgate/status") as response:
        status = await response.json()
    return sum(int(pool["reserved_tokens"]) for pool in status["pools"])


async def test_a_body_trickling_past_body_timeout_gets_408_and_reserves_nothing() -> None:
    async with running(FakeLLM()) as fake, running_gateway(
        [{"name": "ollama", "kind": "ollama", "url": fake.url}],
        server={"body_timeout_s": 0.5, "header_timeout_s": 5},
    ) as url:
        port = int(url.rsplit(":", 1)[1])
        body = json.dumps(CHAT).encode()
        head = (b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body))
        received, took_s = await _raw_exchange(port, head, body, every_s=0.05)
        status_line, _, rest = received.partition(b"\r\n")
        assert status_line.startswith(b"HTTP/1.1 408"), received[:300]
        payload = json.loads(rest.partition(b"\r\n\r\n")[2])
        assert "server.body_timeout_s" in payload["error"]  # Ollama's dialect: {"error": "..."}
        assert took_s < 3  # answered at the deadline and the connection closed, not held for the trickle
        assert not any(seen.path_qs == "/api/chat" for seen in fake.seen)
        assert await _reserved_tokens(url) == 0

        # A body that arrives in time is served as before.
        async with aiohttp.ClientSession() as http, http.post(f"{url}/api/chat", json=CHAT) as response:
            assert response.status == 200


async def test_headers_trickling_past_header_timeout_close_the_connection() -> None:
    async with running(FakeLLM()) as fake, running_gateway(
        [{"name": "ollama", "kind": "ollama", "url": fake.url}], server={"header_timeout_s": HEADER_TIMEOUT_S},
    ) as url:
        port = int(url.rsplit(":", 1)[1])
        received, took_s = await _raw_exchange(port, b"GET /api/tags HTTP/1.1\r\n", b"Host: 127.0.0.1\r\n" * 10,
                                               every_s=0.1)
        assert received == b"" and took_s < 2
        # a keep-alive connection: the second request's headers get their own deadline
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /kvgate/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        await asyncio.sleep(3 * HEADER_TIMEOUT_S)  # idle 3x the header deadline: keep-alive is not headers
        writer.write(b"GET /kvgate/health HTTP/1.1\r\n")
        start = time.monotonic()
        rest = await asyncio.wait_for(reader.read(), timeout=5)  # body of the first answer, then EOF
        assert b"HTTP/1.1" not in rest and time.monotonic() - start < 1.5
        writer.close()


async def test_a_client_that_stops_reading_is_cut_off_as_the_clients_fault(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    fake = FakeLLM(Script(chunks=150_000))
    async with running(fake), running_gateway(
        [{"name": "ollama", "kind": "ollama", "url": fake.url}], server={"client_write_timeout_s": 0.5},
    ) as url:
        port = int(url.rsplit(":", 1)[1])
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock)
        body = json.dumps({**CHAT, "stream": True}).encode()
        writer.write(b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        transport = writer.transport
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()  # the client stops reading
        start = time.monotonic()

        async def reservation_held() -> bool:  # while the stream is being written
            return await _reserved_tokens(url) > 0

        async def reservation_released() -> bool:  # once the write deadline passes
            return await _reserved_tokens(url) == 0

        await until(reservation_held, timeout_s=5, interval_s=0.05)
        await until(reservation_released, timeout_s=20, interval_s=0.1)
        released_after_s = time.monotonic() - start
        print(f"\na client that stopped reading: response ended, reservation released after {released_after_s:.2f} s")
        assert await _reserved_tokens(url) == 0
        assert released_after_s < 15
        transport.resume_reading()
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            while await asyncio.wait_for(reader.read(1 << 20), timeout=10):
                pass
            raise ConnectionResetError  # an orderly EOF also ends it: the stream was cut short either way
        writer.close()
        async with aiohttp.ClientSession() as http, http.get(f"{url}/kvgate/metrics") as response:
            metrics = await response.text()
        assert 'kvgate_client_closes_total{reason="client_write_timeout"} 1.0' in metrics
        messages = [record.getMessage() for record in caplog.records]
        assert any("client stopped reading" in m and "server.client_write_timeout_s" in m for m in messages)
        assert not any("stalled" in m or "ended early" in m for m in messages), messages
