"""Throughput of ``kvgate serve --workers N``: small non-streamed chats at c=64 through 1, 2 and N workers, side by
side in one run.

    python -m bench.workers [--workers 1,2] [--seconds 4] [--rounds 3]

Starts the fast fake Ollama (bench/fake_upstream.py, also measured alone: the ceiling), a redis-server, and one
``kvgate serve`` per case: a single process with its ledger in process (kvgate's default), then each worker count
with the shared ledger (a worker count above 1 requires it; each case has its own key prefix, so no two share pools).
wrk (``wrk -t2 -c64``, a Lua script posting the chat) measures each for ``--seconds``, the cases alternating round by
round so machine noise hits all alike; the table shows each case's median round and its ratio to one worker on the
same shared ledger and to the single process. The upstream, Redis, wrk and every worker share this machine's cores
(printed above the table): on a 2-core host the workers compete with their own load generator. All traffic stays on
127.0.0.1; every run is bounded in time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.hops import free_port
from bench.overhead import _wait_ready

CONCURRENCY = 64
LUA = """wrk.method = "POST"
wrk.body = '{"model":"bench","stream":false,"messages":[{"role":"user","content":"hi"}]}'
wrk.headers["Content-Type"] = "application/json"
"""


@dataclass
class Case:
    name: str
    workers: int
    shared: bool
    url: str = ""
    direct: bool = False
    """The fake upstream itself, no kvgate: the ceiling of this machine with this load generator."""
    rates: list[float] = field(default_factory=list)
    failed: int = 0
    pid: int = 0
    """The process started for it (a single kvgate, or the supervisor of its workers; the upstream's for direct)."""
    requests: int = 0
    cpu_s: float = 0.0
    """CPU time of the case's processes (the supervisor and its workers) during its rounds, and their requests."""

    @property
    def rate(self) -> float:
        return statistics.median(self.rates)

    @property
    def per_cpu_s(self) -> float:
        return self.requests / self.cpu_s if self.cpu_s else float("nan")


def _cpu_s(root: int) -> float:
    """User and system CPU seconds of ``root`` and its children so far (Linux /proc; 0 elsewhere)."""
    try:
        children = Path(f"/proc/{root}/task/{root}/children").read_text().split()
    except OSError:
        return 0.0
    total = 0.0
    for pid in [root, *map(int, children)]:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return total


def wrk(url: str, seconds: float, script: Path) -> tuple[float, int, int]:
    """Requests per second, requests, and non-2xx answers (plus socket errors) of one wrk run against ``url``."""
    out = subprocess.run(["wrk", "-t2", f"-c{CONCURRENCY}", f"-d{seconds:g}s", "-s", str(script), f"{url}/api/chat"],
                         capture_output=True, text=True, timeout=seconds + 30, check=True).stdout
    rate, count = re.search(r"Requests/sec:\s+([\d.]+)", out), re.search(r"(\d+) requests in", out)
    assert rate and count, out
    failed = sum(int(n) for n in re.findall(r"Non-2xx or 3xx responses:\s+(\d+)", out))
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    failed += sum(int(n) for n in errors.groups()) if errors else 0
    return float(rate.group(1)), int(count.group(1)), failed


async def _counting_everywhere(url: str, deadline_s: float = 60.0) -> None:
    """Until 20 answers in a row, each on a new connection (any worker), counted with the model's own tokenizer."""
    body = {"model": "bench", "stream": False, "messages": [{"role": "user", "content": "hi"}]}
    in_a_row = 0
    end = time.monotonic() + deadline_s
    while in_a_row < 20:
        if time.monotonic() > end:
            raise RuntimeError(f"{url} does not count with the model's tokenizer on every worker")
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http, \
                http.post(f"{url}/api/chat", json=body) as response:
            await response.read()
            counted = response.status == 200 and response.headers.get("X-Kvgate-Counter", "").startswith("gguf")
        in_a_row = in_a_row + 1 if counted else 0
        if not counted:
            await asyncio.sleep(0.1)


def render(cases: list[Case], seconds: float, rounds: int) -> str:
    one = next((case for case in cases if case.shared and case.workers == 1), None)
    alone = next((case for case in cases if not case.shared and not case.direct), None)
    head = (f"{'case':<34} {'workers':>7} {'req/s c=64':>11} {'vs 1 worker':>12} {'vs in-process':>14} "
            f"{'req/CPU-s':>10} {'failed':>7}")
    lines = [head, "-" * len(head)]
    for case in cases:
        to_one = f"{case.rate / one.rate:.2f}" if one and case.shared else "-"
        to_alone = f"{case.rate / alone.rate:.2f}" if alone and not case.direct else "-"
        workers = "-" if case.direct else str(case.workers)
        lines.append(f"{case.name:<34} {workers:>7} {case.rate:>11.0f} {to_one:>12} {to_alone:>14} "
                     f"{case.per_cpu_s:>10.0f} {case.failed:>7}")
    lines.append(f"(wrk -t2 -c{CONCURRENCY}, {seconds:g} s a round, the median of {rounds} rounds; 'vs 1 worker': "
                 "to one worker on the shared ledger; 'req/CPU-s': requests per CPU second of the case's own "
                 "processes (supervisor and workers; for direct, the upstream; Redis and wrk not counted); 'failed': "
                 "non-2xx answers and socket errors, warm-up included)")
    return "\n".join(lines)


def _start_kvgate(case: Case, upstream_url: str, redis_url: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    port = free_port()
    case.url = f"http://127.0.0.1:{port}"
    # 64 slots of 8K tokens: the benchmark measures kvgate's cost, not its queue
    backend = {"name": "bench", "kind": "ollama", "url": upstream_url, "parallel": 64}
    case_env = {**env, "KVGATE_SERVER__LOG_LEVEL": "warning", "KVGATE_BACKENDS": json.dumps([backend])}
    if case.shared:
        case_env |= {"KVGATE_SHARED_LEDGER__REDIS_URL": redis_url, "KVGATE_SHARED_LEDGER__PREFIX": f"bench{port}"}
    process = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--port", str(port),
                                "--workers", str(case.workers)], env=case_env)
    case.pid = process.pid
    return process


