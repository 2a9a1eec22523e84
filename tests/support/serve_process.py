"""Run ``kvgate serve`` as a child process for a test: its listening URL, its log read line by line."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.child_env import child_env

LINE_WAIT_S = 20.0
EXIT_WAIT_S = 10.0


@dataclass
class ServeProcess:
    """A running ``kvgate serve``: the process, the URL it listens on once it has said so."""

    process: asyncio.subprocess.Process
    stderr: asyncio.StreamReader
    url: str = ""

    async def line_with(self, text: str) -> str:
        """The next line of its log that holds ``text``; fails if it exits first."""
        while True:
            line = (await asyncio.wait_for(self.stderr.readline(), timeout=LINE_WAIT_S)).decode()
            assert line, f"kvgate exited before logging {text!r}"
            if text in line:
                return line

    async def stop(self) -> None:
        """SIGTERM, and it exits cleanly (status 0)."""
        self.process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(self.process.wait(), timeout=EXIT_WAIT_S) == 0


@asynccontextmanager
async def serve_process(*args: str, env: dict[str, str] | None = None) -> AsyncIterator[ServeProcess]:
    """``kvgate serve --port 0 ARGS`` just started (``env`` beside a bare PATH and the run's tokenizer cache, which
    ``env`` may replace: tests/support/child_env.py), its log piped; killed on the way out if it still runs."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--port", "0", *args,
        stderr=asyncio.subprocess.PIPE, env=child_env(env),
    )
    assert process.stderr is not None
    try:
        yield ServeProcess(process, process.stderr)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def listening(served: ServeProcess) -> str:
    """The URL it listens on, once it logs it (kept in ``served.url``)."""
    match = re.search(r"listening on (http://127\.0\.0\.1:\d+)", await served.line_with("listening on"))
    assert match
    served.url = match.group(1)
    return served.url


@asynccontextmanager
async def serving_config(config: Path) -> AsyncIterator[ServeProcess]:
    """``kvgate serve --port 0 --config CONFIG``, once it logs where it listens."""
    async with serve_process("--config", str(config)) as served:
        await listening(served)
        yield served
