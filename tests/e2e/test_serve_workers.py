"""``kvgate serve --workers N`` as a user runs it: real processes on one port, sharing a real Redis ledger; a worker
that dies is restarted, SIGTERM stops them all, a setting that can't work is refused before anything starts."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import aiohttp
import pytest

from gateway.cli.main import EXIT_ADDRESS_IN_USE, EXIT_CONFIG
from tests.support.fake_backend import FakeLLM, running
from tests.support.poll import until
from tests.support.redis_server import RunningRedis, running_redis
from tests.support.serve_process import ServeProcess, serve_process

START_S = 30.0


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RunningRedis]:
    with running_redis() as server:
        yield server


@asynccontextmanager
async def serving_workers(redis: RunningRedis, count: int = 2) -> AsyncIterator[tuple[ServeProcess, list[str]]]:
    """``kvgate serve --workers COUNT`` on a shared ledger, once its supervisor says they all listen; with the lines
    it logged until then."""
    async with running(FakeLLM()) as fake, serve_process(
        "--workers", str(count), "--backend", f"ollama={fake.url}",
        env={"KVGATE_SHARED_LEDGER__REDIS_URL": redis.url, "KVGATE_SHARED_LEDGER__PREFIX": f"w{os.getpid()}"},
    ) as served:
        lines: list[str] = []
        while not lines or "workers listening on" not in lines[-1]:
            lines.append(await served.line_with(""))
        match = re.search(r"workers listening on (http://127\.0\.0\.1:\d+)", lines[-1])
        assert match, lines
        served.url = match.group(1)
        yield served, lines


async def _health(url: str) -> dict[str, int]:
    """The ``worker`` of /kvgate/health, on a new connection (the kernel picks a worker per connection)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http, \
            http.get(f"{url}/kvgate/health") as response:
        assert response.status == 200
        worker: dict[str, int] = (await response.json())["worker"]
        return worker


async def _pids_answering(url: str, want: int) -> set[int]:
    seen: set[int] = set()

    async def enough() -> bool:
        seen.add((await _health(url))["pid"])
        return len(seen) >= want

    await until(enough, timeout_s=10)
    return seen


async def _chat(url: str) -> None:
    body = {"model": "llama3.1:8b", "messages": [{"role": "user", "content": "hi"}], "stream": False}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http, \
            http.post(f"{url}/api/chat", json=body) as response:
        assert response.status == 200, await response.text()
        assert (await response.json())["done"] is True


async def test_two_workers_answer_on_one_port_each_a_replica_of_the_shared_ledger(redis_server: RunningRedis) -> None:
    async with serving_workers(redis_server) as (served, lines):
        pids = await _pids_answering(served.url, 2)
        assert len(pids) == 2 and served.process.pid not in pids
        for _ in range(8):
            await _chat(served.url)  # admitted and released through the shared ledger, by whichever worker
        replicas = {re.search(r"this replica is '(\w+)'", line).group(1)  # type: ignore[union-attr]
                    for line in lines if "this replica is" in line}
        assert len(replicas) == 2, lines  # two workers on one host never share a lease's owner
        served.process.send_signal(signal.SIGHUP)  # the supervisor passes it on: every worker reloads
        await served.line_with("configuration reloaded (SIGHUP)")
        await served.line_with("configuration reloaded (SIGHUP)")
        assert len(await _pids_answering(served.url, 2)) == 2  # a reload is not a restart
        await served.stop()


