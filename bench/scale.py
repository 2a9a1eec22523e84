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
every tenant gets >= 90% of its fair share in the contended windows; the shared ledger adds <= 5 ms to the median
of kvgate's added latency over three replicas with in-process ledgers (loopback Redis). The independent ledgers'
overruns are shown, not a target: they are what the shared ledger prevents.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import aiohttp
import orjson

from bench.fair_sim import max_min_fair
from bench.overhead import _free_port
from gateway.app import create_app, start_server
from gateway.config import load_settings
from kvsim.config import SimConfig
from kvsim.runner import start_sim

MODEL = "llama3.1:8b"
CONTEXT_EXCEEDED = "Context size has been exceeded."
HOST_CONTEXTS = (16384,) * 4 + (8192,) * 4
SIM_DAY_S = 86_400.0
WINDOWS = 96  # 15 simulated minutes each
CONTENDED_QUEUED = 5  # queued requests that make a window contended
SHARE_TARGET = 0.90
ADDED_MEDIAN_TARGET_S = 0.005
PROMPT_TOKENS_PER_S = 600.0
GEN_TOKENS_PER_S = 20.0
CONFIGS = ("shared", "independent", "single")
_WORD_TEXT = (
    "the a of to and in is it that for on with as was at by be this from or have an they which one you were all "
    "we when there can more if out so what up about into than them some could time only new would other how then "
    "its like our two first also after work way even back any most where these well because over just people those "
    "data model server memory cache token request queue answer report build test deploy review merge branch commit "
    "function class module error value result config table index query schema user team project plan week"
)
WORDS = tuple(_WORD_TEXT.split())


@dataclass(frozen=True)
class Tenant:
    weight: float
    per_day: float  # requests in the day at scale 1.0 (before the curve's shape)
    stream: float  # fraction streamed


TENANTS: dict[str, Tenant] = {
    "chat": Tenant(2.0, 500, 0.85),
    "code": Tenant(2.0, 500, 1.0),
    "agents": Tenant(1.0, 150, 0.0),
    "batch": Tenant(1.0, 300, 0.0),
}
HOURLY = (0.02, 0.02, 0.02, 0.02, 0.02, 0.03, 0.05, 0.15, 0.45, 0.85, 1.0, 1.0,
          0.55, 0.8, 1.1, 1.15, 1.05, 0.75, 0.4, 0.2, 0.12, 0.08, 0.05, 0.03)
"""The interactive tenants' rate per hour of the day, relative to the busiest hours."""
BURSTS_H = ((10.5, 0.25), (14.5, 0.25), (16.25, 0.25))
"""(start hour, length in hours): the rate triples (a meeting ends, a demo, a release)."""
BATCH_H = (14.0, 15.5)


@dataclass(frozen=True)
class Scale:
    day_s: float  # real seconds the simulated day takes
    time_scale: float  # the simulators' simulated seconds per real second
    volume: float  # times TENANTS' per_day
    queue_timeout_s: float
    probes: int  # streamed requests sent one at a time after the day, for the added latency


FULL = Scale(day_s=180.0, time_scale=5.0, volume=1.0, queue_timeout_s=60.0, probes=200)
QUICK = Scale(day_s=5.0, time_scale=5.0, volume=0.1, queue_timeout_s=20.0, probes=30)


@dataclass(frozen=True)
class Planned:
    at_s: float  # real seconds from the start of the day
    tenant: str
    replica: int  # 0..2 (the single replica takes them all)
    messages: tuple[tuple[str, str], ...]
    max_tokens: int | None
    stream: bool

    def body(self) -> bytes:
        body: dict[str, Any] = {"model": MODEL, "stream": self.stream,
                                "messages": [{"role": role, "content": text} for role, text in self.messages]}
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        return orjson.dumps(body)


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _rate(tenant: str, hour: float) -> float:
    """Relative request rate of ``tenant`` at ``hour`` (0..24)."""
    if tenant == "batch":
        return 1.0 if BATCH_H[0] <= hour < BATCH_H[1] else 0.0
    rate = HOURLY[int(hour) % 24]
    if any(start <= hour < start + length for start, length in BURSTS_H):
        rate *= 3.0
    return rate


