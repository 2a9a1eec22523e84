"""What kvgate adds: latency and throughput direct vs through the gateway, side by side in one run.

    python -m bench.overhead [--quick] [--baseline DIR]

Starts a fast fake Ollama (one Llama 3 model, loaded), ``kvgate serve`` in front of it and, as a yardstick, a bare
aiohttp proxy with no kvgate logic (bench/bare_proxy.py), each in its own process. It then measures from this process,
alternating direct, kvgate and bare-proxy rounds so machine noise hits all alike:
- a small non-streaming chat: median and p99 latency, requests per second, at concurrency 1 and 64;
- a 500-chunk NDJSON stream: median and p99 time per stream, chunks per second, at concurrency 1 and 64.
With ``--baseline DIR`` (a checkout of an earlier commit, e.g. ``git worktree add /tmp/before <rev>``), that
checkout's kvgate runs too, in the same alternating rounds, and the table compares the two side by side.
Targets: added median latency at concurrency 1 <= 1 ms; stream chunk throughput through kvgate >= 80% of direct.
All traffic stays on 127.0.0.1; every loop is bounded in count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
import orjson

STREAM_CHUNKS = 500
ROUNDS = 9
KVGATE = "kvgate"
BARE = "bare proxy"
BASELINE = "kvgate before"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _wait_ready(url: str, deadline_s: float = 20.0) -> None:
    async with aiohttp.ClientSession() as http:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            try:
                async with http.get(url) as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


@dataclass
class Result:
    latencies_s: list[float]
    wall_s: float
    units: int

    @property
    def median_ms(self) -> float:
        return statistics.median(self.latencies_s) * 1000

    @property
    def p99_ms(self) -> float:
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000

    @property
    def rate(self) -> float:
        return self.units / self.wall_s


async def _run(concurrency: int, per_worker: int, one: Callable[[], Awaitable[int]]) -> Result:
    latencies: list[float] = []
    units = 0

    async def worker() -> None:
        nonlocal units
        for _ in range(per_worker):
            start = time.perf_counter()
            done = await one()
            latencies.append(time.perf_counter() - start)
            units += done

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Result(latencies, time.perf_counter() - start, units)


def _small(http: aiohttp.ClientSession, base: str) -> Callable[[], Awaitable[int]]:
    body = orjson.dumps({"model": "bench", "stream": False, "messages": [{"role": "user", "content": "hi"}]})

    async def one() -> int:
        async with http.post(f"{base}/api/chat", data=body, headers={"Content-Type": "application/json"}) as r:
            await r.read()
            assert r.status == 200
        return 1

    return one


def _stream(http: aiohttp.ClientSession, base: str) -> Callable[[], Awaitable[int]]:
    body = orjson.dumps({"model": "bench", "messages": [{"role": "user", "content": "hi"}],
                         "options": {"num_predict": STREAM_CHUNKS}})

    async def one() -> int:
        lines = 0
        async with http.post(f"{base}/api/chat", data=body, headers={"Content-Type": "application/json"}) as r:
            async for chunk in r.content.iter_any():  # count lines without splitting: a light client
                lines += chunk.count(b"\n")
        assert lines == STREAM_CHUNKS + 1, lines
        return STREAM_CHUNKS

    return one


@dataclass
class Row:
    """One case: the direct rounds merged, and for each proxy its rounds merged and its median per-round ratio."""

    name: str
    direct: Result
    through: dict[str, tuple[Result, float]]


async def measure(direct: str, proxies: dict[str, str], quick: bool) -> list[Row]:
    scale = 0.25 if quick else 1.0
    plans = [  # each round lasts about half a second, so one noisy moment can't decide a round
        ("small chat, c=1", 1, int(1500 * scale), _small),
        ("small chat, c=64", 64, int(40 * scale) or 1, _small),
        ("500-chunk stream, c=1", 1, int(150 * scale) or 2, _stream),
        ("500-chunk stream, c=64", 64, int(4 * scale) or 1, _stream),
    ]
    rows = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        for name, concurrency, per_worker, make in plans:
            targets = {"direct": direct, **proxies}
            for url in targets.values():  # warm every path
                await _run(concurrency, max(1, per_worker // 10), make(http, url))
            runs: dict[str, list[Result]] = {label: [] for label in targets}
            for _ in range(ROUNDS):  # alternate so drift hits every path alike
                for label, url in targets.items():
                    runs[label].append(await _run(concurrency, per_worker, make(http, url)))
            through = {}
            for label in proxies:
                ratios = [p.rate / d.rate for d, p in zip(runs["direct"], runs[label], strict=True)]
                through[label] = (_merge(runs[label]), statistics.median(ratios))
            rows.append(Row(name, _merge(runs["direct"]), through))
    return rows


def _merge(results: list[Result]) -> Result:
    """All latencies together; the rate of the median round (robust to a noisy neighbour in one round)."""
    median_round = sorted(results, key=lambda r: r.rate)[len(results) // 2]
    return Result([lat for r in results for lat in r.latencies_s], median_round.wall_s, median_round.units)


def render(rows: list[Row]) -> str:
    head = (f"{'case':<24} {'direct med ms':>13} {'kvgate med ms':>13} {'added ms':>9} {'direct p99':>10} "
            f"{'kvgate p99':>10} {'direct /s':>10} {'kvgate /s':>10} {'ratio':>6} {'bare proxy':>10}")
    lines = [head, "-" * len(head)]
    for row in rows:
        d, (g, ratio) = row.direct, row.through[KVGATE]
        bare_ratio = row.through[BARE][1] if BARE in row.through else float("nan")
        unit = "chunks" if "stream" in row.name else "req"
        lines.append(
            f"{row.name:<24} {d.median_ms:>13.3f} {g.median_ms:>13.3f} {g.median_ms - d.median_ms:>9.3f} "
            f"{d.p99_ms:>10.3f} {g.p99_ms:>10.3f} {d.rate:>10.0f} {g.rate:>10.0f} {ratio:>6.2f} {bare_ratio:>10.2f}"
            f"  ({unit}/s)"
        )
    lines.append(f"(rates: the median round of {ROUNDS}; ratio: the median of the per-round ratios to direct, for "
                 "kvgate and for a bare aiohttp proxy with no kvgate logic, bench/bare_proxy.py)")
    small1 = rows[0]
    added = small1.through[KVGATE][0].median_ms - small1.direct.median_ms
    stream_rows = [row for row in rows if "stream" in row.name]
    worst = min(stream_rows, key=lambda row: row.through[KVGATE][1])
    worst_ratio = worst.through[KVGATE][1]
    lines.append("")
    lines.append(f"target: added median latency at c=1 <= 1 ms: {added:.3f} ms -> {'PASS' if added <= 1 else 'FAIL'}")
    lines.append(f"target: stream chunk throughput >= 80% of direct: worst {worst_ratio:.0%} ({worst.name}) -> "
                 f"{'PASS' if worst_ratio >= 0.8 else 'FAIL'}")
    if BARE in worst.through:
        lines.append(f"        the bare aiohttp proxy, same case, same run: {worst.through[BARE][1]:.0%} of direct")
    if BASELINE in small1.through:
        lines.extend(["", _compare(rows)])
    return "\n".join(lines)


def _compare(rows: list[Row]) -> str:
    """This checkout's kvgate beside the baseline checkout's, measured in the same rounds."""
    head = f"{'case':<24} {'before med ms':>13} {'now med ms':>10} {'before /s':>10} {'now /s':>10} {'now/before':>10}"
    lines = [f"against the baseline checkout ({BASELINE}):", head, "-" * len(head)]
    for row in rows:
        before, now = row.through[BASELINE][0], row.through[KVGATE][0]
        lines.append(f"{row.name:<24} {before.median_ms:>13.3f} {now.median_ms:>10.3f} {before.rate:>10.0f} "
                     f"{now.rate:>10.0f} {now.rate / before.rate:>10.2f}")
    return "\n".join(lines)


async def _wait_for_tokenizer(gateway: str, deadline_s: float = 60.0) -> str:
    """Until kvgate counts with the model's own tokenizer (fetched from /api/show and built once)."""
    body = orjson.dumps({"model": "bench", "stream": False, "messages": [{"role": "user", "content": "hi"}]})
    counter = ""
    async with aiohttp.ClientSession() as http:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end and not counter.startswith("gguf"):
            async with http.post(f"{gateway}/api/chat", data=body) as response:
                await response.read()
                counter = response.headers.get("X-Kvgate-Counter", "")
            await asyncio.sleep(0.1)
    return counter


