"""The reproduced failure, direct vs through kvgate, side by side in one run: bursts of concurrent long chats that
overrun a unified KV pool, sent the way real clients send them.

    python -m bench.no_escape [--rounds 3]

Backend: the simulator in llama-server mode (``-c 4096``, ``-np`` omitted: 4 slots on one unified pool of 4,096
cells). Each round sends, once straight at it and once through kvgate, three bursts of 8 concurrent chats of about
450 prompt tokens:
- ``no limit``: no max_tokens (what Open WebUI, Continue and aider send), generation not stopping early;
- ``n_predict``: ``max_tokens: 16`` beside ``n_predict: 3000`` (llama-server obeys n_predict);
- ``made-up names``: each chat names another model the server does not have.
It prints, per burst, the requests that completed and that failed (a backend context error, "Context size has been
exceeded."), the generated tokens and the wall time, as medians over the rounds, and the ratio of completed work
per second through kvgate to direct. All traffic stays on 127.0.0.1; every loop is bounded in count.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from gateway.app import create_app, start_server
from gateway.config.settings import load_settings
from kvsim.config import SimConfig
from kvsim.runner import start_sim

CONCURRENCY = 8
SIM = SimConfig(mode="llama-server", ctx_size=4096, n_parallel=-1, load_s=0.0, time_scale=20.0,
                min_response_tokens=3000, max_response_tokens=3000, gen_tokens_per_s=400.0,
                prompt_tokens_per_s=40000.0)


def _chat(index: int, extra: dict[str, Any]) -> dict[str, Any]:
    words = " ".join(f"word{(index * 31 + i) % 997}" for i in range(220))
    return {"messages": [{"role": "user", "content": f"Summarise: {words}"}], "ignore_eos": True, **extra}


BURSTS: dict[str, Callable[[int], dict[str, Any]]] = {
    "no limit": lambda i: _chat(i, {}),
    "n_predict": lambda i: _chat(i, {"max_tokens": 16, "n_predict": 3000}),
    "made-up names": lambda i: _chat(i, {"model": f"invented-{i}", "max_tokens": 700}),
}


@dataclass
class Outcome:
    completed: int = 0
    failed: int = 0
    tokens: int = 0
    wall_s: float = 0.0


async def _one(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[bool, int]:
    async with http.post(f"{url}/v1/chat/completions", json=body) as response:
        payload = orjson.loads(await response.read())
    if response.status != 200:
        return False, 0
    return True, int(payload.get("usage", {}).get("completion_tokens", 0))


async def _burst(url: str, make: Callable[[int], dict[str, Any]]) -> Outcome:
    started = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        results = await asyncio.gather(*(_one(http, url, make(i)) for i in range(CONCURRENCY)))
    return Outcome(sum(ok for ok, _ in results), sum(not ok for ok, _ in results), sum(t for _, t in results),
                   time.perf_counter() - started)


async def run(rounds: int) -> list[str]:
    sim_runner, sim_url = await start_sim(SIM)
    settings = load_settings(None, backends=[{"name": "cpp", "kind": "llama-server", "url": sim_url}])
    app = create_app(settings, refresh_models=False)
    gate_runner, port = await start_server(app, "127.0.0.1", 0)
    kvgate_url = f"http://127.0.0.1:{port}"
    outcomes: dict[tuple[str, str], list[Outcome]] = {}
    try:
        for _ in range(rounds):
            for name, make in BURSTS.items():
                for where, url in (("direct", sim_url), ("kvgate", kvgate_url)):
                    outcomes.setdefault((name, where), []).append(await _burst(url, make))
    finally:
        await gate_runner.cleanup()
        await sim_runner.cleanup()
    return _table(outcomes)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def _table(outcomes: dict[tuple[str, str], list[Outcome]]) -> list[str]:
    lines = [f"{'burst (8 concurrent)':22} {'where':7} {'completed':>9} {'failed':>7} {'tokens':>7} {'wall s':>7}"
             f" {'tokens/s':>9}"]
    for name in BURSTS:
        rates = {}
        for where in ("direct", "kvgate"):
            runs = outcomes[(name, where)]
            wall = _median([o.wall_s for o in runs])
            tokens = _median([o.tokens for o in runs])
            rates[where] = tokens / wall if wall else 0.0
            lines.append(f"{name:22} {where:7} {_median([o.completed for o in runs]):>9.0f} "
                         f"{_median([o.failed for o in runs]):>7.0f} {tokens:>7.0f} {wall:>7.2f} {rates[where]:>9.0f}")
        ratio = rates["kvgate"] / rates["direct"] if rates["direct"] else float("inf")
        lines.append(f"{'':22} kvgate/direct completed tokens per second: "
                     f"{'all direct requests failed' if not rates['direct'] else f'{ratio:.2f}'}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every burst (medians are printed)")
    args = parser.parse_args()
    for line in asyncio.run(run(max(1, args.rounds))):
        print(line)


if __name__ == "__main__":
    main()