def _arrivals(rng: random.Random, tenant: str, count: float) -> list[float]:
    """Arrival hours of ``tenant``'s requests: a Poisson process shaped by ``_rate`` (thinning), ``count`` expected."""
    steps = [(_rate(tenant, h / 60), h / 60) for h in range(24 * 60)]
    mass = sum(rate for rate, _ in steps) / 60
    peak = max(rate for rate, _ in steps)
    hours: list[float] = []
    hour = 0.0
    per_hour_peak = count / mass * peak
    while True:
        hour += rng.expovariate(per_hour_peak)
        if hour >= 24:
            return hours
        if rng.random() * peak < _rate(tenant, hour):
            hours.append(hour)


def _request(rng: random.Random, tenant: str) -> tuple[tuple[tuple[str, str], ...], int | None, bool]:
    stream = rng.random() < TENANTS[tenant].stream
    if tenant == "chat":
        turns = rng.choice((1, 1, 2, 3, 4, 6))
        long = rng.random() < 0.2
        messages: list[tuple[str, str]] = [("system", "You are the team's assistant. " + _text(rng, 40))]
        for _ in range(turns - 1):
            messages += [("user", _text(rng, rng.randint(60, 900 if long else 250))),
                         ("assistant", _text(rng, rng.randint(60, 500 if long else 200)))]
        messages.append(("user", _text(rng, rng.randint(20, 400))))
        return tuple(messages), rng.choice((None, None, 512, 1024)), stream
    if tenant == "code":
        return (("system", "Complete the code."), ("user", _text(rng, rng.randint(100, 900)))), \
            rng.choice((64, 128, 256)), stream
    if tenant == "agents":
        return (("system", "You may call tools. " + _text(rng, 200)),
                ("user", _text(rng, rng.randint(1600, 5000)))), 512, stream
    return (("user", "Summarize: " + _text(rng, rng.randint(600, 900))),), 256, stream


def workload(seed: int, scale: Scale) -> list[Planned]:
    """The day's requests, in order of arrival; the same for a seed and scale."""
    rng = random.Random(seed)
    planned = []
    for tenant, profile in TENANTS.items():
        for hour in _arrivals(rng, tenant, profile.per_day * scale.volume):
            messages, max_tokens, stream = _request(rng, tenant)
            planned.append(Planned(hour / 24 * scale.day_s, tenant, rng.randrange(3), messages, max_tokens, stream))
    return sorted(planned, key=lambda p: p.at_s)


def key_of(tenant: str) -> str:
    return f"scale-{tenant}-key"


# --- one configuration ----------------------------------------------------------------------------------------------


@dataclass
class Answer:
    planned: Planned
    status: int = 0
    code: str = ""  # kvgate's error code (or the backend's error type)
    out_of_memory: bool = False
    wait_s: float | None = None  # X-Kvgate-Queue-Wait; None: not admitted
    reserved_tokens: int = 0
    ttfb_s: float = 0.0  # to the response headers
    sim_first_token_s: float | None = None  # the simulator's own prompt + first token, real seconds
    backend: str = ""

    @property
    def added_s(self) -> float | None:
        """kvgate's added latency, for a streamed request admitted without waiting."""
        if not self.planned.stream or self.status != 200 or self.wait_s != 0 or self.sim_first_token_s is None:
            return None
        return self.ttfb_s - self.sim_first_token_s


@dataclass
class Run:
    config: str
    scale: Scale
    answers: list[Answer] = field(default_factory=list)
    wall_s: float = 0.0
    lost_races: int = 0
    lag_ms: list[float] = field(default_factory=list)
    probes: list[Answer] = field(default_factory=list)


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
        overrides["shared_ledger"] = {"redis_url": redis_url, "prefix": prefix, "lease_ttl_s": 5.0, "poll_s": 0.02}
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
        run.lost_races = sum(_lost_races(app) for _, app in gateways)
    return run


async def _watch_lag(lag_ms: list[float], every_s: float = 0.02) -> None:
    """How late the event loop (the replicas' and the clients') wakes up: a busy loop delays every request alike."""
    while True:
        asked_s = time.perf_counter()
        await asyncio.sleep(every_s)
        lag_ms.append((time.perf_counter() - asked_s - every_s) * 1000)


def _lost_races(app: Any) -> int:
    from gateway.app import SHARED
    shared = app.get(SHARED)
    return shared.lost_races_total if shared is not None else 0


# --- the report -----------------------------------------------------------------------------------------------------


@dataclass
class Shares:
    windows: int
    served: dict[str, int]
    fair: dict[str, float]

    def share(self, tenant: str) -> float:
        return self.served[tenant] / max(sum(self.served.values()), 1)

    def fair_share(self, tenant: str) -> float:
        return self.fair[tenant] / max(sum(self.served.values()), 1)

    def of_fair(self, tenant: str) -> float:
        return self.served[tenant] / self.fair[tenant] if self.fair[tenant] else float("nan")