async def amain(direct: str, through: str, bare: str, quick: bool, baseline: str | None = None) -> None:
    await _wait_ready(f"{direct}/api/tags")
    await _wait_ready(f"{through}/kvgate/health")
    await _wait_ready(f"{bare}/api/tags")
    proxies = {KVGATE: through, BARE: bare}
    print(f"kvgate counts with: {await _wait_for_tokenizer(through)}")
    if baseline is not None:
        await _wait_ready(f"{baseline}/kvgate/health")
        print(f"the baseline counts with: {await _wait_for_tokenizer(baseline)}")
        proxies[BASELINE] = baseline
    print(render(await measure(direct, proxies, quick)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a quarter of the requests (a smoke run)")
    parser.add_argument("--baseline", metavar="DIR", help="also run the kvgate of this checkout, side by side")
    args = parser.parse_args()
    upstream_port, gateway_port, bare_port, baseline_port = _free_port(), _free_port(), _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    upstream_url = f"http://127.0.0.1:{upstream_port}"
    upstream = subprocess.Popen([sys.executable, "-m", "bench.fake_upstream", str(upstream_port)], env=env)
    bare = subprocess.Popen([sys.executable, "-m", "bench.bare_proxy", str(bare_port), upstream_url], env=env)
    # The whole request path runs: counting with the model's real tokenizer, planning against the loaded model's
    # KV pool (64 slots of 8K tokens, so the benchmark measures kvgate's cost, not its queue), forwarding.
    backend = {"name": "bench", "kind": "ollama", "url": upstream_url, "parallel": 64}
    gateway_env = {**env, "KVGATE_SERVER__LOG_LEVEL": "warning", "KVGATE_BACKENDS": json.dumps([backend])}
    serve = [sys.executable, "-m", "gateway", "serve", "--port"]
    gateway = subprocess.Popen([*serve, str(gateway_port)], env=gateway_env)
    processes = [gateway, bare, upstream]
    baseline_url = None
    if args.baseline:  # the other checkout's package comes first on its path
        baseline_url = f"http://127.0.0.1:{baseline_port}"
        processes.append(subprocess.Popen([*serve, str(baseline_port)], cwd=args.baseline,
                                          env={**gateway_env, "PYTHONPATH": args.baseline}))
    try:
        asyncio.run(amain(upstream_url, f"http://127.0.0.1:{gateway_port}", f"http://127.0.0.1:{bare_port}",
                          args.quick, baseline_url))
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
