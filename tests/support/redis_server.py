"""A real redis-server (Debian's package) on a free loopback port, for the shared-ledger tests.

Missing redis-server skips those tests, except on CI (``CI=true``), where ``.ci/run`` installs it and its absence is
a failure.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from tests.support.llama_server import free_port
from tests.support.poll import until_sync


@dataclass
class RunningRedis:
    url: str
    port: int
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=5)


def redis_binary() -> str:
    found = shutil.which("redis-server")
    if found is None:
        message = "redis-server is not installed (Debian: apt-get install redis-server; .ci/run installs it)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{message}; CI=true requires it")
        pytest.skip(message)
    return found


@contextmanager
def running_redis(port: int | None = None, extra_args: tuple[str, ...] = ()) -> Iterator[RunningRedis]:
    """``extra_args``: more of redis-server's options (``--requirepass``, ``--unixsocket``)."""
    binary = redis_binary()
    port = port or free_port()
    with tempfile.TemporaryDirectory(prefix="kvgate-redis-") as work:
        process = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", work, "--protected-mode", "yes", *extra_args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

        def listening() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"redis-server did not start on port {port}: it exited")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    return True
            except OSError:
                return False

        try:
            until_sync(listening, timeout_s=10)
        except AssertionError:
            raise RuntimeError(f"redis-server did not start on port {port}") from None
        running = RunningRedis(f"redis://127.0.0.1:{port}/0", port, process)
        try:
            yield running
        finally:
            if process.poll() is None:
                running.stop()
