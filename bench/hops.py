"""The hops the overhead benchmark puts between its client and the fake upstream, each in its own process on loopback:
kvgate (alone, with the shared ledger, two replicas on one Redis), a bare aiohttp proxy, nginx and LiteLLM where
they are installed. ``Hops`` starts what it can, says what it could not and why, and stops everything it started.
LiteLLM is looked for as the ``litellm`` command on PATH or in ``$BENCH_LITELLM`` (it is not a dependency of kvgate:
``python -m venv /tmp/litellm && /tmp/litellm/bin/pip install 'litellm[proxy]'``, then
``BENCH_LITELLM=/tmp/litellm/bin/litellm``); it takes OpenAI's route, ``/v1/chat/completions``, and calls the fake
upstream's ``/api/chat`` (``ollama_chat/``).

nginx runs as a reverse proxy with upstream keep-alive and no buffering (what a team would put in front of a server),
one worker process: the yardstick for the cost of a hop written in C. Redis runs with no persistence.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

DIRECT = "direct"
KVGATE = "kvgate"
BARE = "bare proxy"
BASELINE = "kvgate before"
NGINX = "nginx"
SHARED = "kvgate, shared ledger"
REPLICAS = "2 kvgate replicas, shared"
LITELLM = "LiteLLM"

NGINX_CONF = """worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  upstream backend {{ server 127.0.0.1:{upstream}; keepalive 128; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
    }}
  }}
}}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_process(process: subprocess.Popen[bytes], wait_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``wait_s``; reaped either way."""
    process.terminate()
    try:
        process.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def nginx_config(directory: Path, port: int, upstream_port: int) -> str:
    """nginx.conf for a keep-alive, unbuffered reverse proxy on 127.0.0.1:``port``, every path under ``directory``."""
    return NGINX_CONF.format(dir=directory, port=port, upstream=upstream_port)


@dataclass
class Hops:
    """Start the hops; ``urls`` maps each running one to its URL (two URLs for the replicas: the client splits the
    load between them), ``missing`` names those not run and why."""

    upstream_port: int
    baseline: str | None = None
    urls: dict[str, list[str]] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    routes: dict[str, tuple[str, str]] = field(default_factory=dict)
    """The chat route and the readiness route of a hop that takes other routes than Ollama's."""
    _processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _tmp: tempfile.TemporaryDirectory[str] = field(default_factory=tempfile.TemporaryDirectory)

    @property
    def upstream(self) -> str:
        return f"http://127.0.0.1:{self.upstream_port}"

    def start(self, *, extras: bool = True) -> Hops:
        env = _clean_env()
        self._spawn([sys.executable, "-m", "bench.fake_upstream", str(self.upstream_port)], env)
        self.urls[DIRECT] = [self.upstream]
        self.urls[KVGATE] = [self._kvgate(env)]
        port = free_port()
        self._spawn([sys.executable, "-m", "bench.bare_proxy", str(port), self.upstream], env)
        self.urls[BARE] = [f"http://127.0.0.1:{port}"]
        if self.baseline is not None:  # the other checkout's package comes first on its path
            self.urls[BASELINE] = [self._kvgate({**env, "PYTHONPATH": self.baseline}, cwd=self.baseline)]
        if extras:
            self._nginx()
            self._shared(env)
            self._litellm(env)
        return self

    def stop(self) -> None:
        """Last started, first stopped, each before the next: no kvgate outlives the Redis or upstream it uses."""
        for process in reversed(self._processes):
            stop_process(process)
        self._tmp.cleanup()

    def _spawn(self, argv: list[str], env: dict[str, str], cwd: str | None = None) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL)
        self._processes.append(process)
        return process

    def _kvgate(self, env: dict[str, str], cwd: str | None = None, redis_url: str | None = None) -> str:
        """A kvgate in front of the fake upstream: the whole request path runs (the model's real tokenizer, the
        loaded model's KV pool of 64 slots of 8K tokens, so the benchmark measures kvgate's cost, not its queue)."""
        port = free_port()
        backend = {"name": "bench", "kind": "ollama", "url": self.upstream, "parallel": 64}
        gateway_env = {**env, "KVGATE_SERVER__LOG_LEVEL": "warning", "KVGATE_BACKENDS": json.dumps([backend])}
        if redis_url is not None:
            gateway_env["KVGATE_SHARED_LEDGER__REDIS_URL"] = redis_url
        self._spawn([sys.executable, "-m", "gateway", "serve", "--port", str(port)], gateway_env, cwd)
        return f"http://127.0.0.1:{port}"

    def _nginx(self) -> None:
        binary = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.path.exists(p)), None)
        if binary is None:
            self.missing[NGINX] = "not installed (apt-get install nginx-light)"
            return
        directory = Path(self._tmp.name) / "nginx"
        directory.mkdir()
        port = free_port()
        conf = directory / "nginx.conf"
        conf.write_text(nginx_config(directory, port, self.upstream_port))
        self._spawn([binary, "-c", str(conf), "-p", str(directory)], _clean_env())
        self.urls[NGINX] = [f"http://127.0.0.1:{port}"]

    def _shared(self, env: dict[str, str]) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            self.missing[SHARED] = self.missing[REPLICAS] = "redis-server not installed"
            return
        port = free_port()
        self._spawn([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"], env)
        _wait_port(port)
        self.urls[SHARED] = [self._kvgate(env, redis_url=f"redis://127.0.0.1:{port}/0")]
        self.urls[REPLICAS] = [self._kvgate(env, redis_url=f"redis://127.0.0.1:{port}/1") for _ in range(2)]


    def _litellm(self, env: dict[str, str]) -> None:
        binary = os.environ.get("BENCH_LITELLM") or shutil.which("litellm")
        if binary is None:
            self.missing[LITELLM] = "not installed (see bench/hops.py: pip install 'litellm[proxy]' in a venv)"
            return
        config = Path(self._tmp.name) / "litellm.yaml"
        config.write_text(LITELLM_CONFIG.format(upstream=self.upstream))
        port = free_port()
        self._spawn([binary, "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
                     "--num_workers", "1"], {**env, "LITELLM_LOG": "ERROR"})
        self.urls[LITELLM] = [f"http://127.0.0.1:{port}"]
        self.routes[LITELLM] = ("/v1/chat/completions", "/health/liveliness")


LITELLM_CONFIG = """model_list:
  - model_name: bench
    litellm_params:
      model: ollama_chat/bench
      api_base: {upstream}
general_settings:
  dangerously_permit_weak_or_unset_master_key: true  # loopback only, no key: as kvgate runs here
"""


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}


def _wait_port(port: int, deadline_s: float = 10.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")
