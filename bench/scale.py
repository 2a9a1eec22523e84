"""At scale: 8 simulated GPU hosts, 3 kvgate replicas, a team's day of traffic; one shared ledger against three.

    python -m bench.scale [--quick] [--json] [--seed N]

Loopback only: the replicas and the clients in this process (one event loop), the 8 simulated hosts in a second
process, and one redis-server (Debian's package) on a free port.

Hosts. 8 simulated llama-servers (``kvsim``, ``mode="llama-server"``, the default unified KV pool of 4 slots: the
dangerous case, where one sequence that finds no free cell fails *every* active request with "Context size has been
exceeded."): 4 with ``-c 16384`` and 4 with ``-c 8192``. Every kvgate replica has all 8 as backends of the one model
and routes each request by free KV (gateway/routing/).

The day. 24 simulated hours of four tenants, compressed into ``day_s`` real seconds (180 s; --quick 5 s, a tenth of
the requests), drawn from a seed (the same requests, at the same offsets, for every configuration):

    chat    weight 2  the team's chat UI: conversations of 1-6 turns, some long (several thousand tokens), mostly
                      streamed, half without max_tokens
    code    weight 2  an IDE assistant: short prompts, max_tokens 64-256, always streamed
    agents  weight 1  tool-using agents: long prompts (2,000-6,000 tokens), max_tokens 512, not streamed
    batch   weight 1  a batch job started by hand at 14:00: a flood of ~1,000-token documents for an hour and a
                      half, max_tokens 256, not streamed

The interactive tenants follow a diurnal curve (a quiet night, a morning ramp, a lunch dip, a busy afternoon with
bursts at 10:30, 14:30 and 16:15, a quiet evening); each request goes to one of the 3 replicas at random. The hosts
run at ``time_scale`` 5 (prompts at 600 tokens/s, answers of 8-96 tokens at 20 tokens/s: a request holds its KV for
about a second of real time), far less than the day's compression (86,400 / 180 = 480x), so the day is replayed at
the load of a much larger team: enough that the busy hours and the batch job fill the 8 hosts and kvgate queues,
while the night stays idle.

Configurations, one after the other, each on fresh simulators:

    shared        3 replicas, one shared ledger in Redis (``[shared_ledger] redis_url``)
    independent   3 replicas, each with its own in-process ledger (each believes it has every pool to itself)
    single        1 replica with its in-process ledger, all the traffic (the latency baseline)

Measured per configuration: requests, answered (200), refused by kvgate (4xx/5xx with its error code), backend
out-of-memory (an answer or stream event carrying "Context size has been exceeded."); tenants' shares of the tokens
kvgate reserved for them (``X-Kvgate-Reserved-Tokens``, what the fair queue shares) in the *contended windows*
(one backend's pool for 15 simulated minutes in which at least 5 of its requests queued: each pool's queue is what
fair queueing shares), against their weighted max-min fair share
(``bench.fair_sim.max_min_fair`` of what each asked in the window, per window, summed); and the latency kvgate adds
to a request: after the day, ``probes`` short streamed requests (200; --quick 30) sent one at a time across the
replicas (idle hosts, nothing queued), the time to the response headers minus the simulator's own time to the first
token (its ``timings``: prompt processing plus one token, scaled), median and p99. Beside it, for information, the
same difference for the day's streamed requests admitted without queueing ("loaded": it also holds the hosts' own
lag, which grows with load), and the p99 lag of this process's event loop.

Targets (the exit code is 1 if the shared ledger misses one): no backend out-of-memory with the shared ledger;
every tenant gets >= 90% of its fair share in the contended windows, or, where one in-process waiting room on the same
traffic (``single``, the same run) does not reach 90% itself, >= 95% of what it gets there (the measure's floor is
below 100% for any scheduler: a light tenant's request that waits for capacity across a window's end counts as unmet
demand in that window); the shared ledger adds <= 5 ms to the median
of kvgate's added latency over three replicas with in-process ledgers (loopback Redis). The independent ledgers'
overruns are shown, not a target: they are what the shared ledger prevents.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from multiprocessing.connection import Connection
from typing import Any

import aiohttp
import orjson

from bench.hops import free_port
from bench.scale_report import Summary, misses, render, summarise, summary_json
from bench.scale_workload import (
    CONFIGS,
    CONTEXT_EXCEEDED,
    FULL,
    GEN_TOKENS_PER_S,
    HOST_CONTEXTS,
    MODEL,
    PROMPT_TOKENS_PER_S,
    QUICK,
    TENANTS,
    Answer,
    Planned,
    Run,
    Scale,
    _text,
    key_of,
    workload,
)
from gateway.app import create_app, start_server
from gateway.config.settings import load_settings
from kvsim.config import SimConfig
from kvsim.runner import start_sim


def _error_code(raw: bytes) -> str:
    with contextlib.suppress(orjson.JSONDecodeError, TypeError, AttributeError):
        error = orjson.loads(raw)["error"]
        if isinstance(error, dict):
            return str(error.get("code") or error.get("type") or "?")
        return "error"
    return "?"


def _sim_first_token_s(event: dict[str, Any], scale: Scale) -> float | None:
    timings = event.get("timings")
    if not isinstance(timings, dict):
        return None
    return (float(timings["prompt_ms"]) / 1000 + 1 / GEN_TOKENS_PER_S) / scale.time_scale


async def _read_stream(response: aiohttp.ClientResponse, answer: Answer, scale: Scale) -> None:
    async for line in response.content:
        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
            continue
        if CONTEXT_EXCEEDED.encode() in line:
            answer.out_of_memory = True
        event = orjson.loads(line[6:])
        if "error" in event:
            answer.status, answer.code = 500, _error_code(line[6:])
        elif (first := _sim_first_token_s(event, scale)) is not None:
            answer.sim_first_token_s = first


async def send(http: aiohttp.ClientSession, url: str, planned: Planned, scale: Scale) -> Answer:
    answer = Answer(planned)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key_of(planned.tenant)}"}
    started_s = time.perf_counter()
    try:
        async with http.post(f"{url}/v1/chat/completions", data=planned.body(), headers=headers) as response:
            answer.ttfb_s = time.perf_counter() - started_s
            answer.status = response.status
            answer.backend = response.headers.get("X-Kvgate-Backend", "")
            if "X-Kvgate-Queue-Wait" in response.headers:
                answer.wait_s = float(response.headers["X-Kvgate-Queue-Wait"])
                answer.reserved_tokens = int(response.headers.get("X-Kvgate-Reserved-Tokens", "0"))
            if response.status == 200 and planned.stream:
                await _read_stream(response, answer, scale)
            else:
                raw = await response.read()
                answer.out_of_memory = CONTEXT_EXCEEDED.encode() in raw
                if response.status != 200:
                    answer.code = _error_code(raw)
    except (aiohttp.ClientError, TimeoutError) as exc:
        answer.status, answer.code = -1, type(exc).__name__
    return answer


def _settings(hosts: list[str], scale: Scale, redis_url: str | None, prefix: str) -> dict[str, Any]:
    backends = [{"name": f"gpu{i}", "kind": "llama-server", "url": url} for i, url in enumerate(hosts)]
    tenants = {name: {"api_keys": [key_of(name)], "weight": t.weight} for name, t in TENANTS.items()}
    overrides: dict[str, Any] = {
        "backends": backends, "tenants": tenants,
        "admission": {"queue_timeout_s": scale.queue_timeout_s, "max_queue": 4096},
    }
    if redis_url is not None:
        overrides["shared_ledger"] = {"redis_url": redis_url, "prefix": prefix, "lease_ttl_s": 5.0}  # poll_s 0.1
    return overrides


async def _serve_hosts(time_scale: float, urls: Connection) -> None:
    runners = []
    for seed, ctx in enumerate(HOST_CONTEXTS):
        runner, url = await start_sim(SimConfig(
            mode="llama-server", ctx_size=ctx, time_scale=time_scale, seed=seed,
            prompt_tokens_per_s=PROMPT_TOKENS_PER_S, gen_tokens_per_s=GEN_TOKENS_PER_S,
            min_response_tokens=8, max_response_tokens=96))
        runners.append(runner)
        urls.send(url)
    await asyncio.get_running_loop().run_in_executor(None, urls.recv)  # until told to stop
    for runner in runners:
        await runner.cleanup()


def _hosts_process(time_scale: float, urls: Connection) -> None:
    asyncio.run(_serve_hosts(time_scale, urls))


@contextlib.contextmanager
def running_hosts(scale: Scale) -> Iterator[list[str]]:
    """The 8 simulated hosts in a process of their own (the other core: hosts are other machines); their URLs."""
    here, there = multiprocessing.get_context("spawn").Pipe()
    process = multiprocessing.get_context("spawn").Process(target=_hosts_process, args=(scale.time_scale, there))
    process.start()
    try:
        yield [here.recv() for _ in HOST_CONTEXTS]
    finally:
        here.send("stop")
        process.join(timeout=10)
        if process.is_alive():
            process.kill()


@contextlib.asynccontextmanager
async def _replicas(count: int, overrides: dict[str, Any]) -> AsyncIterator[list[tuple[str, Any]]]:
    """``count`` kvgate replicas on 127.0.0.1:0, each its own app (own ledger, own waiting room); (url, app)."""
    started = []
    try:
        for _ in range(count):
            app = create_app(load_settings(None, **overrides), refresh_models=False)
            runner, port = await start_server(app, "127.0.0.1", 0)
            started.append((runner, f"http://127.0.0.1:{port}", app))
        yield [(url, app) for _, url, app in started]
    finally:
        for runner, _, _ in started:
            await runner.cleanup()


async def _warm(http: aiohttp.ClientSession, urls: list[str], hosts: int) -> None:
    """Every replica probes every host's pool and builds its tokenizer before the day starts."""
    body = orjson.dumps({"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hello"}]})
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key_of('code')}"}
    for url in urls:
        for _ in range(hosts):
            async with http.post(f"{url}/v1/chat/completions", data=body, headers=headers) as response:
                await response.read()
                assert response.status == 200, (response.status, await response.text())