async def test_a_worker_that_dies_is_restarted_and_the_port_keeps_serving(redis_server: RunningRedis) -> None:
    async with serving_workers(redis_server) as (served, _):
        first = await _pids_answering(served.url, 2)
        victim = min(first)
        os.kill(victim, signal.SIGKILL)
        died = await served.line_with(f"(pid {victim}) exited (killed by SIGKILL)")
        assert "restarting it in 0.5 s" in died
        for _ in range(5):  # the other worker serves meanwhile
            assert (await _health(served.url))["pid"] != victim
        restarted = await served.line_with("restarted (pid")
        new_pid = int(re.search(r"restarted \(pid (\d+)\)", restarted).group(1))  # type: ignore[union-attr]
        assert new_pid not in first
        assert await _pids_answering(served.url, 2) == first - {victim} | {new_pid}
        await _chat(served.url)
        await served.stop()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_sigterm_or_sigint_stops_every_worker_and_exits_0(redis_server: RunningRedis, sig: int) -> None:
    async with serving_workers(redis_server) as (served, _):
        pids = await _pids_answering(served.url, 2)
        served.process.send_signal(sig)  # a terminal's Ctrl-C reaches the supervisor alone: workers have own groups
        assert await asyncio.wait_for(served.process.wait(), timeout=30) == 0
        assert all(_gone(pid) for pid in pids)
        rest = (await served.stderr.read()).decode()
        assert "stopping 2 workers" in rest and rest.count("shutting down") == 2
        assert "restarting" not in rest


async def test_workers_stop_when_their_supervisor_is_killed(redis_server: RunningRedis) -> None:
    """Even SIGKILL, which the supervisor can't pass on: its end of each worker's link closes, and they stop."""
    async with serving_workers(redis_server) as (served, _):
        pids = await _pids_answering(served.url, 2)
        served.process.kill()
        await served.process.wait()
        await until(lambda: all(_gone(pid) for pid in pids), timeout_s=15)


async def _refused(*args: str, env: dict[str, str] | None = None) -> str:
    """Its stderr, once ``kvgate serve ARGS`` exited with the config error's code."""
    async with serve_process(*args, env=env) as served:
        code = await asyncio.wait_for(served.process.wait(), timeout=START_S)
        text = (await served.stderr.read()).decode()
        assert code == EXIT_CONFIG, text
        return text


async def test_workers_without_a_shared_ledger_are_refused_before_any_starts() -> None:
    text = await _refused("--workers", "2", "--backend", "ollama=http://127.0.0.1:9")
    assert "server.workers = 2 needs shared_ledger.redis_url" in text
    assert "listening" not in text and text.count("\n") == 1, text  # one line


@pytest.mark.parametrize(("given", "env"), [
    (["--workers", "0"], None), (["--workers", "65"], None), ([], {"KVGATE_SERVER__WORKERS": "-1"}),
])
async def test_a_worker_count_out_of_range_is_a_config_error(given: list[str], env: dict[str, str] | None) -> None:
    text = await _refused(*given, "--backend", "ollama=http://127.0.0.1:9", env=env)
    refusal = r"setting 'server.workers' = '?-?\d+'? is invalid: Input should be (greater|less) than or equal to"
    assert re.search(refusal, text), text


async def test_local_share_must_count_every_worker(redis_server: RunningRedis) -> None:
    text = await _refused("--workers", "3", "--backend", "ollama=http://127.0.0.1:9", env={
        "KVGATE_SHARED_LEDGER__REDIS_URL": redis_server.url, "KVGATE_SHARED_LEDGER__ON_UNREACHABLE": "local_share",
        "KVGATE_SHARED_LEDGER__REPLICAS": "2"})
    assert "shared_ledger.replicas = 2 is below server.workers = 3" in text


async def test_workers_on_a_port_in_use_exit_with_its_code_before_any_starts(redis_server: RunningRedis) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        async with serve_process("--port", str(port), "--workers", "2", "--backend", "ollama=http://127.0.0.1:9",
                                 env={"KVGATE_SHARED_LEDGER__REDIS_URL": redis_server.url}) as served:
            code = await asyncio.wait_for(served.process.wait(), timeout=START_S)
            text = (await served.stderr.read()).decode()
    assert code == EXIT_ADDRESS_IN_USE, text
    assert f"can't listen on 127.0.0.1:{port}: the port is already in use" in text and "worker" not in text


async def test_one_worker_is_one_process_as_without_the_flag() -> None:
    async with running(FakeLLM()) as fake, serve_process("--workers", "1", "--backend", f"ollama={fake.url}") as served:
        line = await served.line_with("listening on")
        assert "worker" not in line
        url = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line).group(1)  # type: ignore[union-attr]
        async with aiohttp.ClientSession() as http, http.get(f"{url}/kvgate/health") as response:
            assert "worker" not in await response.json()
        await served.stop()
