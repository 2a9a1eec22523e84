"""``kvgate serve`` as a user runs it: a real process, flags, a health check, a clean stop on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.support.fake_backend import FakeLLM, running
from tests.support.poll import until
from tests.support.serve_process import serve_process


async def test_serve_starts_proxies_and_stops_on_sigterm() -> None:
    async with running(FakeLLM()) as fake, serve_process("--backend", f"ollama={fake.url}") as served:
        process, stderr = served.process, served.stderr
        line = (await asyncio.wait_for(stderr.readline(), timeout=20)).decode()
        match = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        assert match, line
        url = match.group(1)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/kvgate/health") as response:
                assert (await response.json())["status"] == "ok"
            async with http.get(f"{url}/api/tags") as response:
                assert len((await response.json())["models"]) == 2
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), timeout=10) == 0
        rest = (await stderr.read()).decode()
        assert "GET /api/tags 200" in rest and "shutting down" in rest
        assert "keyless requests are uncapped: no tenant has an API key" in rest  # said once, at start-up


def _imports_under_way(pid: int) -> bool:
    """Whether the process maps a module from site-packages: kvgate's own imports have begun (pydantic,
    aiohttp, ...), the 0.3 s in which a SIGHUP used to kill it. Before this the interpreter is still starting (a
    SIGHUP then, before any of kvgate's code runs, still has its default action: nothing in a process can help it)."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()  # procfs: never blocks
    except OSError:  # it ended already
        return True
    return "site-packages/" in maps or "dist-packages/" in maps


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc to see the imports begin")
@pytest.mark.parametrize("hangups", ["once, as the imports begin", "every 10 ms until it listens"])
async def test_a_sighup_during_start_up_does_not_kill_serve(hangups: str) -> None:
    """The attack: SIGHUP (a config-management tool's "reload", a closed terminal) in the first 0.3 s of
    ``kvgate serve``, before it set its handler, killed it. It must keep starting, serve, and apply the reload it
    was asked for once it is ready."""
    async with running(FakeLLM()) as fake, serve_process("--backend", f"ollama={fake.url}") as served:
        process, stderr = served.process, served.stderr
        await until(functools.partial(_imports_under_way, process.pid), timeout_s=20, interval_s=0.001)
        process.send_signal(signal.SIGHUP)
        first = asyncio.ensure_future(stderr.readline())
        sent = 1
        while hangups.startswith("every") and not first.done() and process.returncode is None:
            await asyncio.sleep(0.01)  # the hang-ups' rate: one every 10 ms is the attack
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGHUP)
                sent += 1
        lines = [(await asyncio.wait_for(first, timeout=20)).decode()]
        while lines[-1] and "listening on" not in lines[-1]:  # a reload asked for meanwhile may come first
            lines.append((await asyncio.wait_for(stderr.readline(), timeout=20)).decode())
        if not lines[-1]:  # its stderr closed: it ended
            await asyncio.wait_for(process.wait(), timeout=10)
        assert process.returncode is None, f"killed by a SIGHUP during start-up ({process.returncode})"
        match = re.search(r"listening on (http://127\.0\.0\.1:\d+)", lines[-1])
        assert match, lines
        async with aiohttp.ClientSession() as http, http.get(f"{match.group(1)}/kvgate/health") as response:
            assert response.status == 200
        while lines[-1] and not any("configuration reloaded (SIGHUP)" in line for line in lines):
            lines.append((await asyncio.wait_for(stderr.readline(), timeout=10)).decode())
        assert "configuration reloaded (SIGHUP)" in "".join(lines), lines  # the pending hang-up, once ready
        print(f"\n  {hangups}: {sent} SIGHUP(s) during start-up; served, and reloaded once ready")
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), timeout=10) == 0


async def test_other_commands_still_end_on_sighup() -> None:
    """Only serve reloads; for every other command the early handler gives SIGHUP back its default, delivering one
    that came meanwhile (here: before the command line was even read)."""
    code = ("import os, signal, sys, time\nfrom gateway.cli import hangups\nhangups.install()\n"
            "os.kill(os.getpid(), signal.SIGHUP)\nassert hangups._state['pending']\n"
            "sys.argv = ['kvgate', 'check', '--config', '/no/such/kvgate.toml']\ntime.sleep(0.05)\nhangups.main()\n"
            "print('not ended')\n")
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.PIPE, env={"PATH": "/usr/bin:/bin"})
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=20)
    assert process.returncode == -signal.SIGHUP, (process.returncode, stdout, stderr)
    assert b"not ended" not in stdout