async def run_config(config: str, plan: list[Planned], scale: Scale, redis_url: str | None) -> Run:
    with running_hosts(scale) as hosts:
        return await _run_on(config, hosts, plan, scale, redis_url)


async def _run_on(config: str, hosts: list[str], plan: list[Planned], scale: Scale, redis_url: str | None) -> Run:
    shared = redis_url if config == "shared" else None
    replicas = 1 if config == "single" else 3
    run = Run(config, scale)
    timeout = aiohttp.ClientTimeout(total=scale.queue_timeout_s + 120)
    async with _replicas(replicas, _settings(hosts, scale, shared, f"scale{time.monotonic_ns()}")) as gateways, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as http:
        urls = [url for url, _ in gateways]
        await _warm(http, urls, len(hosts))
        t0 = time.perf_counter()
        lag = asyncio.create_task(_watch_lag(run.lag_ms))
        tasks = []
        for planned in plan:
            await asyncio.sleep(max(0.0, planned.at_s - (time.perf_counter() - t0)))
            url = urls[planned.replica % len(urls)]
            tasks.append(asyncio.create_task(send(http, url, planned, scale)))
        run.answers = list(await asyncio.gather(*tasks))
        run.wall_s = time.perf_counter() - t0
        lag.cancel()
        probe = Planned(0.0, "code", 0, (("user", _text(random.Random(0), 200)),), 16, True)
        for i in range(scale.probes):  # one at a time, on idle hosts: what admission itself adds
            run.probes.append(await send(http, urls[i % len(urls)], probe, scale))
        run.lost_races = sum(_shared_count(app, "lost_races_total") for _, app in gateways)
        run.turns_kept = sum(_shared_count(app, "turns_kept_total") for _, app in gateways)
        run.elastic_steps = sum(_elastic_count(app, "steps_total") for _, app in gateways)
        run.elastic_ends = sum(_elastic_count(app, "cuts_total") for _, app in gateways)
    return run


