"""Issue 23, point 2: descriptors reserved for the upstream pool. ``kvgate serve`` under a lowered RLIMIT_NOFILE (and
no connection cap to speak of): one tenant's long streams take descriptors until accept() would fail (one runs, the
rest wait in the queue, each holding its client connection); another client still gets an answer (503 with
Retry-After, or 200), never a hang or a reset. Before the reserve, accept() failed with EMFILE, asyncio paused the
listener and retried each second, and the other client got no answer in 5 s."""

from __future__ import annotations

import asyncio
import os
import re
import resource
import signal
import sys
import time
from pathlib import Path

import aiohttp

from gateway.edge.limits import FD_RESERVE, near_fd_limit
from tests.support.child_env import child_env
from tests.support.fake_backend import FakeLLM, running
from tests.support.poll import until

GATEWAY_FILES = 256
STREAMS = 300
"""Long streams: one runs, the others wait in the queue; each holds a descriptor of the gateway's, past its limit."""
CHAT = {"model": "llama3.1:8b", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def _open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _gateway_nofile_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (GATEWAY_FILES, GATEWAY_FILES))


async def _stream(http: aiohttp.ClientSession, url: str, held: list[aiohttp.ClientResponse]) -> int:
    try:
        response = await http.post(f"{url}/api/chat", json=CHAT)
    except (aiohttp.ClientError, TimeoutError):
        return 0
    if response.status == 200:
        held.append(response)  # the stream stays open (the fake holds it after its first chunk)
    else:
        await response.read()
        response.release()
    return response.status


async def _other_client(url: str) -> int | str:
    timeout = aiohttp.ClientTimeout(total=5)
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True), timeout=timeout) as http, \
                http.get(f"{url}/api/tags") as response:
            await response.read()
            return response.status
    except TimeoutError:
        return "no answer in 5 s"
    except aiohttp.ClientError as exc:
        return type(exc).__name__


async def test_long_streams_past_the_file_limit_leave_other_clients_answered(tmp_path: Path) -> None:
    fake = FakeLLM()
    fake.script.hold_after_chunks = 1
    async with running(fake):
        config = tmp_path / "kvgate.toml"
        config.write_text(
            "[server]\nmax_connections = 100000\nmax_connections_per_peer = 100000\n"
            "[admission]\nmax_queue = 100000\nmax_queue_share = 1.0\n"
            f'[[backends]]\nname = "ollama"\nkind = "ollama"\nurl = "{fake.url}"\nparallel = 1\n'
        )
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "serve", "--port", "0", "--config", str(config),
            stderr=asyncio.subprocess.PIPE, env=child_env(), preexec_fn=_gateway_nofile_limit,
        )
        assert process.stderr is not None
        held: list[aiohttp.ClientResponse] = []
        try:
            port = 0
            while not port:
                line = (await asyncio.wait_for(process.stderr.readline(), timeout=20)).decode()
                assert line, "kvgate exited"
                if match := re.search(r"listening on http://127\.0\.0\.1:(\d+)", line):
                    port = int(match.group(1))
            url = f"http://127.0.0.1:{port}"
            connector = aiohttp.TCPConnector(limit=0, force_close=True)
            async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as http:
                streams = [asyncio.create_task(_stream(http, url, held)) for _ in range(STREAMS)]
                # the streams connect (one runs, the others queue) until the descriptors reach the reserve
                await until(lambda: _open_files(process.pid) >= GATEWAY_FILES - FD_RESERVE, timeout_s=15,
                            interval_s=0.05)
                at_most = _open_files(process.pid)
                started = time.monotonic()
                others = [await _other_client(url) for _ in range(3)]
                took_s = time.monotonic() - started
                fake.script.release.set()
                statuses = await asyncio.gather(*streams)
                print(f"\nkvgate under RLIMIT_NOFILE {GATEWAY_FILES}, {STREAMS} long streams (one runs, the rest "
                      f"queue; {at_most} descriptors open): {statuses.count(200)} streamed, others "
                      f"{ {s: statuses.count(s) for s in set(statuses) if s != 200} }; another client: {others} "
                      f"in {took_s:.2f} s")
                assert all(other in (200, 503) for other in others), others
                assert statuses.count(503) > 0 and set(statuses) <= {200, 503}
                for response in held:
                    response.release()
            process.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(process.wait(), timeout=10) == 0
        finally:
            fake.script.release.set()
            if process.returncode is None:
                process.kill()
                await process.wait()


def test_the_reserve_is_measured_from_the_limit() -> None:
    assert not near_fd_limit(GATEWAY_FILES - FD_RESERVE - 1, GATEWAY_FILES)
    assert near_fd_limit(GATEWAY_FILES - FD_RESERVE, GATEWAY_FILES)
    assert not near_fd_limit(10**6, -1)  # no limit
