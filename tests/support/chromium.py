"""Headless Chromium for the status page's test, driven over the DevTools protocol with aiohttp's websocket client.

No browser driver package: Chromium (Debian's ``chromium``, installed by ``scripts/_env.sh``) runs with
``--remote-debugging-port=0`` and writes the port it chose to ``DevToolsActivePort`` in its profile directory; the
test talks to its first page over ``/json/list``'s websocket. ``evaluate`` runs JavaScript in the page and returns
its value; ``screenshot`` writes a PNG.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from tests.support.poll import until

BINARIES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
    "--no-default-browser-check", "--disable-extensions", "--disable-background-networking", "--disable-sync",
    "--disable-component-update", "--mute-audio", "--hide-scrollbars", "--remote-debugging-port=0",
)


def find_chromium() -> str | None:
    """The first Chromium on PATH (``$KVGATE_CHROMIUM`` names another), or None."""
    named = os.environ.get("KVGATE_CHROMIUM")
    if named:
        return shutil.which(named)
    return next((path for path in map(shutil.which, BINARIES) if path), None)


class CdpError(Exception):
    """Raised when the browser answers a DevTools call with an error, or the page's JavaScript throws."""


class Page:
    """One browser page: DevTools calls by id; events are ignored."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for message in self._ws:
            if message.type is not aiohttp.WSMsgType.TEXT:
                break
            reply = message.json()
            future = self._waiting.pop(reply.get("id", -1), None)
            if future is not None and not future.done():
                future.set_result(reply)
        for future in self._waiting.values():
            future.set_exception(CdpError("the browser closed the DevTools connection"))

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self._ids)
        future = self._waiting[call_id] = asyncio.get_running_loop().create_future()
        await self._ws.send_json({"id": call_id, "method": method, "params": params})
        reply = await asyncio.wait_for(future, 15.0)
        if "error" in reply:
            raise CdpError(f"{method}: {reply['error']}")
        result: dict[str, Any] = reply["result"]
        return result

    async def evaluate(self, expression: str) -> Any:
        """The value of ``expression`` in the page (a promise is awaited), as JSON."""
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise CdpError(details.get("exception", {}).get("description") or details.get("text"))
        return result["result"].get("value")

    async def navigate(self, url: str) -> None:
        await self.call("Page.navigate", url=url)

    async def screenshot(self, path: Path) -> Path:
        """The whole page as a PNG."""
        shot = await self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        return _write(path, base64.b64decode(shot["data"]))

    async def close(self) -> None:
        await self._ws.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


@contextlib.asynccontextmanager
async def headless_chromium(binary: str, *, width: int = 1280, height: int = 900) -> AsyncIterator[Page]:
    """A fresh headless Chromium (its own throwaway profile) and its one page, at ``width`` x ``height``."""
    with tempfile.TemporaryDirectory(prefix="kvgate-chromium-") as profile:
        process = await asyncio.create_subprocess_exec(
            binary, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank",
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,  # its helper processes are one group, ended together below
        )
        try:
            port = await until(lambda: _devtools_port(profile), timeout_s=20.0)
            async with aiohttp.ClientSession() as http:
                async def first_page() -> str | None:
                    async with http.get(f"http://127.0.0.1:{port}/json/list") as response:
                        targets = await response.json()
                    return next((t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page"), None)

                ws_url = await until(first_page, timeout_s=10.0, interval_s=0.05)
                assert ws_url is not None
                async with http.ws_connect(ws_url, max_msg_size=0) as ws:
                    page = Page(ws)
                    await page.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                                    deviceScaleFactor=1, mobile=False)
                    try:
                        yield page
                    finally:
                        await page.close()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 5.0)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()


def _devtools_port(profile: str) -> int | None:
    """The port Chromium listens on for DevTools, once it has written it (first line of DevToolsActivePort)."""
    try:
        lines = Path(profile, "DevToolsActivePort").read_text().splitlines()
    except FileNotFoundError:
        return None
    return int(lines[0]) if len(lines) >= 2 else None


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path