def shares(run: Run) -> Shares:
    """Reserved tokens per tenant admitted in the contended windows against the max-min fair split of them. A window
    is one backend's pool for 15 simulated minutes (fair queueing shares each pool's queue: a tenant alone on an
    idle host takes all of that host, and that is no unfairness); it is contended when at least CONTENDED_QUEUED of
    its requests queued. In each, what a tenant asked is what it had waiting there (arrived before the window ends,
    admitted after it began), and the window's capacity is what was admitted in it."""
    width_s = run.scale.day_s / WINDOWS
    admitted = [a for a in run.answers if a.wait_s is not None]
    queued: Counter[tuple[int, str]] = Counter()
    for a in admitted:
        if a.wait_s:
            queued[(_window(a.planned.at_s + a.wait_s, width_s), a.backend)] += 1
    contended = sorted(key for key, count in queued.items() if count >= CONTENDED_QUEUED)
    served = dict.fromkeys(TENANTS, 0)
    fair = dict.fromkeys(TENANTS, 0.0)
    weights = {name: t.weight for name, t in TENANTS.items()}
    for window, backend in contended:
        start_s, end_s = window * width_s, (window + 1) * width_s
        got, asked = dict.fromkeys(TENANTS, 0), dict.fromkeys(TENANTS, 0.0)
        for a in admitted:
            if a.backend != backend:
                continue
            admitted_s = a.planned.at_s + a.wait_s  # type: ignore[operator]
            if start_s <= admitted_s < end_s or (window == WINDOWS - 1 and admitted_s >= end_s):
                got[a.planned.tenant] += a.reserved_tokens
            if a.planned.at_s < end_s and admitted_s >= start_s:
                asked[a.planned.tenant] += a.reserved_tokens
        for tenant, tokens in max_min_fair(asked, weights, sum(got.values())).items():
            fair[tenant] += tokens
        for tenant, tokens in got.items():
            served[tenant] += tokens
    return Shares(len(contended), served, fair)


def _window(at_s: float, width_s: float) -> int:
    return min(WINDOWS - 1, int(at_s / width_s))


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


@dataclass
class Summary:
    config: str
    requests: int
    ok: int
    refused: dict[str, int]
    out_of_memory: int
    other_errors: int
    queued: int
    shares: Shares
    added_ms: list[float]  # idle probes
    loaded_ms: list[float]  # the day's requests admitted without waiting
    wall_s: float
    lost_races: int
    lag_ms: list[float]

    @property
    def added_median_ms(self) -> float:
        return statistics.median(self.added_ms) if self.added_ms else float("nan")

    @property
    def added_p99_ms(self) -> float:
        return _quantile(self.added_ms, 0.99)


def summarise(run: Run) -> Summary:
    refused: dict[str, int] = {}
    other = 0
    for a in run.answers:
        if a.status == 200 or a.out_of_memory:
            continue
        if a.wait_s is None and 400 <= a.status < 600:
            refused[f"{a.status} {a.code}"] = refused.get(f"{a.status} {a.code}", 0) + 1
        else:
            other += 1
    added = [a.added_s * 1000 for a in run.probes if a.added_s is not None]
    loaded = [a.added_s * 1000 for a in run.answers if a.added_s is not None]
    return Summary(run.config, len(run.answers), sum(a.status == 200 and not a.out_of_memory for a in run.answers),
                   refused, sum(a.out_of_memory for a in run.answers), other,
                   sum(1 for a in run.answers if a.wait_s), shares(run), added, loaded,
                   run.wall_s, run.lost_races, run.lag_ms)


def misses(summaries: dict[str, Summary]) -> list[str]:
    shared = summaries.get("shared")
    if shared is None:
        return ["the shared configuration did not run"]
    missed = []
    if shared.out_of_memory:
        missed.append(f"shared ledger: {shared.out_of_memory} requests met '{CONTEXT_EXCEEDED}'")
    for tenant in TENANTS:
        if shared.shares.fair[tenant] and shared.shares.of_fair(tenant) < SHARE_TARGET:
            missed.append(f"shared ledger: {tenant} got {shared.shares.of_fair(tenant):.0%} of its fair share "
                          f"(target >= {SHARE_TARGET:.0%})")
    independent = summaries.get("independent")
    if independent is not None:
        extra_ms = shared.added_median_ms - independent.added_median_ms
        if not extra_ms <= ADDED_MEDIAN_TARGET_S * 1000:
            missed.append(f"shared ledger: adds {extra_ms:.1f} ms to the median request over in-process ledgers "
                          f"(target <= {ADDED_MEDIAN_TARGET_S * 1000:g} ms)")
    return missed