async def _watch_lag(lag_ms: list[float], every_s: float = 0.02) -> None:
    """How late the event loop (the replicas' and the clients') wakes up: a busy loop delays every request alike."""
    while True:
        asked_s = time.perf_counter()
        await asyncio.sleep(every_s)
        lag_ms.append((time.perf_counter() - asked_s - every_s) * 1000)


def _elastic_count(app: Any, counter: str) -> int:
    """Elastic reservations' growth steps or ends on one replica, over its pools (gateway/admission/elastic.py)."""
    from gateway.app import ADMITTER
    return sum(int(getattr(counts, counter)) for counts in app[ADMITTER].elastic.counts.values())


def _shared_count(app: Any, counter: str) -> int:
    from gateway.app import SHARED
    shared = app.get(SHARED)
    return int(getattr(shared, counter)) if shared is not None else 0


@contextlib.contextmanager
def running_redis() -> Iterator[str]:
    """A redis-server of its own on a free loopback port, nothing saved; its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("bench.scale needs redis-server (Debian: apt-get install redis-server)")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="kvgate-scale-redis-") as work:
        process = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                    "--appendonly", "no", "--dir", work], stdout=subprocess.DEVNULL)
        try:
            deadline_s = time.monotonic() + 10
            while True:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
                if process.poll() is not None or time.monotonic() > deadline_s:
                    raise RuntimeError(f"redis-server did not start on port {port}")
                time.sleep(0.02)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            process.terminate()
            process.wait(timeout=10)


async def measure(scale: Scale, seed: int, configs: tuple[str, ...], redis_url: str) -> dict[str, Summary]:
    plan = workload(seed, scale)
    return {config: summarise(await run_config(config, plan, scale, redis_url)) for config in configs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a smoke run: the day in 4 s, ~360 requests")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"which of {', '.join(CONFIGS)} to run")
    args = parser.parse_args(argv)
    scale = QUICK if args.quick else FULL
    configs = tuple(c for c in args.configs.split(",") if c)
    with running_redis() as redis_url:
        summaries = asyncio.run(measure(scale, args.seed, configs, redis_url))
    missed = misses(summaries)
    if args.json:
        print(json.dumps({"scale": scale.__dict__, "seed": args.seed,
                          "configs": {c: summary_json(s) for c, s in summaries.items()},
                          "misses": missed, "target_met": not missed}, indent=2))
    else:
        print(render(workload(args.seed, scale), scale, summaries))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