async def _ready(cases: list[Case], upstream_url: str) -> None:
    await _wait_ready(f"{upstream_url}/api/tags")
    for case in cases:
        if case.direct:
            continue
        await _wait_ready(f"{case.url}/kvgate/health")
        await _counting_everywhere(case.url)


def measure(cases: list[Case], seconds: float, rounds: int) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", prefix="kvgate-bench-") as script:
        script.write(LUA)
        script.flush()
        for case in cases:  # warm every path (its failures count: a warm-up is load too)
            case.failed += wrk(case.url, 1, Path(script.name))[2]
        for _ in range(rounds):  # alternate so drift hits every case alike
            for case in cases:
                cpu_s = _cpu_s(case.pid)
                rate, requests, failed = wrk(case.url, seconds, Path(script.name))
                case.cpu_s += _cpu_s(case.pid) - cpu_s
                case.rates.append(rate)
                case.requests += requests
                case.failed += failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workers", default="1,2", help="worker counts on the shared ledger (default 1,2)")
    parser.add_argument("--seconds", type=float, default=4.0, help="one wrk round (default 4)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per case (default 3)")
    args = parser.parse_args()
    counts = [int(count) for count in args.workers.split(",")]
    for tool in ("wrk", "redis-server"):
        if shutil.which(tool) is None:
            print(f"bench.workers needs {tool} on PATH", file=sys.stderr)
            return 2
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    upstream_port, redis_port = free_port(), free_port()
    upstream_url, redis_url = f"http://127.0.0.1:{upstream_port}", f"redis://127.0.0.1:{redis_port}/0"
    cases = [Case("direct to the fake upstream", 0, shared=False, url=upstream_url, direct=True),
             Case("1 process, in-process ledger", 1, shared=False)]
    cases += [Case(f"{count} worker{'s' if count > 1 else ''}, shared ledger (Redis)", count, shared=True)
              for count in counts]
    processes = [
        subprocess.Popen(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no"], stdout=subprocess.DEVNULL),
        subprocess.Popen([sys.executable, "-m", "bench.fake_upstream", str(upstream_port)], env=env),
    ]
    cases[0].pid = processes[1].pid
    try:
        processes += [_start_kvgate(case, upstream_url, redis_url, env) for case in cases if not case.direct]
        asyncio.run(_ready(cases, upstream_url))
        print(f"{os.cpu_count()} cores; small non-streamed chats through kvgate to bench/fake_upstream.py")
        measure(cases, args.seconds, args.rounds)
        print(render(cases, args.seconds, args.rounds))
    finally:
        for process in reversed(processes):
            process.terminate()
            process.wait(timeout=90)
    return 0


if __name__ == "__main__":
    sys.exit(main())