def render(plan: list[Planned], scale: Scale, summaries: dict[str, Summary]) -> str:
    per_tenant = {t: sum(p.tenant == t for p in plan) for t in TENANTS}
    lines = [
        f"{len(HOST_CONTEXTS)} simulated llama-servers (unified KV, 4 slots; -c "
        + ", ".join(f"{c}" for c in HOST_CONTEXTS) + f"), time_scale {scale.time_scale:g}; a day in "
        f"{scale.day_s:g} s; {len(plan)} requests: " + ", ".join(f"{t} {n}" for t, n in per_tenant.items()),
        "",
        f"{'configuration':<14} {'requests':>8} {'ok':>6} {'refused':>8} {'OOM':>5} {'other':>6} {'queued':>7} "
        f"{'lost races':>10} {'added median':>13} {'added p99':>10} {'loaded median':>13} {'loop lag p99':>12} "
        f"{'wall':>7}",
    ]
    for s in summaries.values():
        lines.append(f"{s.config:<14} {s.requests:>8} {s.ok:>6} {sum(s.refused.values()):>8} {s.out_of_memory:>5} "
                     f"{s.other_errors:>6} {s.queued:>7} {s.lost_races:>10} {s.added_median_ms:>10.2f} ms "
                     f"{s.added_p99_ms:>7.2f} ms {_median(s.loaded_ms):>10.1f} ms {_quantile(s.lag_ms, 0.99):>9.1f} ms "
                     f"{s.wall_s:>6.1f}s")
    for s in summaries.values():
        if s.refused:
            lines.append(f"  {s.config} refused: " + ", ".join(f"{n} x {why}" for why, n in sorted(s.refused.items())))
    lines += ["", "reserved tokens admitted in the contended windows, share against the weighted max-min fair share:",
              f"{'configuration':<14} {'windows':>7} " + " ".join(f"{t + ' (w ' + format(w.weight, 'g') + ')':>22}"
                                                             for t, w in TENANTS.items())]
    for s in summaries.values():
        cells = [f"{s.shares.share(t):>6.1%} /{s.shares.fair_share(t):>6.1%} ={s.shares.of_fair(t):>5.0%}"
                 for t in TENANTS]
        lines.append(f"{s.config:<14} {s.shares.windows:>7} " + " ".join(f"{c:>22}" for c in cells))
    lines.append("(share / fair share = of fair)")
    missed = misses(summaries)
    lines.append(f"targets (shared ledger): no out-of-memory; every tenant >= {SHARE_TARGET:.0%} of its fair share; "
                 f"<= {ADDED_MEDIAN_TARGET_S * 1000:g} ms added to the median over in-process ledgers -> "
                 f"{'FAIL' if missed else 'PASS'}")
    lines.extend(f"  missed: {m}" for m in missed)
    return "\n".join(lines)


def summary_json(s: Summary) -> dict[str, Any]:
    return {"requests": s.requests, "ok": s.ok, "refused": s.refused, "out_of_memory": s.out_of_memory,
            "other_errors": s.other_errors, "queued": s.queued, "lost_races": s.lost_races,
            "wall_s": round(s.wall_s, 2), "loop_lag_p99_ms": round(_quantile(s.lag_ms, 0.99), 2),
            "added_ms": {"median": round(s.added_median_ms, 3),
                                                       "p99": round(s.added_p99_ms, 3), "samples": len(s.added_ms)},
            "loaded_added_ms": {"median": round(_median(s.loaded_ms), 3),
                                "p99": round(_quantile(s.loaded_ms, 0.99), 3), "samples": len(s.loaded_ms)},
            "contended_windows": s.shares.windows,
            "tenants": {t: {"weight": TENANTS[t].weight, "reserved_tokens": s.shares.served[t],
                            "share": round(s.shares.share(t), 4), "fair_share": round(s.shares.fair_share(t), 4)}
                        for t in TENANTS}}


@contextlib.contextmanager
def running_redis() -> Iterator[str]:
    """A redis-server of its own on a free loopback port, nothing saved; its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("bench.scale needs redis-server (Debian: apt-get install redis-server)")
    port = _free_port()
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
