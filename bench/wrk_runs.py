"""Small non-streamed chats driven by wrk (a C load generator: the client costs next to nothing, so a hop as fast as
nginx can be told from the client's own limit). One run sends the same POST body for ``seconds`` at ``concurrency``;
a hop with several URLs (replicas) gets one wrk per URL at the same time, the connections split between them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

LUA = """wrk.method = "POST"
wrk.body = '{body}'
wrk.headers["Content-Type"] = "application/json"
"""
_UNIT_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0}
TIMEOUT_S = 10
"""wrk's own timeout is 2 s: a slow hop at c=64 (LiteLLM) would count its slowest answers as failures."""


@dataclass(frozen=True)
class WrkResult:
    p50_ms: float
    requests_per_s: float
    failed: int
    """Answers that were not 2xx or 3xx, and socket errors."""


def wrk_binary() -> str | None:
    return shutil.which("wrk")


def parse_wrk(text: str) -> WrkResult:
    """The median latency, the rate and the failures from ``wrk --latency``'s report."""
    median = re.search(r"^\s*50%\s+([\d.]+)(us|ms|s)\s*$", text, re.MULTILINE)
    rate = re.search(r"^Requests/sec:\s+([\d.]+)", text, re.MULTILINE)
    if median is None or rate is None:
        raise ValueError(f"not a wrk --latency report: {text[-300:]!r}")
    failed = sum(int(n) for n in re.findall(r"Non-2xx or 3xx responses:\s+(\d+)", text))
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    if errors is not None:
        failed += sum(int(n) for n in errors.groups())
    return WrkResult(float(median.group(1)) * _UNIT_MS[median.group(2)], float(rate.group(1)), failed)


class Wrk:
    """wrk with one POST body (a temporary Lua script, removed by ``close``)."""

    def __init__(self, binary: str, body: bytes) -> None:
        if b"'" in body or b"\\" in body:
            raise ValueError("the body must not need escaping in a Lua string")
        self._binary = binary
        self._dir = tempfile.TemporaryDirectory()
        self._script = Path(self._dir.name) / "post.lua"
        self._script.write_text(LUA.format(body=body.decode()))

    def close(self) -> None:
        self._dir.cleanup()

    def run(self, urls: list[str], path: str, concurrency: int, seconds: int) -> WrkResult:
        """One run: every URL at once, ``concurrency`` connections split between them (at least one each); the
        rates add up, the median is the first URL's."""
        share = max(1, concurrency // len(urls))
        argv = [self._binary, "-t1", f"-c{share}", f"-d{max(1, seconds)}s", f"--timeout={TIMEOUT_S}s", "--latency",
                "-s", str(self._script)]
        processes = [subprocess.Popen([*argv, url + path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                     for url in urls]
        results = [parse_wrk(process.communicate(timeout=seconds + 30)[0]) for process in processes]
        return WrkResult(results[0].p50_ms, sum(r.requests_per_s for r in results), sum(r.failed for r in results))
