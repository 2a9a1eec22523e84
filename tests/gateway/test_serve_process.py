"""``kvgate serve`` as a user runs it: a real process, flags, a health check, a clean stop on SIGTERM."""

from __future__ import annotations

import asyncio
import re
import signal
import sys

import aiohttp

from tests.support.fake_backend import FakeLLM, running


async def test_serve_starts_proxies_and_stops_on_sigterm() -> None:
    async with running(FakeLLM()) as fake:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "serve", "--port", "0", "--backend", f"ollama={fake.url}",
            stderr=asyncio.subprocess.PIPE, env={"PATH": "/usr/bin:/bin"},
        )
        assert process.stderr is not None
        try:
            line = (await asyncio.wait_for(process.stderr.readline(), timeout=20)).decode()
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
            rest = (await process.stderr.read()).decode()
            assert "GET /api/tags 200" in rest and "shutting down" in rest
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
